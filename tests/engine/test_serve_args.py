"""What `serve` hands to vLLM: its arguments and environment (vLLM accepting them is test_serve_sim's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
import vllm.envs as vllm_envs

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape, served_name, shape_for_model
from neuronfleet.contract.names import HTTP_KEEP_ALIVE_S, HTTP_PORT, KV_EVENTS_PORT
from neuronfleet.contract.sim_settings import EXECUTOR_CLS, START_TIME_SCALE_ENV, STEP_TIMES_ENV, SimSettings
from neuronfleet.engine.cli.main import app
from neuronfleet.engine.cli.options import ServeOptions
from neuronfleet.engine.cli.serve import plan_serve, sim_settings
from neuronfleet.engine.serving.serve import (
    CPU_COMPILE_ENVS,
    KEEP_ALIVE_ENV,
    MULTIPROC_METHOD_ENV,
    SERVED_ARTIFACT_ENV,
    ServeRequest,
    plugin_allowlist,
    serve_environment,
    vllm_serve_argv,
)
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.platform import activate
from neuronfleet.engine.tuning.prefill_cap import derive_prefill_cap
from neuronfleet.operator.plan import envoy

ENGINE = EngineConfig(max_num_seqs=8, max_num_batched_tokens=4096, max_model_len=8192, tensor_parallel_size=8)


def request(**changes: Any) -> ServeRequest:
    base = ServeRequest(
        engine=ENGINE,
        device="sim",
        model="/models/llama",
        served_model_name="meta-llama/Llama-3.1-8B",
        revision="0e9e39f",
        host="127.0.0.1",
        port=8000,
        drain_timeout=45,
        artifact_dir=Path("/store/abc"),
        sim=SimSettings(shape="llama-3.1-8b", clock="virtual"),
    )
    return ServeRequest(**{**base.__dict__, **changes})


def options(argv: list[str]) -> dict[str, str | None]:
    """``--name value`` pairs and bare ``--flag``s of ``argv`` after the model."""
    parsed: dict[str, str | None] = {}
    rest = argv[1:]
    while rest:
        name, rest = rest[0], rest[1:]
        assert name.startswith("--"), name
        if rest and not rest[0].startswith("--"):
            parsed[name], rest = rest[0], rest[1:]
        else:
            parsed[name] = None
    return parsed


def test_sim_arguments() -> None:
    argv = vllm_serve_argv(request())
    assert argv[0] == "/models/llama"
    args = options(argv)
    assert args["--served-model-name"] == "meta-llama/Llama-3.1-8B"
    assert (args["--host"], args["--port"], args["--shutdown-timeout"]) == ("127.0.0.1", "8000", "45")
    assert args["--scheduler-cls"] == "neuronfleet.engine.scheduler.NeuronAsyncScheduler"
    assert args["--distributed-executor-backend"] == EXECUTOR_CLS
    assert (args["--max-num-seqs"], args["--max-num-batched-tokens"], args["--max-model-len"]) == ("8", "4096", "8192")
    assert args["--tensor-parallel-size"] == "8"
    assert "--no-async-scheduling" not in args
    # The simulated model directory has no revisions.
    assert "--revision" not in args
    assert json.loads(args["--additional-config"] or "") == {
        "neuron_config": ENGINE.neuron_config(),
        "neuronfleet_sim": {
            "shape": "llama-3.1-8b",
            "instance_type": "trn2.48xlarge",
            "clock": "virtual",
            "artifact_dir": "/store/abc",
            "weights_store": "local",
            "presharded_weights": False,
            "step_times": "device",
            "start_time_scale": 1.0,
        },
    }
    assert ENGINE.neuron_config()["num_batched_tokens_buckets"] == [128, 256, 512, 1024, 2048, 4096]
    # An LNC setting reaches the simulated device's cost model in the engine core.
    lnc = options(vllm_serve_argv(request(sim=SimSettings(shape="llama-3.1-8b", logical_neuron_cores=1))))
    assert json.loads(lnc["--additional-config"] or "")["neuronfleet_sim"]["logical_neuron_cores"] == 1


def test_no_async_scheduling_selects_the_sync_scheduler() -> None:
    args = options(vllm_serve_argv(request(async_scheduling=False)))
    assert args["--scheduler-cls"] == "neuronfleet.engine.scheduler.NeuronScheduler"
    assert "--no-async-scheduling" in args


def test_neuron_device_leaves_execution_to_vllm_and_its_plugin() -> None:
    argv = vllm_serve_argv(request(device="neuron", extra_args=("--enable-prefix-caching",)))
    args = options(argv)
    assert "--distributed-executor-backend" not in args
    assert args["--revision"] == "0e9e39f"
    assert "neuronfleet_sim" not in json.loads(args["--additional-config"] or "")
    assert argv[-1] == "--enable-prefix-caching"


def test_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    sim = serve_environment(request(port=8123), {"PATH": "/bin"})
    assert sim["NEURONFLEET_DEVICE"] == "sim"
    assert sim["HF_HUB_OFFLINE"] == "1"
    assert sim["VLLM_NO_USAGE_STATS"] == "1"
    metrics = Path(sim["PROMETHEUS_MULTIPROC_DIR"])
    assert metrics.is_dir()
    assert not any(metrics.iterdir())
    neuron = serve_environment(request(device="neuron", port=8124), {"NEURONFLEET_DEVICE": "sim"})
    assert "NEURONFLEET_DEVICE" not in neuron
    assert neuron["NEURON_LIBTORCH_REMOTE_CACHE"] == "/store/abc/neff"
    # The Neuron SDK 2.33 contract: serving never compiles, a graph missing from the cache is an error.
    assert neuron["VLLM_NEURON_DISABLE_WARMUP_COMPILE"] == "1"
    assert "VLLM_NEURON_DISABLE_WARMUP_COMPILE" not in sim
    mine = serve_environment(request(port=8125), {"PROMETHEUS_MULTIPROC_DIR": "/mine", "VLLM_PLUGINS": "a"})
    assert mine["PROMETHEUS_MULTIPROC_DIR"] == "/mine"
    assert mine["VLLM_PLUGINS"] == "a,neuronfleet_ready"


def test_the_routers_envoy_closes_an_idle_engine_connection_before_the_engine_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine that closes a kept-alive connection as Envoy sends on it makes Envoy answer 503: Envoy must
    let go first, whatever keep-alive the pod's environment would have given vLLM."""
    env = serve_environment(request(port=8131), {KEEP_ALIVE_ENV: "1"})
    assert env[KEEP_ALIVE_ENV] == str(HTTP_KEEP_ALIVE_S)
    monkeypatch.setenv(KEEP_ALIVE_ENV, env[KEEP_ALIVE_ENV])
    assert vllm_envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE == HTTP_KEEP_ALIVE_S
    clusters = {c["name"]: c for c in envoy.envoy_config()["static_resources"]["clusters"]}
    options = clusters["pool"]["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    idle = options["common_http_protocol_options"]["idle_timeout"]
    assert idle.endswith("s")
    assert 0 < float(idle[:-1]) < HTTP_KEEP_ALIVE_S


def test_the_simulated_engine_core_is_forked_unless_the_user_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    # Forked, the engine core starts with the API server's imports instead of importing everything again.
    assert serve_environment(request(port=8128), {})[MULTIPROC_METHOD_ENV] == "fork"
    assert serve_environment(request(port=8129), {MULTIPROC_METHOD_ENV: "spawn"})[MULTIPROC_METHOD_ENV] == "spawn"
    # On Neuron, vLLM and its plugin choose.
    assert MULTIPROC_METHOD_ENV not in serve_environment(request(device="neuron", port=8130), {})


def test_the_served_artifact_is_named_and_no_compile_switch_is_inherited(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    inherited = {"VLLM_NEURON_CPU_COMPILE": "1", "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", SERVED_ARTIFACT_ENV: "old"}
    neuron = serve_environment(request(device="neuron", port=8126), inherited)
    assert neuron[SERVED_ARTIFACT_ENV] == "abc"
    # A serving pod that ran the CPU compile route would compile for the target instead of running it.
    assert not set(CPU_COMPILE_ENVS) & set(neuron)
    unpinned = serve_environment(request(port=8127, artifact_dir=None), inherited)
    assert SERVED_ARTIFACT_ENV not in unpinned


def test_the_plugin_allowlist_keeps_every_installed_plugin() -> None:
    # Naming one plugin in VLLM_PLUGINS turns off every unnamed one, in every group.
    names = plugin_allowlist(None).split(",")
    assert {"neuronfleet_sim", "neuronfleet", "neuronfleet_ready"} <= set(names)
    assert plugin_allowlist("neuronfleet_ready") == "neuronfleet_ready"


@pytest.mark.parametrize(
    ("uri", "name", "shape"),
    [
        ("hf://meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("hf://meta-llama/Meta-Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B", "llama-3.1-70b"),
        ("s3://models/llama/Llama-3.1-70B/", "Llama-3.1-70B", "llama-3.1-70b"),
        ("hf://neuronfleet/tiny", "neuronfleet/tiny", "tiny"),
        ("hf://mistralai/Mistral-7B-Instruct-v0.2", "mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b"),
        ("hf://meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-hf", "llama-2-13b"),
        ("hf://meta-llama/Llama-3.1-405B", "meta-llama/Llama-3.1-405B", "llama-3.1-405b"),
        ("hf://google/gemma-2-9b", "google/gemma-2-9b", "tiny"),
    ],
)
def test_names_and_shapes_from_the_model_uri(uri: str, name: str, shape: str) -> None:
    assert served_name(uri) == name
    assert shape_for_model(uri) == shape


def test_the_platform_plugin_answers_only_for_the_simulated_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEURONFLEET_DEVICE", raising=False)
    assert activate() is None
    monkeypatch.setenv("NEURONFLEET_DEVICE", "neuron")
    assert activate() is None
    monkeypatch.setenv("NEURONFLEET_DEVICE", "sim")
    assert activate() == "neuronfleet.engine.sim.platform.SimNeuronPlatform"


def test_kv_events_are_published_on_their_port_and_replayed_on_the_next() -> None:
    assert "--kv-events-config" not in options(vllm_serve_argv(request()))
    config = json.loads(options(vllm_serve_argv(request(kv_events_port=KV_EVENTS_PORT)))["--kv-events-config"] or "")
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
        "replay_endpoint": f"tcp://*:{KV_EVENTS_PORT + 1}",
    }
    assert HTTP_PORT not in {KV_EVENTS_PORT, KV_EVENTS_PORT + 1}


@pytest.mark.parametrize(
    ("ports", "complaint"),
    [
        (["--port", "5557", "--kv-events-port", "5557"], "the HTTP port (5557), the KV events port (5557)"),
        (["--kv-events-port", "7999"], "the HTTP port (8000), the KV events port (7999) and its replay port (8000)"),
        (["--kv-events-replay-port", "5558"], "--kv-events-replay-port needs --kv-events-port"),
    ],
)
def test_ports_that_clash_are_refused_before_anything_starts(
    ports: list[str], complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as refused:
        plan_serve(serve_options("--device", "sim", *ports))
    assert refused.value.exit_code == 2
    assert complaint in capsys.readouterr().err


def test_serve_resolves_the_prefill_cap_and_the_artifact_before_it_fetches_anything(tmp_path: Path) -> None:
    config = tmp_path / "engine.yaml"
    config.write_text(json.dumps({"max_num_seqs": 8, "max_model_len": 4096, "max_num_batched_tokens": 4096}))
    args = ("-c", str(config), "--device", "sim", "--model", "hf://meta-llama/Llama-3.1-8B", "--port", "9000")
    planned = plan_serve(serve_options(*args, "--artifact-store", str(tmp_path / "store")), ["--seed", "1"])
    request = planned.request
    # `auto` is decided by the simulated replica's step times: an 8B at TP 1 on a trn2.48xlarge.
    cost = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=1)
    assert request.engine.scheduler.max_prefill_tokens_while_decoding == derive_prefill_cap(request.engine, cost) == 256
    assert (request.sim.shape, request.port, request.extra_args) == ("llama-3.1-8b", 9000, ("--seed", "1"))
    assert request.served_model_name == "meta-llama/Llama-3.1-8B"
    # The artifact named is the 8B's for the simulated device; nothing is fetched or compiled yet.
    assert planned.identity is not None
    assert (planned.identity.model.uri, planned.identity.device) == ("hf://meta-llama/Llama-3.1-8B", "sim")
    assert request.artifact_dir is None
    assert not (tmp_path / "store").exists()
    assert plan_serve(serve_options(*args)).identity is None


def serve_options(*args: str) -> ServeOptions:
    """``serve``'s options as the engine's command line parses ``args``."""
    group = typer.main.get_command(app)
    context = group.make_context("neuronfleet-engine", ["serve", *args])
    serve = group.get_command(context, "serve")  # type: ignore[attr-defined]
    return ServeOptions(**serve.make_context("serve", list(args), parent=context).params)


def test_the_sim_settings_take_the_weights_store_from_the_model_and_the_start_time_scale_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(START_TIME_SCALE_ENV, "0.25")
    settings = sim_settings("s3://models/Llama-3.1-70B", "trn2", None, None, "real")
    assert (settings.shape, settings.weights_store, settings.start_time_scale) == ("llama-3.1-70b", "s3", 0.25)
    monkeypatch.delenv(START_TIME_SCALE_ENV)
    assert sim_settings("hf://meta-llama/Llama-3.1-8B", "trn2", None, None, "real").start_time_scale == 1.0
    for bad in ("fast", "2", "-0.5"):
        monkeypatch.setenv(START_TIME_SCALE_ENV, bad)
        with pytest.raises(typer.Exit):
            sim_settings("hf://neuronfleet/tiny", "trn2", None, None, "real")
        assert f"{START_TIME_SCALE_ENV}={bad!r}: a number from 0 to 1" in capsys.readouterr().err


def test_the_simulated_devices_step_times_come_from_it_unless_the_environment_asks_the_scheduler(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sim_settings("hf://neuronfleet/tiny", "trn2", None, None, "real").step_times == "device"
    monkeypatch.setenv(STEP_TIMES_ENV, "scheduler")
    assert sim_settings("hf://neuronfleet/tiny", "trn2", None, None, "real").step_times == "scheduler"
    monkeypatch.setenv(STEP_TIMES_ENV, "executor")
    with pytest.raises(typer.Exit):
        sim_settings("hf://neuronfleet/tiny", "trn2", None, None, "real")
    assert f"{STEP_TIMES_ENV}='executor': device" in capsys.readouterr().err
    monkeypatch.setenv(STEP_TIMES_ENV, "scheduler")
    with pytest.raises(typer.Exit):
        sim_settings("hf://neuronfleet/tiny", "trn2", None, None, "virtual")
    assert "needs --clock real" in capsys.readouterr().err
