"""The node's cache of ``s3://`` artifacts, shared by the replicas on a node: two filling it at once copy the
artifact once, a second replica starts from local disk, the bound evicts the least recently used artifact that no
replica holds, and never one that a replica serves. Real S3 (versitygw), real processes, real file locks. (A
served replica holding its copy through vLLM's exec: ``test_s3_store.py``; a second replica starting from the
node's copy under the operator: ``tests/realnode/test_promises_under_load.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness.s3_fixtures import Bucket

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.engine.artifacts import node_cache
from neuronfleet.engine.artifacts.provision import ServingArtifact, compile_into_store, serving_artifact
from neuronfleet.engine.artifacts.store import ArtifactFile, BucketEntry, check_files, read_manifest

ENGINE = EngineConfig(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512)
SIM = SimSettings(clock="virtual")


def identity(image: str) -> CompileIdentity:
    """Artifacts of one shape and size that differ by their identity alone (the engine image)."""
    return CompileIdentity.of(ModelSource(uri="hf://neuronfleet/tiny"), ENGINE, "trn2", image, "sim")


IDENTITIES = {name: identity(f"neuronfleet/engine:{name}") for name in ("a", "b", "c")}


class Recorder:
    """A provisioning progress that counts the files copied and found in the cache, and keeps the evictions."""

    def __init__(self) -> None:
        self.copied = 0
        self.found = 0
        self.evictions: list[str] = []

    def compile_started(self, artifact_hash: str, graphs: int) -> None: ...
    def graph_compiled(self, entry: BucketEntry, done: int, total: int) -> None: ...
    def compile_stopped(self) -> None: ...
    def file_uploaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None: ...

    def file_downloaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        if skipped:
            self.found += 1
        else:
            self.copied += 1

    def evicted(self, artifact_hash: str) -> None:
        self.evictions.append(artifact_hash)


@pytest.fixture
def store(s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An S3 store holding artifacts a, b and c, the S3 environment set."""
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for one in IDENTITIES.values():
        compile_into_store(
            ENGINE, one, s3_bucket.store(), cache=tmp_path / "compiled", settings=SIM, progress=Recorder()
        )
    return s3_bucket.store()


def serve(store: str, cache: Path, name: str, limit: int | None = None) -> tuple[ServingArtifact, Recorder]:
    progress = Recorder()
    one = IDENTITIES[name]
    artifact = serving_artifact(
        ENGINE, one, store, artifact_hash=None, cache=cache, settings=SIM, compile_on_start=False,
        progress=progress, cache_limit=limit,
    )  # fmt: skip
    return artifact, progress


def release(artifact: ServingArtifact) -> None:
    """The replica that served it exits."""
    assert artifact.in_use is not None
    os.close(artifact.in_use)


#: One replica's provisioning, as a process of its own: it prints the files it copied and where its weights came from.
REPLICA = """
import sys
from pathlib import Path
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.engine.artifacts.provision import serving_artifact

class Count:
    copied = 0
    def __getattr__(self, name):
        return lambda *args: None
    def file_downloaded(self, entry, done, total, skipped):
        self.copied += not skipped

engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512)
identity = CompileIdentity.of(ModelSource(uri="hf://neuronfleet/tiny"), engine, "trn2", sys.argv[3], "sim")
progress = Count()
artifact = serving_artifact(
    engine, identity, sys.argv[1], artifact_hash=None, cache=Path(sys.argv[2]), settings=SimSettings(clock="virtual"),
    compile_on_start=False, progress=progress,
)
print(progress.copied, artifact.weights_from)
"""


def waiting_for(lock: Path) -> int:
    """How many processes wait for the flock on ``lock`` (the kernel's ``/proc/locks``: `->` marks a waiter)."""
    inode = lock.stat().st_ino
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(" -> FLOCK " in line and line.split()[6].endswith(f":{inode}") for line in lines)


def test_two_replicas_filling_at_once_copy_the_artifact_once(store: str, tmp_path: Path) -> None:
    cache = tmp_path / "node"
    argv = [sys.executable, "-c", REPLICA, store, str(cache), "neuronfleet/engine:a"]
    lock = cache / node_cache.LOCKS_DIR / f"{IDENTITIES['a'].hash()}.fill"
    # Both replicas are made to reach the fill lock before either copies: the test holds it until both wait.
    with node_cache.filling(cache, IDENTITIES["a"].hash()):
        replicas = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        deadline = time.monotonic() + 60
        while waiting_for(lock) < 2:
            assert time.monotonic() < deadline, "the two replicas never both waited to fill the cache"
            assert all(replica.poll() is None for replica in replicas), "a replica stopped before it filled"
            time.sleep(0.05)
    outcomes = []
    for replica in replicas:
        stdout, stderr = replica.communicate(timeout=120)
        assert replica.returncode == 0, stderr
        copied, weights_from = stdout.split()
        outcomes.append((int(copied), weights_from))
    manifest = read_manifest(cache / IDENTITIES["a"].hash())
    assert manifest is not None
    # One copied every file from the store; the other waited, then found them all whole on the node.
    assert sorted(outcomes) == [(0, "local"), (len(manifest.files), "s3")]
    check_files(cache / IDENTITIES["a"].hash(), manifest)
    assert not [path for path in cache.rglob(".*") if path.is_file() and path.parent.name != node_cache.LOCKS_DIR]


def test_the_bound_evicts_the_least_recently_used_artifact_no_replica_holds(store: str, tmp_path: Path) -> None:
    cache = tmp_path / "node"
    first, _ = serve(store, cache, "a")
    size = node_cache.cached_artifacts(cache)[0].bytes
    limit = 2 * size + size // 2
    release(first)
    release(serve(store, cache, "b", limit)[0])
    hashes = {name: one.hash() for name, one in IDENTITIES.items()}

    # Room for two: c evicts a, the least recently used.
    third, progress = serve(store, cache, "c", limit)
    release(third)
    assert progress.evictions == [hashes["a"]]
    assert sorted(entry.artifact_hash for entry in node_cache.cached_artifacts(cache)) == sorted(
        [hashes["b"], hashes["c"]]
    )

    # b is served again (from the node, nothing copied): c is now the least recently used, and goes for a.
    again, progress = serve(store, cache, "b", limit)
    assert (progress.copied, again.weights_from) == (0, "local")
    back, progress = serve(store, cache, "a", limit)
    assert progress.evictions == [hashes["c"]]

    # a and b both served: nothing can go, so c is copied beside them and the cache holds more than its bound.
    # What else the cache holds (a LoRA adapter's copy) is no artifact, and no eviction takes it either.
    adapter = cache / "adapters" / "support-fr" / "adapter_model.safetensors"
    adapter.parent.mkdir(parents=True)
    adapter.write_bytes(b"x" * size)
    over, progress = serve(store, cache, "c", limit)
    assert progress.evictions == []
    assert adapter.read_bytes() == b"x" * size
    assert sum(entry.bytes for entry in node_cache.cached_artifacts(cache)) > limit
    for artifact in (again, back, over):
        manifest = read_manifest(artifact.directory)
        assert manifest is not None
        check_files(artifact.directory, manifest)
        release(artifact)
