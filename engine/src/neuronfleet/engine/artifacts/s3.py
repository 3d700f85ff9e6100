"""``s3://bucket/prefix`` artifact stores: an artifact copied to S3 after compiling, and back before serving.

An artifact in S3 has the local layout under ``PREFIX/HASH/``: its files, then
``manifest.json``. Uploads put every file first and the manifest last, so an
artifact whose manifest is in the store is complete, and a killed upload leaves
no manifest. Downloads read the manifest first, check it is the artifact asked
for (its hash, and the hash of the identity it records), copy every file it
lists, checking size and SHA-256, and write the manifest locally last, so a
local copy with a manifest is a complete one. Both skip files already there
with the right size and SHA-256 (kept in each object's ``sha256`` metadata),
which makes them idempotent and resumable after a kill.

A download reads the files side by side through boto3's transfer manager, a
large file in ranged reads, :data:`PARALLEL_READS` requests at once (the rate
``contract/start_time.py`` gives an S3 store), and checks each file as it lands.

The client is boto3's: credentials come the standard AWS ways (environment,
web identity for IRSA, EKS Pod Identity, profiles) and custom endpoints from
``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_S3``. Connect and read timeouts
and a bounded retry count make an unreachable store an error, never a hang.
No credential is ever part of a message.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError
from s3transfer.exceptions import RetriesExceededError

from neuronfleet.contract.identity import hash_document
from neuronfleet.engine.artifacts.store import (
    MANIFEST,
    S3_SCHEME,
    ArtifactError,
    ArtifactFile,
    Manifest,
    StoreError,
    check_schema,
    mismatch,
    write_manifest,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from s3transfer.futures import TransferFuture

#: Object metadata that records a file's SHA-256 (S3's ETag is not one for multipart uploads).
SHA256_METADATA = "sha256"
#: Seconds to connect and to wait for a response, and attempts per request (retries included).
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 60
MAX_ATTEMPTS = 3
#: Requests a download keeps in flight, over its files and the ranges of a large one.
PARALLEL_READS = 16
#: Bytes of one ranged read of a large file (S3's guidelines: 8 to 16 MB).
RANGE_BYTES = 8 * 2**20

#: ``(file, done, total, skipped)``: called after each file, skipped when it was already there.
OnFile = Callable[[ArtifactFile, int, int, bool], None]


@dataclass(frozen=True)
class S3Location:
    """One artifact's place in an S3 store: ``s3://BUCKET/PREFIX/HASH``."""

    bucket: str
    prefix: str

    @classmethod
    def of(cls, store: str, artifact_hash: str) -> S3Location:
        """The location of artifact ``artifact_hash`` in store ``s3://BUCKET[/PREFIX]``."""
        bucket, _, prefix = store.removeprefix(S3_SCHEME).partition("/")
        if not bucket:
            raise StoreError(f"artifact store {store!r} names no bucket (s3://BUCKET[/PREFIX])")
        return cls(bucket, "/".join(part for part in (*prefix.strip("/").split("/"), artifact_hash) if part))

    def key(self, relative: str) -> str:
        """The object key of a file of the artifact."""
        return f"{self.prefix}/{relative}"

    def uri(self, relative: str = "") -> str:
        """``s3://BUCKET/PREFIX/HASH[/relative]``, for messages."""
        return f"{S3_SCHEME}{self.bucket}/{self.key(relative) if relative else self.prefix}"


def client() -> S3Client:
    """An S3 client from the standard AWS configuration, with timeouts and bounded retries."""
    config = Config(
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
        max_pool_connections=PARALLEL_READS,
        # Checksums only where S3 requires them: S3-compatible stores differ in the ones they accept.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.session.Session().client("s3", config=config)


def describe(error: BaseException) -> str:
    """A one-line reason for a failed request: the service's error code and message, or the client's."""
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        code = details.get("Code") or "error"
        message = details.get("Message") or ""
        return f"{code}: {message}".rstrip(": ") if message else code
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _missing(error: ClientError | BotoCoreError) -> bool:
    return isinstance(error, ClientError) and error.response.get("Error", {}).get("Code") in {
        "404",
        "NoSuchKey",
        "NotFound",
    }


def _read_failure(error: ClientError | BotoCoreError, location: S3Location, relative: str) -> StoreError:
    """The one line for an object that could not be read (a missing one is for the caller to judge)."""
    if isinstance(error, ClientError):
        return StoreError(f"cannot read {location.uri(relative)}: {describe(error)}")
    return StoreError(f"cannot reach the artifact store at {location.uri()}: {describe(error)}")


def remote_size_and_digest(s3: S3Client, location: S3Location, relative: str) -> tuple[int, str] | None:
    """The size and recorded SHA-256 of one object, or ``None`` when it is not there."""
    try:
        head = s3.head_object(Bucket=location.bucket, Key=location.key(relative))
    except (ClientError, BotoCoreError) as error:
        if _missing(error):
            return None
        raise _read_failure(error, location, relative) from None
    return head["ContentLength"], head.get("Metadata", {}).get(SHA256_METADATA, "")


def read_remote_manifest(s3: S3Client, location: S3Location) -> Manifest | None:
    """The artifact's manifest in the store, or ``None`` when it has none (not uploaded, or not completely).

    One of an outdated schema is refused (:class:`OutdatedManifestError`), like a local one.
    """
    try:
        body = s3.get_object(Bucket=location.bucket, Key=location.key(MANIFEST))["Body"].read()
    except (ClientError, BotoCoreError) as error:
        if _missing(error):
            return None
        raise _read_failure(error, location, MANIFEST) from None
    try:
        manifest = Manifest.model_validate(json.loads(body))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as error:
        first = str(error).splitlines()[0]
        raise StoreError(f"{location.uri(MANIFEST)} is not a valid artifact manifest: {first}") from None
    return check_schema(manifest, location.uri())


def check_identity(manifest: Manifest, artifact_hash: str, where: str) -> None:
    """Refuse a manifest of another artifact, or one whose identity does not hash to its name."""
    if manifest.hash != artifact_hash:
        raise StoreError(f"{where} belongs to artifact {manifest.hash}, not {artifact_hash}")
    recorded = hash_document(manifest.identity)
    if recorded != artifact_hash:
        raise StoreError(f"{where} records an identity whose hash is {recorded}, not {artifact_hash}: refusing it")


def upload(local: Path, manifest: Manifest, location: S3Location, on_file: OnFile | None = None) -> int:
    """Copy a complete local artifact to the store, its manifest last; return how many files were sent."""
    if not manifest.complete:
        raise ArtifactError(f"the artifact at {local} is not complete: nothing is uploaded")
    s3 = client()
    sent = 0
    for done, entry in enumerate(manifest.files, start=1):
        present = remote_size_and_digest(s3, location, entry.path) == (entry.size, entry.sha256)
        if not present:
            _put(s3, local, location, entry)
            sent += 1
        if on_file is not None:
            on_file(entry, done, len(manifest.files), present)
    try:
        s3.put_object(
            Bucket=location.bucket,
            Key=location.key(MANIFEST),
            Body=manifest.model_dump_json(indent=2).encode(),
            ContentType="application/json",
        )
    except (BotoCoreError, ClientError) as error:
        raise StoreError(f"cannot write {location.uri(MANIFEST)}: {describe(error)}") from None
    return sent


def _put(s3: S3Client, local: Path, location: S3Location, entry: ArtifactFile) -> None:
    path = local / entry.path
    reason = mismatch(path, entry)
    if reason is not None:
        # Its manifest says complete: a compile would upload it again as it is, until it is deleted.
        raise ArtifactError(f"{path} changed after it was compiled ({reason}): delete {local} and compile it again")
    try:
        metadata = {"Metadata": {SHA256_METADATA: entry.sha256}}
        s3.upload_file(str(path), location.bucket, location.key(entry.path), ExtraArgs=metadata)
    except (BotoCoreError, ClientError, S3UploadFailedError) as error:
        raise StoreError(f"cannot write {location.uri(entry.path)}: {describe(error)}") from None


def download(
    location: S3Location,
    local: Path,
    artifact_hash: str,
    on_file: OnFile | None = None,
    before_copy: Callable[[Manifest], object] | None = None,
) -> Manifest | None:
    """Copy the artifact from the store into ``local``; ``None`` when the store has no manifest for it.

    The manifest is checked before any file is copied, and written locally only
    after every file it lists is there with its size and SHA-256. Files already
    there are reported first. ``before_copy(manifest)`` is called once the
    manifest is the complete artifact asked for, before anything local is read
    or written.
    """
    s3 = client()
    manifest = read_remote_manifest(s3, location)
    if manifest is None:
        return None
    check_identity(manifest, artifact_hash, location.uri(MANIFEST))
    if not manifest.complete:
        return manifest
    if before_copy is not None:
        before_copy(manifest)
    local.mkdir(parents=True, exist_ok=True)
    missing = [entry for entry in manifest.files if not _present(local / entry.path, entry)]
    total = len(manifest.files)
    for done, entry in enumerate((entry for entry in manifest.files if entry not in missing), start=1):
        if on_file is not None:
            on_file(entry, done, total, True)
    for done, entry in enumerate(_get_all(s3, location, missing, local), start=total - len(missing) + 1):
        if on_file is not None:
            on_file(entry, done, total, False)
    write_manifest(local, manifest)
    return manifest


def _present(path: Path, entry: ArtifactFile) -> bool:
    return path.is_file() and mismatch(path, entry) is None


def _get_all(s3: S3Client, location: S3Location, entries: list[ArtifactFile], local: Path) -> Iterator[ArtifactFile]:
    """Copy ``entries`` side by side, each into a temporary file checked and renamed as it lands; yield each
    once it is in place."""
    config = TransferConfig(
        max_concurrency=PARALLEL_READS,
        multipart_threshold=RANGE_BYTES,
        multipart_chunksize=RANGE_BYTES,
        # boto3's own manager, which these settings shape (with awscrt installed it may pick the CRT's instead).
        preferred_transfer_client="classic",
    )
    temporaries: dict[str, str] = {}
    try:
        with create_transfer_manager(s3, config) as manager:
            futures = []
            for entry in entries:
                path = local / entry.path
                path.parent.mkdir(parents=True, exist_ok=True)
                handle, temporaries[entry.path] = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
                os.close(handle)
                key = location.key(entry.path)
                futures.append((entry, manager.download(location.bucket, key, temporaries[entry.path])))
            for entry, future in futures:
                _land(location, entry, future, Path(temporaries[entry.path]), local / entry.path)
                yield entry
    finally:
        for temporary in temporaries.values():
            if os.path.exists(temporary):
                os.unlink(temporary)


def _land(location: S3Location, entry: ArtifactFile, future: TransferFuture, temporary: Path, path: Path) -> None:
    """Wait for one file's copy, check its size and SHA-256, and put it in place."""
    # A compile finds the manifest complete and uploads nothing: only one after a delete replaces the objects.
    remedy = f"the artifact is damaged, delete {location.uri()} and compile it again"
    try:
        future.result()
    except (ClientError, BotoCoreError) as error:
        if _missing(error):
            raise StoreError(f"{location.uri(entry.path)} is missing from the store: {remedy}") from None
        raise _read_failure(error, location, entry.path) from None
    except RetriesExceededError as error:
        # A stream that broke off on every attempt.
        raise StoreError(f"cannot read {location.uri(entry.path)}: {describe(error.last_exception)}") from None
    reason = mismatch(temporary, entry)
    if reason is not None:
        raise StoreError(f"{location.uri(entry.path)} is not the file the manifest lists ({reason}): {remedy}")
    os.replace(temporary, path)
