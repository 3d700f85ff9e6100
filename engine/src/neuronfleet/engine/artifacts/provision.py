"""Provisioning compiled artifacts: compiling into a store, and the artifact ``serve`` starts vLLM with.

A local store is compiled into directly; an ``s3://`` store is compiled into the
local cache, then uploaded (``neuronfleet.engine.artifacts.s3``). Serving takes
the artifact from a local store, checking every file it lists, or downloads an
``s3://`` one into the cache, checking each file as it is copied; with
``compile_on_start`` an artifact missing or incomplete is compiled first. The
cache may be the node's, shared by its replicas and bounded
(``neuronfleet.engine.artifacts.node_cache``): a replica whose artifact is there
copies nothing.

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

import os
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.contract.start_time import StoreKind
from neuronfleet.engine.artifacts import node_cache
from neuronfleet.engine.artifacts.compiler import CompileError, choose_compiler, choose_weights_writer
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

    def evicted(self, artifact_hash: str) -> None:
        """An artifact nobody used lately left the bounded cache, to make room for the one to serve."""


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
    #: Where the replica reads the artifact's pre-sharded weights from: the store (``s3``, ``pvc``) or the
    #: node's disk (``local``: the node cache held them); ``None`` when the artifact has none.
    weights_from: StoreKind | None = None
    #: The node cache's use lock on the artifact, for the replica to hold while it serves (``s3://`` only).
    in_use: int | None = None


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
    write_weights = choose_weights_writer(engine, identity, settings)
    # Read before the compile starts, so a manifest that cannot be read fails before any progress shows.
    complete = is_complete(store, artifact_hash)
    if complete:
        return compile_artifact(store, identity, compile_bucket)
    progress.compile_started(artifact_hash, engine.compiled_graph_count)
    try:
        return compile_artifact(store, identity, compile_bucket, progress.graph_compiled, write_weights)
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


@dataclass(frozen=True)
class LocalCopy:
    """An ``s3://`` artifact copied into the local cache."""

    directory: Path
    #: The files copied from the store (none: the cache held them all), relative to the artifact.
    copied: frozenset[str]
    #: The cache's use lock on it (:func:`neuronfleet.engine.artifacts.node_cache.use`), for the caller to close.
    in_use: int


def download(
    store: str, cache: Path, artifact_hash: str, progress: Progress, cache_limit: int | None = None
) -> LocalCopy:
    """The local copy of an ``s3://`` artifact, downloaded (or completed) first, every file checked as it is copied.

    Replicas sharing ``cache`` fill it one at a time and hold what they serve; artifacts nobody uses are evicted,
    least recently used first, to keep it within ``cache_limit`` bytes. Nothing local is touched before the
    store's manifest is read and checked.

    :class:`ArtifactError` when the store has no complete artifact under the hash; :class:`StoreError`
    when it cannot be reached, or holds a damaged artifact or another one.
    """
    from neuronfleet.engine.artifacts import s3

    location = s3.S3Location.of(store, artifact_hash)
    local = artifact_dir(str(cache), artifact_hash)
    copied: set[str] = set()
    in_use: list[int] = []
    filling = ExitStack()

    def on_file(entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        if not skipped:
            copied.add(entry.path)
        progress.file_downloaded(entry, done, total, skipped)

    def before_copy(manifest: Manifest) -> None:
        in_use.append(node_cache.use(cache, artifact_hash))
        # Once another replica's copy of it is done: what is left to copy is what must fit.
        filling.enter_context(node_cache.filling(cache, artifact_hash))
        incoming = sum(
            entry.size for entry in manifest.files if not node_cache.has_size(local / entry.path, entry.size)
        )
        for evicted in node_cache.make_room(cache, artifact_hash, incoming, cache_limit):
            progress.evicted(evicted)

    try:
        with filling:
            manifest = s3.download(location, local, artifact_hash, on_file, before_copy)
        _check_downloaded(manifest, location.uri())
    except BaseException:
        for descriptor in in_use:
            os.close(descriptor)
        raise
    return LocalCopy(local, frozenset(copied), in_use[0])


def _check_downloaded(manifest: Manifest | None, where: str) -> None:
    if manifest is None:
        raise ArtifactError(f"no compiled artifact at {where} (no {MANIFEST}): run `neuronfleet-engine compile` first")
    if not manifest.complete:
        raise ArtifactError(f"the artifact at {where} is incomplete: finish it with `neuronfleet-engine compile`")


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
    cache_limit: int | None = None,
) -> ServingArtifact:
    """The complete artifact ``artifact_hash`` (default: ``identity``'s) to serve with ``engine``'s buckets.

    An ``s3://`` one is downloaded into ``cache`` first (kept within ``cache_limit`` bytes), and held
    there in use. With ``compile_on_start`` one missing, incomplete or compiled for other buckets is
    compiled into the store first (it must be ``identity``'s); a damaged one or one of an outdated
    schema never is: it is deleted by hand.
    """
    wanted = _Wanted(
        engine, identity, store, artifact_hash or identity.hash(), cache, cache_limit, settings, compile_on_start,
        progress,
    )  # fmt: skip
    return _from_s3_store(wanted) if is_s3(store) else _from_local_store(wanted)


@dataclass(frozen=True)
class _Wanted:
    """What :func:`serving_artifact` was asked for."""

    engine: EngineConfig
    identity: CompileIdentity
    store: str
    artifact_hash: str
    cache: Path
    cache_limit: int | None
    settings: SimSettings
    compile_on_start: bool
    progress: Progress

    def checked(self, directory: Path, *, verify_files: bool) -> Manifest:
        """The manifest of the complete artifact in ``directory``, compiled for the engine's buckets."""
        return load_for_serving(
            directory,
            self.engine.effective_num_batched_tokens_buckets,
            self.engine.effective_num_seqs_buckets,
            decode_contexts=self.engine.decode_context_length_buckets or (),
            verify_files=verify_files,
        )

    def compile_mends(self, error: ArtifactError) -> bool:
        """Whether compiling on start may mend ``error``: not a damaged store, nor an artifact to delete first."""
        return self.compile_on_start and not isinstance(error, StoreError | OutdatedManifestError)

    def compile(self) -> CompileOutcome:
        """Compile the artifact into the store on start: only the identity computed here."""
        if self.artifact_hash != self.identity.hash():
            raise CompileError(
                f"cannot compile artifact {self.artifact_hash}: the identity computed here is {self.identity.hash()}"
            )
        try:
            return compile_into_store(
                self.engine, self.identity, self.store, cache=self.cache, settings=self.settings,
                progress=self.progress,
            )  # fmt: skip
        except CompileError:
            raise
        except ArtifactError as error:
            raise CompileError(str(error)) from error


def _from_local_store(wanted: _Wanted) -> ServingArtifact:
    # A directory store is a mounted volume (the operator's pvc://): replicas read the weights from it.
    directory = artifact_dir(wanted.store, wanted.artifact_hash)
    try:
        manifest = wanted.checked(directory, verify_files=True)
        return ServingArtifact(directory, weights_from="pvc" if manifest.weights else None)
    except ArtifactError as error:
        if not wanted.compile_mends(error):
            raise
    outcome = wanted.compile()
    manifest = wanted.checked(directory, verify_files=False)
    return ServingArtifact(directory, outcome, weights_from="pvc" if manifest.weights else None)


def _from_s3_store(wanted: _Wanted) -> ServingArtifact:
    try:
        copy = download(wanted.store, wanted.cache, wanted.artifact_hash, wanted.progress, wanted.cache_limit)
        return _serve_copy(copy, wanted)
    except ArtifactError as error:
        if not wanted.compile_mends(error):
            raise
    # Held while it compiles into the cache, too, and filled by this replica alone: no other replica's eviction
    # takes it, and no other's copy interleaves with the compile.
    directory = artifact_dir(str(wanted.cache), wanted.artifact_hash)
    copy = LocalCopy(directory, frozenset(), node_cache.use(wanted.cache, wanted.artifact_hash))
    try:
        with node_cache.filling(wanted.cache, wanted.artifact_hash):
            outcome = wanted.compile()
    except BaseException:
        os.close(copy.in_use)
        raise
    return replace(_serve_copy(copy, wanted), compiled=outcome)


def _serve_copy(copy: LocalCopy, wanted: _Wanted) -> ServingArtifact:
    """The copy to serve, held in use; its lock let go when it cannot be served."""
    try:
        # The download checked every file's size and SHA-256 as it copied it, or as it found it in the cache.
        manifest = wanted.checked(copy.directory, verify_files=False)
    except BaseException:
        os.close(copy.in_use)
        raise
    if manifest.weights is None:
        return ServingArtifact(copy.directory, in_use=copy.in_use)
    # The shards' path; a large shape's are modelled, so the artifact's is theirs.
    fetched = set(manifest.weights.files) & copy.copied if manifest.weights.files else copy.copied
    weights_from: StoreKind = "s3" if fetched else "local"
    return ServingArtifact(copy.directory, weights_from=weights_from, in_use=copy.in_use)
