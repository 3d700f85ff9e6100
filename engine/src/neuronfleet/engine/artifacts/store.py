"""Compiled artifacts in a store: where they live, their manifest, and compiling them.

An artifact is named by its identity hash (``neuronfleet.contract.identity``, the
same function the operator uses) and lives in ``STORE/HASH/``. Its
``manifest.json`` lists one entry per compiled graph (each prefill token bucket,
each decode batch bucket) with its shape, status and compile time, says
whether the artifact is complete and, once it is, lists every file beside it
(the compiled graphs, the weights pre-sharded for its tensor parallelism) with
its size and SHA-256, so the artifact can be checked
file by file before it is served, and a copy of it
(``neuronfleet.engine.artifacts.s3``) as it is made. It is
rewritten atomically after every bucket, so an interrupted compile resumes
where it stopped, and a complete artifact is never compiled again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.contract.sim_settings import Device

MANIFEST = "manifest.json"
LOCK = ".compile.lock"
#: Bumped when the manifest's shape changes (2: the file list; 3: the pre-sharded weights).
MANIFEST_SCHEMA = 3
#: The oldest manifest this engine reads: before it, no file list to check a copy against.
OLDEST_MANIFEST_SCHEMA = 2
#: The graphs' directory inside an artifact (the vLLM Neuron plugin's remote compile cache on Neuron).
GRAPHS_DIR = "neff"
#: The scheme of S3 stores (``neuronfleet.engine.artifacts.s3``); any other store is a local directory.
S3_SCHEME = "s3://"

BucketKind = Literal["prefill", "decode"]


class ArtifactError(Exception):
    """An artifact that is missing, incomplete, unreadable or not the one asked for, said in one line."""


class StoreError(ArtifactError):
    """The store cannot be reached, or what it holds is damaged or not the artifact asked for."""


class OutdatedManifestError(ArtifactError):
    """An artifact whose manifest is older than this engine reads: unusable until compiled again."""


class BucketEntry(BaseModel):
    """One compiled graph of the artifact."""

    model_config = ConfigDict(extra="forbid")

    kind: BucketKind
    #: Prefill: tokens of the chunk; decode: sequences in the batch.
    size: int
    #: The graph's input shape: ``batch`` sequences of ``tokens`` tokens; a decode graph compiled for a context
    #: below ``max_model_len`` (``decode_context_length_buckets``) has a ``context`` too.
    shape: dict[str, int]
    status: Literal["pending", "compiled"] = "pending"
    seconds: float | None = None
    compiled_at: str | None = None

    @property
    def context(self) -> int | None:
        """The decode context the graph reads, when below ``max_model_len``."""
        return self.shape.get("context")


class ArtifactFile(BaseModel):
    """One file of a complete artifact, relative to its directory."""

    model_config = ConfigDict(extra="forbid")

    path: str
    size: int
    sha256: str


class ShardedWeights(BaseModel):
    """The model's weights in the artifact, pre-sharded for its tensor parallelism
    (``neuronfleet.engine.artifacts.weights``)."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int
    #: Bytes of the model's weights at full scale: what a replica's start reads.
    bytes: int
    #: Each rank's shard, relative to the artifact; none where the shards' reading is modelled (a large
    #: shape on the simulated device).
    files: list[str] = []


#: Writes the weights' shards into the artifact's directory and says what it wrote.
WriteWeights = Callable[[Path], ShardedWeights]


class Manifest(BaseModel):
    """``manifest.json`` of one artifact."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = MANIFEST_SCHEMA
    hash: str
    identity: dict[str, Any]
    device: Device
    status: Literal["incomplete", "complete"] = "incomplete"
    buckets: list[BucketEntry]
    created_at: str
    completed_at: str | None = None
    #: Every file of the complete artifact but the manifest (empty while compiling).
    files: list[ArtifactFile] = []
    #: The weights pre-sharded beside the graphs (``None``: a replica loads the checkpoint and shards it).
    weights: ShardedWeights | None = None

    @property
    def complete(self) -> bool:
        """True when every bucket is compiled."""
        return self.status == "complete" and all(entry.status == "compiled" for entry in self.buckets)

    def compiled_buckets(self) -> tuple[list[int], list[int]]:
        """The compiled prefill token buckets and decode batch buckets, ascending."""
        prefill = sorted(e.size for e in self.buckets if e.kind == "prefill" and e.status == "compiled")
        decode = sorted(
            e.size for e in self.buckets if e.kind == "decode" and e.status == "compiled" and e.context is None
        )
        return prefill, decode

    def compiled_decode_contexts(self) -> list[int]:
        """The decode contexts below ``max_model_len`` graphs were compiled for, ascending."""
        return sorted({e.context for e in self.buckets if e.context is not None and e.status == "compiled"})


def now() -> str:
    """UTC time, ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def is_s3(store: str) -> bool:
    """Whether ``store`` is an ``s3://`` prefix (copied to a local one around compiling and serving)."""
    return store.startswith(S3_SCHEME)


def artifact_dir(store: str, artifact_hash: str) -> Path:
    """``STORE/HASH`` of a local (mounted) store; ``s3://`` stores are copied to a local one first."""
    if "://" in store:
        raise ArtifactError(
            f"artifact store {store!r} is not a local path: give a directory (the operator mounts a pvc:// "
            "store and passes its path) or an s3:// prefix"
        )
    return Path(store) / artifact_hash


def file_digest(path: Path) -> str:
    """Hex SHA-256 of a file's content."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def mismatch(path: Path, entry: ArtifactFile) -> str | None:
    """How the file at ``path`` differs from the one ``entry`` lists, or ``None`` when it is that file.

    A file of the listed size is hashed too: a byte changed in place keeps the size.
    """
    size = path.stat().st_size
    if size != entry.size:
        return f"{size} bytes, expected {entry.size}"
    digest = file_digest(path)
    if digest != entry.sha256:
        return f"SHA-256 {digest[:12]}…, expected {entry.sha256[:12]}…"
    return None


def check_files(directory: Path, manifest: Manifest) -> None:
    """Refuse (:class:`StoreError`) the artifact when a file its manifest lists is missing or another file."""
    # Compiling again cannot mend it: the manifest says complete, so only a fresh compile replaces the files.
    remedy = f"the artifact is damaged, delete {directory} and compile it again"
    for entry in manifest.files:
        path = directory / entry.path
        if not path.is_file():
            raise StoreError(f"{path} is missing: {remedy}")
        reason = mismatch(path, entry)
        if reason is not None:
            raise StoreError(f"{path} is not the file the manifest lists ({reason}): {remedy}")


def artifact_files(directory: Path) -> list[ArtifactFile]:
    """Every file of the artifact in ``directory`` but its manifest, lock and temporary files, sorted."""
    found = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if not path.is_file() or any(part.startswith(".") for part in relative.parts) or relative.name == MANIFEST:
            continue
        found.append(ArtifactFile(path=relative.as_posix(), size=path.stat().st_size, sha256=file_digest(path)))
    return found


def planned_buckets(
    prefill_buckets: Sequence[int], decode_buckets: Sequence[int], decode_contexts: Sequence[int] = ()
) -> list[BucketEntry]:
    """One pending entry per graph to compile: prefills, decodes (``max_model_len``), decodes per shorter context."""
    return [
        *(BucketEntry(kind="prefill", size=size, shape={"batch": 1, "tokens": size}) for size in prefill_buckets),
        *(BucketEntry(kind="decode", size=size, shape={"batch": size, "tokens": 1}) for size in decode_buckets),
        *(
            BucketEntry(kind="decode", size=size, shape={"batch": size, "tokens": 1, "context": context})
            for context in decode_contexts
            for size in decode_buckets
        ),
    ]


def check_schema(manifest: Manifest, where: str) -> Manifest:
    """``manifest``, refused (:class:`OutdatedManifestError`) when its schema is older than this engine reads."""
    if manifest.schema_version < OLDEST_MANIFEST_SCHEMA:
        raise OutdatedManifestError(
            f"artifact {manifest.hash} at {where} has manifest schema version {manifest.schema_version}; this "
            f"engine reads version {OLDEST_MANIFEST_SCHEMA} and later: delete it and compile it again"
        )
    return manifest


def read_manifest(directory: Path) -> Manifest | None:
    """The artifact's manifest, or ``None`` when there is none; one of an outdated schema is refused."""
    path = directory / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise ArtifactError(f"cannot read {path}: {error.strerror or error}") from None
    try:
        manifest = Manifest.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as error:
        raise ArtifactError(f"{path} is not a valid artifact manifest: {error}") from None
    return check_schema(manifest, str(directory))


def write_manifest(directory: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically: readers see the old one or the new one, never half."""
    handle, temporary = tempfile.mkstemp(prefix=f".{MANIFEST}.", dir=directory)
    with os.fdopen(handle, "w") as file:
        file.write(manifest.model_dump_json(indent=2))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / MANIFEST)


@contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the exclusive ``flock`` on the file at ``path`` (made if missing), waiting for it."""
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def compile_lock(directory: Path) -> AbstractContextManager[None]:
    """Hold the artifact's compile lock: two compiles of one artifact never interleave."""
    return exclusive(directory / LOCK)


def is_complete(store: str, artifact_hash: str) -> bool:
    """Whether the store already holds the complete artifact."""
    manifest = read_manifest(artifact_dir(store, artifact_hash))
    return manifest is not None and manifest.complete


def compile_artifact(
    store: str,
    identity: CompileIdentity,
    compile_bucket: Callable[[BucketEntry], float],
    on_bucket: Callable[[BucketEntry, int, int], None] | None = None,
    write_weights: WriteWeights | None = None,
) -> tuple[Manifest, int]:
    """Compile every graph of ``identity`` not yet compiled in ``store``; return the manifest and how many ran.

    ``compile_bucket`` compiles one graph and returns the seconds it took;
    ``on_bucket(entry, done, total)`` reports progress; ``write_weights`` shards
    the weights beside the graphs once they are all compiled. An artifact
    already complete compiles nothing.
    """
    artifact_hash = identity.hash()
    device = identity.device
    directory = artifact_dir(store, artifact_hash)
    directory.mkdir(parents=True, exist_ok=True)
    with compile_lock(directory):
        manifest = read_manifest(directory)
        if manifest is None:
            engine = identity.engine
            manifest = Manifest(
                hash=artifact_hash,
                identity=identity.document(),
                device=device,
                buckets=planned_buckets(
                    engine.effective_num_batched_tokens_buckets,
                    engine.effective_num_seqs_buckets,
                    engine.decode_context_length_buckets or (),
                ),
                created_at=now(),
            )
            write_manifest(directory, manifest)
        elif manifest.hash != artifact_hash or manifest.identity != identity.document():
            raise ArtifactError(f"{directory / MANIFEST} belongs to another artifact ({manifest.hash})")
        elif manifest.device != device:
            raise ArtifactError(f"{directory} holds {manifest.device} graphs, not {device} ones")
        compiled = 0
        total = len(manifest.buckets)
        for entry in manifest.buckets:
            if entry.status == "compiled":
                continue
            entry.seconds = round(compile_bucket(entry), 6)
            entry.status = "compiled"
            entry.compiled_at = now()
            compiled += 1
            write_manifest(directory, manifest)
            if on_bucket is not None:
                on_bucket(entry, sum(e.status == "compiled" for e in manifest.buckets), total)
        if manifest.status != "complete":
            if write_weights is not None:
                manifest.weights = write_weights(directory)
            manifest.status = "complete"
            manifest.completed_at = now()
            manifest.files = artifact_files(directory)
            write_manifest(directory, manifest)
        return manifest, compiled


def load_for_serving(
    directory: str | Path,
    prefill_buckets: Sequence[int],
    decode_buckets: Sequence[int],
    *,
    decode_contexts: Sequence[int] = (),
    verify_files: bool = True,
) -> Manifest:
    """The complete artifact in ``directory`` whose graphs are exactly the buckets to serve.

    With ``verify_files`` every file the manifest lists is read and its size and SHA-256 checked
    (:func:`check_files`); a caller that has just checked them (an ``s3://`` download) passes ``False``.
    """
    path = Path(directory)
    manifest = read_manifest(path)
    if manifest is None:
        raise ArtifactError(f"no compiled artifact at {path} (no {MANIFEST}): run `neuronfleet-engine compile` first")
    if not manifest.complete:
        done = sum(entry.status == "compiled" for entry in manifest.buckets)
        raise ArtifactError(
            f"the artifact at {path} is incomplete ({done} of {len(manifest.buckets)} graphs compiled): "
            "finish it with `neuronfleet-engine compile`"
        )
    compiled = manifest.compiled_buckets()
    if compiled != (list(prefill_buckets), list(decode_buckets)):
        raise ArtifactError(
            f"the artifact at {path} was compiled for prefill buckets {compiled[0]} and decode buckets "
            f"{compiled[1]}, not the configured {list(prefill_buckets)} and {list(decode_buckets)}"
        )
    contexts = manifest.compiled_decode_contexts()
    if contexts != list(decode_contexts):
        raise ArtifactError(
            f"the artifact at {path} was compiled for decode context buckets {contexts}, not the configured "
            f"{list(decode_contexts)}"
        )
    if verify_files:
        check_files(path, manifest)
    return manifest
