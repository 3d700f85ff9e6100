"""``s3://`` artifact stores against a real local S3 server (versitygw): compile, upload, download, serve, refuse.

The server's posix backend keeps each object as a file under the bucket's directory, so the tests
look at what was uploaded, and damage it, there. Every command runs as a user's would, through the
installed entry point, with the credentials in its environment; none may ever print the secret.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from harness.damage import flip_bytes
from harness.engine_server import SCRIPTS, EngineServer, ServerPool, engine_env, write_engine_config
from harness.programs import run_program
from harness.s3_fixtures import Bucket

from neuronfleet.contract import metrics
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.engine.artifacts import node_cache
from neuronfleet.engine.artifacts.neuron_compile import compile_command
from neuronfleet.engine.artifacts.s3 import S3Location, download, upload
from neuronfleet.engine.artifacts.store import ArtifactError, ArtifactFile, StoreError, artifact_files, read_manifest

SETTINGS = {"max_num_seqs": 2, "max_num_batched_tokens": 256, "max_model_len": 512}
#: More and bigger graphs (13 files, 3 MiB), so an upload is still under way when it is killed.
LARGE = {"max_num_seqs": 32, "max_num_batched_tokens": 8192, "max_model_len": 8192}
MODEL = "neuronfleet/tiny"


def artifact_hash(settings: dict[str, int]) -> str:
    model = ModelSource(uri=f"hf://{MODEL}")
    return CompileIdentity.of(model, EngineConfig(**settings), "trn2", "neuronfleet/engine:0.1.0", "sim").hash()


def engine(
    bucket: Bucket, *args: str, cache: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``neuronfleet-engine ARGS`` with the bucket's AWS environment and its own local cache."""
    full_env = {**engine_env(), **bucket.env, "NEURONFLEET_ARTIFACT_CACHE": str(cache), "COLUMNS": "200", **(env or {})}
    result = run_program([str(SCRIPTS / "neuronfleet-engine"), *args], timeout=120, env=full_env)
    secret = bucket.env["AWS_SECRET_ACCESS_KEY"]
    assert secret not in result.stdout + result.stderr, "the secret access key was printed"
    return result


def compile_args(config: Path, store: str) -> list[str]:
    return ["compile", "-c", str(config), "--device", "sim", "--clock", "virtual", "--artifact-store", store]


def serve_refusal(bucket: Bucket, config: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    """``serve`` from the bucket's store, expected to stop before vLLM starts."""
    args = ["serve", "-c", str(config), "--device", "sim", "--artifact-store", bucket.store()]
    # Should it not stop, vLLM refuses this flag at once rather than serve until the timeout.
    args += ["--", "--not-a-vllm-flag"]
    return engine(bucket, *args, cache=cache)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def serve_and_complete(servers: ServerPool, bucket: Bucket, config: Path, cache: Path, expected: str) -> None:
    """Serve from the store on the simulated device; the artifact downloaded is the one served, its weights
    pre-sharded from S3 as the replica's start says. The copy is held in the cache through vLLM's exec: no eviction
    takes it until the replica exits."""
    server: EngineServer = servers.start(
        "--config",
        str(config),
        "--device",
        "sim",
        "--clock",
        "virtual",
        "--artifact-store",
        bucket.store(),
        env={**bucket.env, "NEURONFLEET_ARTIFACT_CACHE": str(cache)},
    )
    ready = server.request("/ready").json()
    assert ready["artifact"] == expected
    response = server.post("/v1/completions", {"model": MODEL, "prompt": "bada bade badi", "max_tokens": 4})
    assert response.status == 200, response.body
    assert response.json()["usage"]["completion_tokens"] == 4
    log = server.log.read_text()
    assert f"Loaded compiled artifact {expected} from {cache}/{expected}" in log
    assert "Loaded the weights pre-sharded for 1 ranks" in log
    assert bucket.env["AWS_SECRET_ACCESS_KEY"] not in log
    paths = {
        (dict(labels)["weights_from"], dict(labels)["weights"])
        for (name, labels), _ in server.metrics().items()
        if name == metrics.REPLICA_START_SECONDS
    }
    assert paths == {("s3", "shards")}
    # Anything's copy must go to make room for one byte: not this one, while it is served.
    assert node_cache.make_room(cache, keep="another", incoming=1, limit=1) == []
    assert server.terminate() == 0
    assert node_cache.make_room(cache, keep="another", incoming=1, limit=1) == [expected]
    assert not (cache / expected).exists()


def test_compile_uploads_every_graph_then_the_manifest(s3_bucket: Bucket, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    expected = artifact_hash(SETTINGS)
    remote = s3_bucket.path / "artifacts" / expected

    first = engine(s3_bucket, *compile_args(config, s3_bucket.store()), cache=tmp_path / "compile-cache")
    assert first.returncode == 0, first.stderr
    assert first.stdout == (
        f"compiled 4 of 4 graphs, uploaded 5 of 5 files: artifact {expected} complete at "
        f"{s3_bucket.store()}/{expected}\n"
    )
    assert "uploaded neff/prefill-128.neff (16,384 bytes) [3/5]" in first.stderr
    manifest = json.loads((remote / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert sorted(path.name for path in (remote / "neff").iterdir()) == [
        "decode-1.neff",
        "decode-2.neff",
        "prefill-128.neff",
        "prefill-256.neff",
    ]
    assert [entry["path"] for entry in manifest["files"]] == [
        "neff/decode-1.neff",
        "neff/decode-2.neff",
        "neff/prefill-128.neff",
        "neff/prefill-256.neff",
        "weights/rank-00-of-01.safetensors",
    ]

    # Idempotent: a complete artifact in the store is neither compiled nor uploaded again, from any machine.
    again = engine(s3_bucket, *compile_args(config, s3_bucket.store()), cache=tmp_path / "other-cache")
    assert again.returncode == 0, again.stderr
    where = f"{s3_bucket.store()}/{expected}"
    assert again.stdout == f"artifact {expected} already complete at {where}: nothing to compile\n"
    assert not (tmp_path / "other-cache").exists()


def test_a_compile_killed_mid_upload_resumes_then_serves(
    servers: ServerPool, s3_bucket: Bucket, tmp_path: Path
) -> None:
    config = write_engine_config(tmp_path, **LARGE)
    expected = artifact_hash(LARGE)
    remote = s3_bucket.path / "artifacts" / expected
    cache = tmp_path / "compile-cache"
    env = {**engine_env(), **s3_bucket.env, "NEURONFLEET_ARTIFACT_CACHE": str(cache)}
    process = subprocess.Popen(
        [str(SCRIPTS / "neuronfleet-engine"), *compile_args(config, s3_bucket.store())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    try:
        # Killed as soon as the first file is in the store: the other twelve graphs, the weights and the manifest
        # are not.
        for line in process.stderr:
            if line.startswith("uploaded "):
                os.kill(process.pid, signal.SIGKILL)
                break
    finally:
        process.kill()
        process.wait(30)
    assert process.returncode == -signal.SIGKILL
    assert not (remote / "manifest.json").exists(), "the upload finished before it was killed"
    uploaded = sorted(path.name for path in (remote / "neff").iterdir())
    assert 1 <= len(uploaded) < 13

    # Nothing in the store is complete yet: serving refuses it as missing.
    refused = serve_refusal(s3_bucket, config, tmp_path / "early-cache")
    assert refused.returncode == 3
    assert refused.stderr == (
        f"error: no compiled artifact at {s3_bucket.store()}/{expected} (no manifest.json): "
        "run `neuronfleet-engine compile` first\n"
    )

    resumed = engine(s3_bucket, *compile_args(config, s3_bucket.store()), cache=cache)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == (
        f"compiled 0 of 13 graphs, uploaded {14 - len(uploaded)} of 14 files: artifact {expected} complete at "
        f"{s3_bucket.store()}/{expected}\n"
    )
    assert resumed.stderr.count("already there ") == len(uploaded)
    assert (remote / "manifest.json").is_file()

    # Served on the simulated device from a fresh local cache: everything comes from the store.
    serve_and_complete(servers, s3_bucket, config, tmp_path / "serve-cache", expected)


@pytest.fixture
def uploaded(s3_bucket: Bucket, tmp_path: Path) -> tuple[Path, Path]:
    """An artifact compiled to the bucket: the engine configuration and the artifact's directory in the bucket."""
    config = write_engine_config(tmp_path, **SETTINGS)
    result = engine(s3_bucket, *compile_args(config, s3_bucket.store()), cache=tmp_path / "compile-cache")
    assert result.returncode == 0, result.stderr
    return config, s3_bucket.path / "artifacts" / artifact_hash(SETTINGS)


def test_a_missing_object_gives_one_clear_line_and_exit_2(
    s3_bucket: Bucket, uploaded: tuple[Path, Path], tmp_path: Path
) -> None:
    config, remote = uploaded
    (remote / "neff" / "prefill-128.neff").unlink()
    result = serve_refusal(s3_bucket, config, tmp_path / "serve-cache")
    assert result.returncode == 2
    where = f"{s3_bucket.store()}/{artifact_hash(SETTINGS)}"
    assert error_lines(result.stderr) == [
        f"error: {where}/neff/prefill-128.neff is missing from the store: the artifact is damaged, delete {where} "
        "and compile it again"
    ]
    assert result.stderr.endswith(f"{error_lines(result.stderr)[0]}\n")
    # Nothing half-done is left to be taken as complete.
    assert not (tmp_path / "serve-cache" / artifact_hash(SETTINGS) / "manifest.json").exists()


def test_a_truncated_object_is_refused(s3_bucket: Bucket, uploaded: tuple[Path, Path], tmp_path: Path) -> None:
    config, remote = uploaded
    graph = remote / "neff" / "decode-2.neff"
    graph.write_bytes(graph.read_bytes()[:1000])
    result = serve_refusal(s3_bucket, config, tmp_path / "serve-cache")
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert line.startswith(
        f"error: {s3_bucket.store()}/{artifact_hash(SETTINGS)}/neff/decode-2.neff is not the file the manifest "
        "lists (1000 bytes, expected 32768): the artifact is damaged, delete "
    )


def test_an_object_changed_in_place_is_refused_by_its_sha256(
    s3_bucket: Bucket, uploaded: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, remote = uploaded
    graph = remote / "neff" / "prefill-256.neff"
    listed = json.loads((remote / "manifest.json").read_text())["files"][3]
    assert (listed["path"], listed["size"]) == ("neff/prefill-256.neff", graph.stat().st_size)
    flip_bytes(graph)
    found = hashlib.sha256(graph.read_bytes()).hexdigest()
    result = serve_refusal(s3_bucket, config, tmp_path / "serve-cache")
    assert result.returncode == 2
    where = f"{s3_bucket.store()}/{artifact_hash(SETTINGS)}"
    line = (
        f"error: {where}/neff/prefill-256.neff is not the file the manifest lists (SHA-256 {found[:12]}…, "
        f"expected {listed['sha256'][:12]}…): the artifact is damaged, delete {where} and compile it again"
    )
    assert result.stderr.endswith(f"\n{line}\n")
    assert error_lines(result.stderr) == [line]
    # Neither the damaged file nor a manifest is left in the local cache to be served later.
    copy = tmp_path / "serve-cache" / artifact_hash(SETTINGS)
    assert not (copy / "manifest.json").exists()
    assert not (copy / "neff" / "prefill-256.neff").exists()

    # The remedy the line gives works: once deleted, a compile uploads the artifact again, and it downloads whole.
    shutil.rmtree(remote)
    again = engine(s3_bucket, *compile_args(config, s3_bucket.store()), cache=tmp_path / "compile-cache")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("compiled 0 of 4 graphs, uploaded 5 of 5 files: ")
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    location = S3Location.of(s3_bucket.store(), artifact_hash(SETTINGS))
    downloaded = download(location, copy, artifact_hash(SETTINGS))
    assert downloaded is not None
    assert artifact_files(copy) == downloaded.files


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("hash", "0123456789abcdef", "belongs to artifact 0123456789abcdef, not {hash}"),
        ("image", "someone/else:1", "records an identity whose hash is {other}, not {hash}: refusing it"),
    ],
)
def test_a_manifest_that_is_not_the_artifact_asked_for_is_refused(
    s3_bucket: Bucket, uploaded: tuple[Path, Path], tmp_path: Path, field: str, value: str, reason: str
) -> None:
    config, remote = uploaded
    manifest = json.loads((remote / "manifest.json").read_text())
    if field == "hash":
        manifest["hash"] = value
    else:
        manifest["identity"]["image"] = value
    (remote / "manifest.json").write_text(json.dumps(manifest))
    other = CompileIdentity.of(
        ModelSource(uri=f"hf://{MODEL}"), EngineConfig(**SETTINGS), "trn2", "someone/else:1", "sim"
    ).hash()
    expected = artifact_hash(SETTINGS)
    result = serve_refusal(s3_bucket, config, tmp_path / "serve-cache")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {s3_bucket.store()}/{expected}/manifest.json {reason.format(hash=expected, other=other)}\n"
    )
    # Refused before any file was copied.
    assert not (tmp_path / "serve-cache").exists()


def test_a_manifest_of_schema_1_in_the_store_is_refused_in_one_line(
    s3_bucket: Bucket, uploaded: tuple[Path, Path], tmp_path: Path
) -> None:
    config, remote = uploaded
    manifest = json.loads((remote / "manifest.json").read_text())
    manifest["schema_version"] = 1
    del manifest["files"]
    (remote / "manifest.json").write_text(json.dumps(manifest))
    expected = artifact_hash(SETTINGS)
    result = serve_refusal(s3_bucket, config, tmp_path / "serve-cache")
    assert result.returncode == 3
    assert result.stderr == (
        f"error: artifact {expected} at {s3_bucket.store()}/{expected} has manifest schema version 1; this engine "
        "reads version 2 and later: delete it and compile it again\n"
    )
    assert not (tmp_path / "serve-cache").exists()


def test_an_unreachable_store_fails_the_compile_in_one_line(s3_bucket: Bucket, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    closed = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    result = engine(s3_bucket, *compile_args(config, s3_bucket.store()), cache=tmp_path / "cache", env=closed)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: cannot reach the artifact store at {s3_bucket.store()}/{artifact_hash(SETTINGS)}: Could not "
        f'connect to the endpoint URL: "http://127.0.0.1:9/{s3_bucket.name}/artifacts/{artifact_hash(SETTINGS)}'
        '/manifest.json"\n'
    )


def test_wrong_credentials_are_refused_without_printing_them(s3_bucket: Bucket, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    wrong = {"AWS_SECRET_ACCESS_KEY": "not-the-secret-0123456789"}
    result = engine(s3_bucket, *compile_args(config, s3_bucket.store()), cache=tmp_path / "cache", env=wrong)
    assert result.returncode == 2
    (line,) = error_lines(result.stderr)
    assert line.startswith(f"error: cannot read {s3_bucket.store()}/{artifact_hash(SETTINGS)}/manifest.json: ")
    assert "not-the-secret" not in result.stdout + result.stderr


def test_a_download_resumes_and_fetches_only_what_is_missing_or_wrong(
    s3_bucket: Bucket, uploaded: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    expected = artifact_hash(SETTINGS)
    location = S3Location.of(s3_bucket.store(), expected)
    local = tmp_path / "copy"
    fetched: list[tuple[str, bool]] = []

    def record(entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        fetched.append((entry.path, skipped))

    first = download(location, local, expected, record)
    assert first is not None
    assert first.complete
    assert fetched == [(f.path, False) for f in first.files]
    assert read_manifest(local) == first

    # As a killed download leaves it: no manifest yet, one file short, one half-written; and one changed in place.
    (local / "manifest.json").unlink()
    (local / "neff" / "decode-1.neff").unlink()
    (local / "neff" / "prefill-256.neff").write_bytes(b"partial")
    flip_bytes(local / "neff" / "decode-2.neff")
    fetched.clear()
    assert download(location, local, expected, record) == first
    # What is there is reported first, then what was copied.
    assert fetched == [
        ("neff/prefill-128.neff", True),
        ("weights/rank-00-of-01.safetensors", True),
        ("neff/decode-1.neff", False),
        ("neff/decode-2.neff", False),
        ("neff/prefill-256.neff", False),
    ]
    assert artifact_files(local) == first.files

    # A local copy changed in place since it was compiled is never uploaded.
    graph = local / "neff" / "prefill-128.neff"
    flip_bytes(graph)
    elsewhere = S3Location.of(s3_bucket.store("elsewhere"), expected)
    with pytest.raises(ArtifactError) as refused:
        upload(local, first, elsewhere)
    found, listed = hashlib.sha256(graph.read_bytes()).hexdigest(), first.files[2].sha256
    assert str(refused.value) == (
        f"{graph} changed after it was compiled (SHA-256 {found[:12]}…, expected {listed[:12]}…): delete {local} "
        "and compile it again"
    )
    assert not (s3_bucket.path / "elsewhere" / expected / "neff" / "prefill-128.neff").exists()


def test_store_locations() -> None:
    assert S3Location.of("s3://bucket", "abc").uri("neff/x") == "s3://bucket/abc/neff/x"
    assert S3Location.of("s3://bucket/a/b/", "abc").key("manifest.json") == "a/b/abc/manifest.json"
    with pytest.raises(StoreError, match="names no bucket"):
        S3Location.of("s3:///prefix", "abc")


def test_the_neuron_compile_follows_the_sdk_cache_contract(tmp_path: Path) -> None:
    _, env = compile_command("org/model", EngineConfig(**SETTINGS), "trn2", tmp_path / "neff")
    assert env["VLLM_NEURON_CPU_COMPILE"] == "1"
    assert env["NEURON_PLATFORM_TARGET_OVERRIDE"] == "trn2"
    assert env["NEURON_LIBTORCH_REMOTE_CACHE"] == str(tmp_path / "neff")
    # Serving's "a cache miss is fatal", inherited from the image's environment, must not stop a compile.
    assert env["VLLM_NEURON_DISABLE_WARMUP_COMPILE"] == "0"
