"""LoRA adapters provisioned before a replica serves: copied from ``s3://`` into the local cache, checked.

An adapter is a folder: ``adapter_config.json`` and its weights. One in an ``s3://`` store is copied
object by object into a fresh folder, each checked against its size and, where the object records one,
its SHA-256 (the ``sha256`` metadata artifacts carry), and only then put in place of the last copy, so
a replica never loads half an adapter. Either way the folder's digest (SHA-256 over every file's path
and SHA-256) is computed, and refused when it is not the one the service declared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from neuronfleet.contract.lora import LoraAdapter
from neuronfleet.engine.artifacts import s3
from neuronfleet.engine.artifacts.store import ArtifactError, file_digest, is_s3

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: The file that makes a folder an adapter (PEFT's), read for its rank when vLLM loads it.
ADAPTER_CONFIG = "adapter_config.json"
#: Where copies of ``s3://`` adapters are kept, under the artifact cache.
ADAPTERS_DIR = "adapters"
#: What vLLM's ``PEFTHelper`` requires of ``adapter_config.json`` (checked here, so a replica says so in one line).
REQUIRED_CONFIG_FIELDS = ("r", "lora_alpha", "target_modules")


class AdapterError(ArtifactError):
    """An adapter that cannot be served: missing, unreadable, or not the one declared."""


@dataclass(frozen=True)
class ProvisionedAdapter:
    """An adapter ready to load: its local folder and digest."""

    adapter: LoraAdapter
    directory: Path
    digest: str


def adapter_digest(directory: Path) -> str:
    """The adapter's digest: SHA-256 over each file's path (relative, sorted) and SHA-256."""
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(directory).as_posix()}\0{file_digest(path)}\n".encode())
    return digest.hexdigest()


def provision_adapter(adapter: LoraAdapter, cache: Path) -> ProvisionedAdapter:
    """``adapter`` in a local folder, checked (:class:`AdapterError` when it cannot be served)."""
    where = f"LoRA adapter {adapter.name} ({adapter.source})"
    directory = _download(adapter, cache / ADAPTERS_DIR, where) if is_s3(adapter.source) else Path(adapter.source)
    check_adapter_folder(directory, where)
    digest = adapter_digest(directory)
    if adapter.sha256 is not None and digest != adapter.sha256:
        raise AdapterError(f"{where} has digest {digest[:12]}…, but {adapter.sha256[:12]}… was declared")
    return ProvisionedAdapter(adapter, directory, digest)


def check_adapter_folder(directory: Path, where: str) -> None:
    """Refuse, in one line (:class:`AdapterError` naming ``where``), a folder vLLM could not load as an adapter."""
    if not (directory / ADAPTER_CONFIG).is_file():
        raise AdapterError(f"{where} has no {ADAPTER_CONFIG}: not a LoRA adapter folder")
    missing = _missing_config_fields(directory / ADAPTER_CONFIG)
    if missing:
        raise AdapterError(f"{where}: its {ADAPTER_CONFIG} lacks {', '.join(missing)}, which vLLM needs to load it")


def _missing_config_fields(path: Path) -> list[str]:
    """The fields vLLM requires of an adapter's configuration (PEFT's rank and target modules) it lacks."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return ["valid JSON"]
    if not isinstance(config, dict):
        return ["a JSON object"]
    return [name for name in REQUIRED_CONFIG_FIELDS if name not in config]


def _download(adapter: LoraAdapter, root: Path, where: str) -> Path:
    bucket, _, prefix = adapter.source.removeprefix("s3://").partition("/")
    prefix = prefix.rstrip("/") + "/"
    client = s3.client()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{adapter.name}.", dir=root))
    try:
        objects = [
            item
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for item in page.get("Contents", [])
        ]
        if not objects:
            raise AdapterError(f"{where}: no objects under it")
        for item in objects:
            _get(client, bucket, item["Key"], staging / item["Key"].removeprefix(prefix), item["Size"], where)
        target = root / adapter.name
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        return target
    except (ClientError, BotoCoreError) as error:
        raise AdapterError(f"{where} cannot be read: {s3.describe(error)}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _get(client: S3Client, bucket: str, key: str, path: Path, size: int, where: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    recorded = client.head_object(Bucket=bucket, Key=key).get("Metadata", {}).get(s3.SHA256_METADATA)
    client.download_file(bucket, key, str(path))
    if path.stat().st_size != size:
        raise AdapterError(f"{where}: {key} arrived with {path.stat().st_size} bytes of {size}")
    if recorded and file_digest(path) != recorded:
        raise AdapterError(f"{where}: {key} is not the file its sha256 metadata records")
