"""`neuronfleet-engine compile`, and `serve` refusing what it cannot serve, through the installed entry point."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

from harness.damage import flip_bytes
from harness.engine_server import write_engine_config

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.engine.artifacts.store import GRAPHS_DIR

RunCli = Callable[..., subprocess.CompletedProcess[str]]
SETTINGS = {"max_num_seqs": 2, "max_num_batched_tokens": 256, "max_model_len": 512}


def expected_hash(**identity: str) -> str:
    model = ModelSource(uri=identity.get("model", "hf://neuronfleet/tiny"), revision=identity.get("revision", "main"))
    return CompileIdentity.of(model, EngineConfig(**SETTINGS), "trn2", "neuronfleet/engine:0.1.0", "sim").hash()


def compile_sim(run_cli: RunCli, config: Path, store: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "neuronfleet-engine", "compile", "-c", str(config), "--device", "sim", "--artifact-store", str(store), *extra
    )


def test_compile_twice_the_second_is_a_no_op(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    artifact = expected_hash()
    first = compile_sim(run_cli, config, tmp_path / "store")
    assert first.returncode == 0, first.stderr
    assert first.stdout == f"compiled 4 of 4 graphs: artifact {artifact} complete at {tmp_path}/store/{artifact}\n"
    # The progress bar goes to stderr.
    assert f"compiling artifact {artifact}" in first.stderr
    manifest = tmp_path / "store" / artifact / "manifest.json"
    before = manifest.read_bytes()

    second = compile_sim(run_cli, config, tmp_path / "store")
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"artifact {artifact} already complete at {tmp_path}/store/{artifact}: nothing to compile\n"
    assert second.stderr == ""
    assert manifest.read_bytes() == before
    assert [entry["size"] for entry in json.loads(before)["buckets"]] == [128, 256, 1, 2]
    assert "bucket" not in json.loads(before)


def test_trainium3_and_decode_contexts_compile_a_graph_per_batch_and_context(run_cli: RunCli, tmp_path: Path) -> None:
    settings = {**SETTINGS, "decode_context_length_buckets": [128, 256]}
    config = write_engine_config(tmp_path, **settings)
    model = ModelSource(uri="hf://neuronfleet/tiny")
    artifact = CompileIdentity.of(model, EngineConfig(**settings), "trn3", "neuronfleet/engine:0.1.0", "sim").hash()
    compiled = compile_sim(run_cli, config, tmp_path / "store", "--target", "trn3")
    assert compiled.returncode == 0, compiled.stderr
    # 2 prefill buckets, and 2 decode batch buckets for each of 3 contexts (128, 256, max_model_len 512).
    assert compiled.stdout == f"compiled 8 of 8 graphs: artifact {artifact} complete at {tmp_path}/store/{artifact}\n"
    manifest = json.loads((tmp_path / "store" / artifact / "manifest.json").read_text())
    assert manifest["identity"]["target"] == "trn3"
    assert [(e["kind"], e["size"], e["shape"].get("context")) for e in manifest["buckets"]] == [
        ("prefill", 128, None),
        ("prefill", 256, None),
        ("decode", 1, None),
        ("decode", 2, None),
        ("decode", 1, 128),
        ("decode", 2, 128),
        ("decode", 1, 256),
        ("decode", 2, 256),
    ]
    graphs = sorted(path.name for path in (tmp_path / "store" / artifact / GRAPHS_DIR).iterdir())
    assert "decode-2-context-256.neff" in graphs
    assert len(graphs) == 8


def test_the_hash_is_the_operators_identity_and_must_match(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    revision = "0e9e39f"
    result = compile_sim(run_cli, config, tmp_path, "--revision", revision, "--artifact-hash", "0123456789abcdef")
    assert result.returncode == 2
    assert result.stderr == (
        f"error: --artifact-hash 0123456789abcdef does not match the identity computed here "
        f"({expected_hash(revision=revision)})\n"
    )
    assert not any(tmp_path.glob("*/manifest.json"))


def test_serve_refuses_an_incomplete_artifact(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    assert compile_sim(run_cli, config, tmp_path).returncode == 0
    manifest_path = tmp_path / expected_hash() / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["status"] = "incomplete"
    manifest["buckets"][-1]["status"] = "pending"
    manifest_path.write_text(json.dumps(manifest))

    result = run_cli(
        "neuronfleet-engine", "serve", "-c", str(config), "--device", "sim", "--artifact-store", str(tmp_path)
    )
    assert result.returncode == 3
    assert result.stderr == (
        f"error: the artifact at {tmp_path}/{expected_hash()} is incomplete (3 of 4 graphs compiled): "
        "finish it with `neuronfleet-engine compile`\n"
    )


def test_serve_refuses_a_graph_changed_in_place_by_its_sha256(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    assert compile_sim(run_cli, config, tmp_path).returncode == 0
    directory = tmp_path / expected_hash()
    listed = json.loads((directory / "manifest.json").read_text())["files"][0]
    graph = directory / listed["path"]
    assert (listed["path"], listed["size"]) == ("neff/decode-1.neff", graph.stat().st_size)
    flip_bytes(graph)
    found = hashlib.sha256(graph.read_bytes()).hexdigest()
    line = (
        f"error: {graph} is not the file the manifest lists (SHA-256 {found[:12]}…, expected "
        f"{listed['sha256'][:12]}…): the artifact is damaged, delete {directory} and compile it again\n"
    )
    serve = ["neuronfleet-engine", "serve", "-c", str(config), "--device", "sim", "--artifact-store", str(tmp_path)]
    # Were the file accepted, vLLM would refuse this flag at once rather than serve until the timeout.
    serve += ["--", "--not-a-vllm-flag"]
    # Exit 2, a damaged store; compiling on start cannot mend it (the manifest says complete) and must not serve it.
    for extra in ((), ("--compile-on-start",)):
        result = run_cli(*serve, *extra)
        assert (result.returncode, result.stderr) == (2, line)


def test_serve_and_compile_refuse_a_manifest_of_schema_1(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    assert compile_sim(run_cli, config, tmp_path).returncode == 0
    manifest_path = tmp_path / expected_hash() / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["schema_version"] = 1
    del manifest["files"]
    manifest_path.write_text(json.dumps(manifest))
    line = (
        f"error: artifact {expected_hash()} at {tmp_path}/{expected_hash()} has manifest schema version 1; this "
        "engine reads version 2 and later: delete it and compile it again\n"
    )
    serve = ["neuronfleet-engine", "serve", "-c", str(config), "--device", "sim", "--artifact-store", str(tmp_path)]
    # Exit 3, as for a missing or incomplete artifact; compiling on start cannot mend it either.
    for extra in ((), ("--compile-on-start",)):
        result = run_cli(*serve, *extra)
        assert (result.returncode, result.stderr) == (3, line)
    compiled = compile_sim(run_cli, config, tmp_path)
    assert (compiled.returncode, compiled.stderr) == (2, line)


def test_bad_device_target_and_shape_are_one_line_each(run_cli: RunCli, tmp_path: Path) -> None:
    store = str(tmp_path)
    cases = {
        # Choices typer checks: one line all the same.
        ("--device", "gpu"): (
            "error: Invalid value for '--device' (env var: 'NEURONFLEET_DEVICE'): "
            "Value error, 'gpu' is not one of 'sim', 'neuron'.\n"
        ),
        ("--device", "sim", "--target", "trn4"): (
            "error: Invalid value for '--target': Value error, 'trn4' is not one of 'trn1', 'trn2', 'trn3', 'inf2'.\n"
        ),
        ("--device", "sim", "--clock", "fast"): (
            "error: Invalid value for '--clock': Value error, 'fast' is not one of 'real', 'virtual'.\n"
        ),
        ("--device", "sim", "--shape", "gpt"): (
            "error: unknown --shape 'gpt'; known: tiny, llama-3.1-8b, llama-3.1-70b, llama-3.1-405b, llama-2-7b, "
            "llama-2-13b, llama-2-70b, mistral-7b\n"
        ),
        ("--device", "sim", "--target", "inf2", "--instance-type", "trn2.48xlarge"): (
            "error: --instance-type trn2.48xlarge is not a inf2 instance\n"
        ),
    }
    for args, message in cases.items():
        result = run_cli("neuronfleet-engine", "compile", "--artifact-store", store, *args)
        assert (result.returncode, result.stderr) == (2, message), args


def test_serve_refuses_a_port_or_drain_timeout_out_of_range(run_cli: RunCli) -> None:
    cases = {
        ("--port", "0"): "error: Invalid value for '--port': Input should be greater than or equal to 1\n",
        ("--port", "65536"): "error: Invalid value for '--port': Input should be less than or equal to 65535\n",
        ("--drain-timeout", "-1"): (
            "error: Invalid value for '--drain-timeout': Input should be greater than or equal to 0\n"
        ),
    }
    for args, message in cases.items():
        result = run_cli("neuronfleet-engine", "serve", "--device", "sim", *args)
        assert (result.returncode, result.stderr) == (2, message), args


def test_serve_and_compile_on_neuron_need_the_plugin(run_cli: RunCli, tmp_path: Path) -> None:
    for command in (["serve"], ["compile", "--artifact-store", str(tmp_path / "store")]):
        result = run_cli("neuronfleet-engine", *command, "--device", "neuron")
        assert result.returncode == 2, command
        assert result.stderr == (
            "error: --device neuron needs the vLLM Neuron plugin (vllm-neuron), which is not installed here; "
            "--device sim runs the simulated Neuron device\n"
        ), command
    # Refused before anything was written.
    assert not (tmp_path / "store").exists()


def test_the_lnc_setting_is_part_of_the_hash_and_a_chip_without_it_is_refused(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **SETTINGS)
    model = ModelSource(uri="hf://neuronfleet/tiny", revision="main")
    lnc_1 = CompileIdentity.of(model, EngineConfig(**SETTINGS), "trn2", "neuronfleet/engine:0.1.0", "sim", 1)
    assert lnc_1.hash() != expected_hash()
    result = compile_sim(run_cli, config, tmp_path, "--logical-neuron-cores", "1", "--artifact-hash", "0" * 16)
    assert result.returncode == 2
    assert f"does not match the identity computed here ({lnc_1.hash()})" in result.stderr
    refused = compile_sim(run_cli, config, tmp_path, "--target", "inf2", "--logical-neuron-cores", "2")
    assert refused.returncode == 2
    assert "logical NeuronCores 2 is not a setting of inf2: 1" in refused.stderr
