"""Artifact provisioning as a library: compiling into a store, and the artifact ``serve`` starts with.

Real files in real local stores, and ``s3://`` stores on the rig's real S3 server (versitygw);
progress is recorded by a :class:`Progress` that keeps what it is told.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from harness.damage import flip_bytes
from harness.s3_fixtures import Bucket

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.engine.artifacts.compiler import CompileError
from neuronfleet.engine.artifacts.provision import (
    CompileOutcome,
    ServingArtifact,
    cache_root,
    compile_into_store,
    serving_artifact,
)
from neuronfleet.engine.artifacts.store import (
    MANIFEST,
    ArtifactError,
    ArtifactFile,
    BucketEntry,
    OutdatedManifestError,
    StoreError,
    artifact_files,
    load_for_serving,
)

#: Prefill buckets 128 and 256, decode buckets 1 and 2: four graphs.
ENGINE = EngineConfig(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512)
SIM = SimSettings(clock="virtual")
GRAPHS = ["neff/decode-1.neff", "neff/decode-2.neff", "neff/prefill-128.neff", "neff/prefill-256.neff"]
#: The graphs and the tiny model's weights, pre-sharded for one rank.
FILES = [*GRAPHS, "weights/rank-00-of-01.safetensors"]


def identity_of(model: str = "hf://neuronfleet/tiny", engine: EngineConfig = ENGINE) -> CompileIdentity:
    return CompileIdentity.of(ModelSource(uri=model), engine, "trn2", "neuronfleet/engine:test", "sim")


IDENTITY = identity_of()
HASH = IDENTITY.hash()

Event = tuple[str | int | bool, ...]


class Recorder:
    """A :class:`neuronfleet.engine.artifacts.provision.Progress` that keeps every report."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def compile_started(self, artifact_hash: str, graphs: int) -> None:
        self.events.append(("started", artifact_hash, graphs))

    def graph_compiled(self, entry: BucketEntry, done: int, total: int) -> None:
        self.events.append(("compiled", f"{entry.kind}-{entry.size}", done, total))

    def compile_stopped(self) -> None:
        self.events.append(("stopped",))

    def file_uploaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        self.events.append(("uploaded", entry.path, done, total, skipped))

    def file_downloaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        self.events.append(("downloaded", entry.path, done, total, skipped))

    def evicted(self, artifact_hash: str) -> None:
        self.events.append(("evicted", artifact_hash))


COMPILE_EVENTS: list[Event] = [
    ("started", HASH, 4),
    ("compiled", "prefill-128", 1, 4),
    ("compiled", "prefill-256", 2, 4),
    ("compiled", "decode-1", 3, 4),
    ("compiled", "decode-2", 4, 4),
    ("stopped",),
]


def compile_local(store: Path, progress: Recorder, settings: SimSettings = SIM) -> CompileOutcome:
    return compile_into_store(
        ENGINE, IDENTITY, str(store), cache=store / "unused-cache", settings=settings, progress=progress
    )


def serve_from(
    store: str, cache: Path, progress: Recorder, *, compile_on_start: bool = False, artifact_hash: str | None = None
) -> ServingArtifact:
    return serving_artifact(
        ENGINE,
        IDENTITY,
        store,
        artifact_hash=artifact_hash,
        cache=cache,
        settings=SIM,
        compile_on_start=compile_on_start,
        progress=progress,
    )


def test_a_local_compile_reports_each_graph_and_a_second_one_compiles_nothing(tmp_path: Path) -> None:
    progress = Recorder()
    outcome = compile_local(tmp_path, progress)
    assert outcome == CompileOutcome(HASH, f"{tmp_path}/{HASH}", graphs=4, compiled=4)
    assert progress.events == COMPILE_EVENTS
    manifest = load_for_serving(tmp_path / HASH, [128, 256], [1, 2])
    assert [entry.path for entry in manifest.files] == FILES
    assert not (tmp_path / "unused-cache").exists()
    before = (tmp_path / HASH / MANIFEST).read_bytes()

    again = Recorder()
    # A trailing slash does not show in where the artifact is.
    outcome = compile_into_store(
        ENGINE, IDENTITY, f"{tmp_path}/", cache=tmp_path / "unused-cache", settings=SIM, progress=again
    )
    assert outcome == CompileOutcome(HASH, f"{tmp_path}/{HASH}", graphs=4, compiled=0, already_complete=True)
    assert again.events == []
    assert (tmp_path / HASH / MANIFEST).read_bytes() == before


def test_settings_the_cost_model_refuses_are_a_compile_error_before_anything_is_written(tmp_path: Path) -> None:
    engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512, tensor_parallel_size=4)
    progress = Recorder()
    with pytest.raises(CompileError) as refused:
        compile_into_store(
            engine,
            identity_of(engine=engine),
            str(tmp_path),
            cache=tmp_path,
            settings=SimSettings(instance_type="inf2.xlarge", clock="virtual"),
            progress=progress,
        )
    assert str(refused.value) == "tensor_parallel_size 4 does not fit inf2.xlarge (2 NeuronCores)"
    assert progress.events == []
    assert list(tmp_path.iterdir()) == []


def test_a_store_that_is_not_a_directory_is_refused_to_compile_and_serve(tmp_path: Path) -> None:
    line = "artifact store 'pvc://claim' is not a local path: give a directory"
    with pytest.raises(ArtifactError, match=line):
        compile_into_store(ENGINE, IDENTITY, "pvc://claim", cache=tmp_path, settings=SIM, progress=Recorder())
    # Not a compile that failed, even on start: nothing was there to compile into (exit 3, as before).
    for compile_on_start in (False, True):
        with pytest.raises(ArtifactError, match=line) as refused:
            serve_from("pvc://claim", tmp_path, Recorder(), compile_on_start=compile_on_start)
        assert type(refused.value) is ArtifactError


def test_serving_a_missing_artifact_is_refused_unless_compiled_on_start(tmp_path: Path) -> None:
    progress = Recorder()
    with pytest.raises(ArtifactError) as refused:
        serve_from(str(tmp_path), tmp_path / "cache", progress)
    assert type(refused.value) is ArtifactError
    assert str(refused.value) == (
        f"no compiled artifact at {tmp_path}/{HASH} (no manifest.json): run `neuronfleet-engine compile` first"
    )

    served = serve_from(str(tmp_path), tmp_path / "cache", progress, compile_on_start=True)
    # A directory store is a mounted volume: the replica reads the artifact's weights from it.
    compiled = CompileOutcome(HASH, f"{tmp_path}/{HASH}", 4, 4)
    assert served == ServingArtifact(tmp_path / HASH, compiled, weights_from="pvc")
    assert progress.events == COMPILE_EVENTS
    load_for_serving(served.directory, [128, 256], [1, 2])

    # Once there, it is served as it is, compiling on start or not.
    again = Recorder()
    served = serve_from(str(tmp_path), tmp_path / "cache", again, compile_on_start=True)
    assert served == ServingArtifact(tmp_path / HASH, weights_from="pvc")
    assert again.events == []
    assert not (tmp_path / "cache").exists()


def test_compiling_on_start_mends_neither_a_damaged_artifact_nor_an_outdated_one(tmp_path: Path) -> None:
    compile_local(tmp_path, Recorder())
    flip_bytes(tmp_path / HASH / GRAPHS[0])
    progress = Recorder()
    with pytest.raises(StoreError, match=f"^{tmp_path}/{HASH}/{GRAPHS[0]} is not the file the manifest lists"):
        serve_from(str(tmp_path), tmp_path / "cache", progress, compile_on_start=True)
    assert progress.events == []

    shutil.rmtree(tmp_path / HASH)
    compile_local(tmp_path, Recorder())
    manifest_path = tmp_path / HASH / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["schema_version"] = 1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(OutdatedManifestError, match="has manifest schema version 1"):
        serve_from(str(tmp_path), tmp_path / "cache", progress, compile_on_start=True)
    assert progress.events == []
    assert json.loads(manifest_path.read_text()) == manifest


def test_compiling_on_start_compiles_only_the_identity_computed_here(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as refused:
        serve_from(str(tmp_path), tmp_path / "cache", Recorder(), compile_on_start=True, artifact_hash="0123abcd")
    assert str(refused.value) == f"cannot compile artifact 0123abcd: the identity computed here is {HASH}"
    assert list(tmp_path.iterdir()) == []


def test_a_compile_on_start_that_fails_is_a_compile_error_and_its_progress_stops(tmp_path: Path) -> None:
    # Under this artifact's name, another one's manifest, left incomplete.
    other = identity_of(model="hf://org/other")
    compile_into_store(ENGINE, other, str(tmp_path), cache=tmp_path, settings=SIM, progress=Recorder())
    (tmp_path / other.hash()).rename(tmp_path / HASH)
    manifest_path = tmp_path / HASH / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["status"] = "incomplete"
    manifest_path.write_text(json.dumps(manifest))

    progress = Recorder()
    with pytest.raises(CompileError) as failed:
        serve_from(str(tmp_path), tmp_path / "cache", progress, compile_on_start=True)
    assert str(failed.value) == f"{manifest_path} belongs to another artifact ({other.hash()})"
    assert type(failed.value.__cause__) is ArtifactError
    # The bar that started is stopped, so the error line is not drawn over.
    assert progress.events == [("started", HASH, 4), ("stopped",)]


def test_the_cache_of_s3_artifacts_is_the_users_unless_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root(None) == Path.home() / ".cache" / "neuronfleet" / "artifacts"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root(None) == tmp_path / "xdg" / "neuronfleet" / "artifacts"
    assert cache_root(tmp_path) == tmp_path


@pytest.fixture
def s3_env(s3_bucket: Bucket, monkeypatch: pytest.MonkeyPatch) -> Bucket:
    """The bucket, with its AWS environment set for the S3 client."""
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    return s3_bucket


def test_an_s3_compile_uploads_what_it_compiled_and_serving_downloads_it(s3_env: Bucket, tmp_path: Path) -> None:
    store = s3_env.store()
    progress = Recorder()
    outcome = compile_into_store(
        ENGINE, IDENTITY, store, cache=tmp_path / "compile-cache", settings=SIM, progress=progress
    )
    assert outcome == CompileOutcome(HASH, f"{store}/{HASH}", 4, 4, uploaded=(5, 5))
    assert progress.events == [
        *COMPILE_EVENTS,
        *(("uploaded", path, done, 5, False) for done, path in enumerate(FILES, start=1)),
    ]
    assert (s3_env.path / "artifacts" / HASH / MANIFEST).is_file()

    # Complete in the store: nothing compiled or sent, from any machine.
    again = Recorder()
    outcome = compile_into_store(ENGINE, IDENTITY, store, cache=tmp_path / "other-cache", settings=SIM, progress=again)
    assert outcome == CompileOutcome(HASH, f"{store}/{HASH}", 4, 0, already_complete=True)
    assert again.events == []
    assert not (tmp_path / "other-cache").exists()

    fetching = Recorder()
    served = serve_from(store, tmp_path / "serve-cache", fetching)
    assert served.in_use is not None, "the copy is held in use while it is served"
    assert replace(served, in_use=None) == ServingArtifact(tmp_path / "serve-cache" / HASH, weights_from="s3")
    assert fetching.events == [("downloaded", path, done, 5, False) for done, path in enumerate(FILES, start=1)]
    assert artifact_files(served.directory) == artifact_files(tmp_path / "compile-cache" / HASH)


def test_an_empty_s3_store_is_refused_unless_compiled_on_start(s3_env: Bucket, tmp_path: Path) -> None:
    store = s3_env.store()
    with pytest.raises(ArtifactError) as refused:
        serve_from(store, tmp_path / "cache", Recorder())
    assert type(refused.value) is ArtifactError
    assert str(refused.value) == (
        f"no compiled artifact at {store}/{HASH} (no manifest.json): run `neuronfleet-engine compile` first"
    )

    progress = Recorder()
    served = serve_from(store, tmp_path / "cache", progress, compile_on_start=True)
    # Compiled into the cache and uploaded: the copy it serves is the one it compiled, its weights from the node.
    assert served.in_use is not None
    assert replace(served, in_use=None) == ServingArtifact(
        tmp_path / "cache" / HASH, CompileOutcome(HASH, f"{store}/{HASH}", 4, 4, uploaded=(5, 5)), weights_from="local"
    )
    assert [event[0] for event in progress.events] == ["started", *["compiled"] * 4, "stopped", *["uploaded"] * 5]
    assert (s3_env.path / "artifacts" / HASH / MANIFEST).is_file()
    load_for_serving(served.directory, [128, 256], [1, 2])


def test_an_unreachable_s3_store_is_a_store_error_even_compiling_on_start(
    s3_env: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    reason = f"^cannot reach the artifact store at {s3_env.store()}/{HASH}: Could not connect to the endpoint URL"
    with pytest.raises(StoreError, match=reason):
        compile_into_store(
            ENGINE, IDENTITY, s3_env.store(), cache=tmp_path / "cache", settings=SIM, progress=Recorder()
        )
    progress = Recorder()
    with pytest.raises(StoreError, match=reason):
        serve_from(s3_env.store(), tmp_path / "cache", progress, compile_on_start=True)
    assert progress.events == []
    assert not (tmp_path / "cache").exists()
