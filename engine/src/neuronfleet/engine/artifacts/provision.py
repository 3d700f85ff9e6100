"""Provisioning compiled artifacts: compiling into a store, and the artifact ``serve`` starts vLLM with.

A local store is compiled into directly; an ``s3://`` store is compiled into the
local cache, then uploaded (``neuronfleet.engine.artifacts.s3``). Serving takes
the artifact from a local store, checking every file it lists, or downloads an
``s3://`` one into the cache, checking each file as it is copied; with
``compile_on_start`` an artifact missing or incomplete is compiled first.

Nothing here prints or exits: progress goes to a :class:`Progress`, failures
are raised, each as one line:

- :class:`~neuronfleet.engine.artifacts.store.StoreError`: the store cannot be
  reached, or holds a damaged artifact or another one under the name;
- :class:`~neuronfleet.engine.artifacts.compiler.CompileError`: a compile
  cannot run, or, on start, did not finish (its cause is chained);
- :class:`~neuronfleet.engine.artifacts.store.ArtifactError` otherwise: the
  artifact is missing, incomplete, of an outdated manifest schema
  (:class:`~neuronfleet.engine.artifacts.store.OutdatedManifestError`), or
  compiled for other buckets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.engine.artifacts.compiler import CompileError, choose_compiler
from neuronfleet.engine.artifacts.store import (
    MANIFEST,
    ArtifactError,
    ArtifactFile,
    BucketEntry,
    Manifest,
    OutdatedManifestError,
    StoreError,
    artifact_dir,
    compile_artifact,
    is_complete,
    is_s3,
    load_for_serving,
)
from neuronfleet.engine.paths import user_cache


class Progress(Protocol):
    """What provisioning reports as it goes (``neuronfleet-engine`` shows it on stderr)."""

    def compile_started(self, artifact_hash: str, graphs: int) -> None:
        """A compile of ``graphs`` graphs begins; never called for an artifact already complete."""

    def graph_compiled(self, entry: BucketEntry, done: int, total: int) -> None:
        """One more graph is compiled: ``done`` of ``total``."""

    def compile_stopped(self) -> None:
        """The compile last started has ended, finished or failed."""

    def file_uploaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        """One file copied to an ``s3://`` store, or found there already (``skipped``)."""

    def file_downloaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        """One file copied from an ``s3://`` store, or found in the local copy already (``skipped``)."""


@dataclass(frozen=True)
class CompileOutcome:
    """What compiling into a store did."""

    artifact_hash: str
    #: The artifact's place: ``STORE/HASH`` or ``s3://BUCKET/PREFIX/HASH``.
    where: str
    #: Graphs in the artifact, and how many were compiled now.
    graphs: int
    compiled: int
    #: Files sent and files listed, for an ``s3://`` store; ``None`` for a local one.
    uploaded: tuple[int, int] | None = None
    #: The store held the complete artifact already: nothing was compiled or sent.
    already_complete: bool = False


@dataclass(frozen=True)
class ServingArtifact:
    """The complete artifact to serve."""

    #: Its local directory (an ``s3://`` artifact's copy in the cache).
    directory: Path
    #: What compiling on start did; ``None`` when the artifact was there to serve.
    compiled: CompileOutcome | None = None


def cache_root(cache_dir: Path | None) -> Path:
    """The local cache of ``s3://`` artifacts: ``cache_dir``, or ``$XDG_CACHE_HOME/neuronfleet/artifacts``
    (``~/.cache`` by default)."""
    return cache_dir if cache_dir is not None else user_cache("artifacts")


def compile_into_store(
    engine: EngineConfig,
    identity: CompileIdentity,
    store: str,
    *,
    cache: Path,
    settings: SimSettings,
    progress: Progress,
) -> CompileOutcome:
    """Compile ``identity``'s artifact into ``store`` (an ``s3://`` one through ``cache``); a complete one is kept.

    ``settings`` are the simulated device's (ignored on Neuron).
    """
    if is_s3(store):
        return _compile_to_s3(engine, identity, store, cache, settings, progress)
    manifest, compiled = _compile_local(engine, identity, store, settings, progress)
    return CompileOutcome(
        manifest.hash,
        f"{store.rstrip('/')}/{manifest.hash}",
        len(manifest.buckets),
        compiled,
        already_complete=compiled == 0,
    )


def _compile_local(
    engine: EngineConfig, identity: CompileIdentity, store: str, settings: SimSettings, progress: Progress
) -> tuple[Manifest, int]:
    artifact_hash = identity.hash()
    compile_bucket = choose_compiler(engine, identity, store, settings)
    # Read before the compile starts, so a manifest that cannot be read fails before any progress shows.
    complete = is_complete(store, artifact_hash)
    if complete:
        return compile_artifact(store, identity, compile_bucket)
    progress.compile_started(artifact_hash, engine.compiled_graph_count)
    try:
        return compile_artifact(store, identity, compile_bucket, progress.graph_compiled)
    finally:
        progress.compile_stopped()


def _compile_to_s3(
    engine: EngineConfig,
    identity: CompileIdentity,
    store: str,
    cache: Path,
    settings: SimSettings,
    progress: Progress,
) -> CompileOutcome:
    """Compile into the local cache, then upload, the manifest last."""
    # Imported only for s3:// stores: boto3 takes a moment to load.
    from neuronfleet.engine.artifacts import s3

    artifact_hash = identity.hash()
    location = s3.S3Location.of(store, artifact_hash)
    remote = s3.read_remote_manifest(s3.client(), location)
    if remote is not None:
        s3.check_identity(remote, artifact_hash, location.uri(MANIFEST))
        if remote.complete:
            return CompileOutcome(artifact_hash, location.uri(), len(remote.buckets), 0, already_complete=True)
    manifest, compiled = _compile_local(engine, identity, str(cache), settings, progress)
    sent = s3.upload(artifact_dir(str(cache), artifact_hash), manifest, location, progress.file_uploaded)
    return CompileOutcome(
        artifact_hash, location.uri(), len(manifest.buckets), compiled, uploaded=(sent, len(manifest.files))
    )


def download(store: str, cache: Path, artifact_hash: str, progress: Progress) -> Path:
    """The local copy of an ``s3://`` artifact, downloaded (or completed) first, every file checked as it is copied.

    :class:`ArtifactError` when the store has no complete artifact under the hash; :class:`StoreError`
    when it cannot be reached, or holds a damaged artifact or another one.
    """
    from neuronfleet.engine.artifacts import s3

    location = s3.S3Location.of(store, artifact_hash)
    local = artifact_dir(str(cache), artifact_hash)
    manifest = s3.download(location, local, artifact_hash, progress.file_downloaded)
    if manifest is None:
        raise ArtifactError(
            f"no compiled artifact at {location.uri()} (no {MANIFEST}): run `neuronfleet-engine compile` first"
        )
    if not manifest.complete:
        raise ArtifactError(
            f"the artifact at {location.uri()} is incomplete: finish it with `neuronfleet-engine compile`"
        )
    return local


def serving_artifact(
    engine: EngineConfig,
    identity: CompileIdentity,
    store: str,
    *,
    artifact_hash: str | None,
    cache: Path,
    settings: SimSettings,
    compile_on_start: bool,
    progress: Progress,
) -> ServingArtifact:
    """The complete artifact ``artifact_hash`` (default: ``identity``'s) to serve with ``engine``'s buckets.

    An ``s3://`` one is downloaded into ``cache`` first. With ``compile_on_start`` one missing,
    incomplete or compiled for other buckets is compiled into the store first (it must be
    ``identity``'s); a damaged one or one of an outdated schema never is: it is deleted by hand.
    """
    wanted = artifact_hash or identity.hash()
    remote = is_s3(store)
    try:
        directory = download(store, cache, wanted, progress) if remote else artifact_dir(store, wanted)
        # A download checked every file's size and SHA-256 as it copied it; a local store's are checked here.
        load_for_serving(
            directory,
            engine.effective_num_batched_tokens_buckets,
            engine.effective_num_seqs_buckets,
            decode_contexts=engine.decode_context_length_buckets or (),
            verify_files=not remote,
        )
        return ServingArtifact(directory)
    except ArtifactError as error:
        # Compiling cannot mend these: a damaged store, or an artifact to delete first.
        if not compile_on_start or isinstance(error, StoreError | OutdatedManifestError):
            raise
    if wanted != identity.hash():
        raise CompileError(f"cannot compile artifact {wanted}: the identity computed here is {identity.hash()}")
    # A store that is not a local directory is refused here, as when serving without compiling.
    directory = artifact_dir(str(cache) if remote else store, wanted)
    try:
        outcome = compile_into_store(engine, identity, store, cache=cache, settings=settings, progress=progress)
    except CompileError:
        raise
    except ArtifactError as error:
        raise CompileError(str(error)) from error
    return ServingArtifact(directory, outcome)
