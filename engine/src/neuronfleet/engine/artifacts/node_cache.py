"""The node's cache of artifacts from an ``s3://`` store: shared by the replicas on a node, bounded, least
recently used evicted.

Each artifact is copied into ``CACHE/HASH/`` (``neuronfleet.engine.artifacts.s3``: every file checked as it is
copied, the manifest written last, so a copy with a manifest is whole). Two locks per artifact, under
``CACHE/.locks/``, make it safe to share:

- the **fill** lock, exclusive: one replica copies an artifact at a time; a second one waits, then finds every
  file there and checked, and copies nothing;
- the **use** lock, shared by every replica that serves the artifact, from before it fills until it exits (the
  lock is kept through the ``exec`` of vLLM's server). Eviction takes it exclusively without waiting, so an
  artifact being filled or served is never evicted.

The use lock's file is touched each time a replica takes it: its time is the artifact's last use (the last
start of a replica on it; a replica that serves it for days leaves it marked at that start, and is never evicted
while it runs). Before a copy, the least recently used artifacts nobody uses are evicted until the new one fits
the bound (the manifest deleted first, so a half-deleted copy never reads as whole). Only directories named as an
artifact's hash are artifacts: nothing else in the cache is evicted.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from neuronfleet.contract.identity import IDENTITY_HASH_LENGTH
from neuronfleet.engine.artifacts.store import MANIFEST, exclusive

LOCKS_DIR = ".locks"
#: An artifact's directory is named by its identity hash.
ARTIFACT_NAME = re.compile(f"[0-9a-f]{{{IDENTITY_HASH_LENGTH}}}")


def _lock_file(cache: Path, artifact_hash: str, kind: str) -> Path:
    locks = cache / LOCKS_DIR
    locks.mkdir(parents=True, exist_ok=True)
    return locks / f"{artifact_hash}.{kind}"


def filling(cache: Path, artifact_hash: str) -> AbstractContextManager[None]:
    """Hold the artifact's fill lock: copies of one artifact into this cache never interleave."""
    return exclusive(_lock_file(cache, artifact_hash, "fill"))


def use(cache: Path, artifact_hash: str) -> int:
    """Take the artifact's use lock, shared, and mark it used now; return the descriptor, which the caller keeps
    open (inheritable, so that it outlives an ``exec``) for as long as it serves the artifact."""
    path = _lock_file(cache, artifact_hash, "use")
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        os.utime(path)
        os.set_inheritable(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


@dataclass(frozen=True)
class Cached:
    """One artifact's copy in the cache."""

    artifact_hash: str
    bytes: int
    #: When a replica last started on it (the use lock's modification time); 0 when none ever did.
    last_used: float


def cached_artifacts(cache: Path) -> list[Cached]:
    """Every artifact copied (or being copied) into ``cache``, least recently used first: the directories named
    as an artifact's hash, nothing else the cache holds (LoRA adapters' copies, for one)."""
    if not cache.is_dir():
        return []
    found = []
    for directory in cache.iterdir():
        if not ARTIFACT_NAME.fullmatch(directory.name) or not directory.is_dir():
            continue
        last_used = _mtime(cache / LOCKS_DIR / f"{directory.name}.use")
        found.append(Cached(directory.name, _bytes_under(directory), last_used))
    return sorted(found, key=lambda cached: (cached.last_used, cached.artifact_hash))


def _bytes_under(directory: Path) -> int:
    """The bytes of the files under ``directory``; a file renamed or deleted meanwhile (another replica's copy
    landing, another eviction) counts as nothing."""
    total = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _evict(cache: Path, artifact_hash: str) -> bool:
    """Delete one artifact's copy unless a replica uses or fills it; whether it was deleted."""
    # Opened without truncating: that would change its time, which is the artifact's last use.
    descriptor = os.open(_lock_file(cache, artifact_hash, "use"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        directory = cache / artifact_hash
        (directory / MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(directory, ignore_errors=True)
        return True
    finally:
        os.close(descriptor)


def make_room(cache: Path, keep: str, incoming: int, limit: int | None) -> list[str]:
    """Evict the least recently used artifacts but ``keep`` until ``incoming`` more bytes fit ``limit``; return
    the ones evicted. Artifacts in use stay, so the cache can hold more than ``limit`` while they are served."""
    if limit is None:
        return []
    cached = cached_artifacts(cache)
    total = sum(entry.bytes for entry in cached) + incoming
    evicted = []
    for entry in cached:
        if total <= limit:
            break
        if entry.artifact_hash != keep and _evict(cache, entry.artifact_hash):
            total -= entry.bytes
            evicted.append(entry.artifact_hash)
    return evicted


def has_size(path: Path, size: int) -> bool:
    """Whether ``path`` is a file of ``size`` bytes (a copy that may need nothing more; its digest is checked
    later)."""
    try:
        return path.stat().st_size == size
    except FileNotFoundError:
        return False
