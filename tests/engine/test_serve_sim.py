"""`neuronfleet-engine serve --device sim`: vLLM's real server, the Neuron scheduler, the simulated device.

One server for the module, serving a tiny shape from an artifact compiled first.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness.engine_server import SCRIPTS, EngineServer, ServerPool, write_engine_config

from neuronfleet.engine.buckets import chunk_sizes, get_bucket_for_count
from neuronfleet.engine.serving.readiness import ARTIFACT_HEADER
from neuronfleet.engine.sim.tokenizer import words

# pydantic and yaml only, so it imports in the vLLM 0.29 venv of `make compat` too.
from neuronfleet.operator import scaling

pytestmark = pytest.mark.vllm_matrix

RunCli = Callable[..., subprocess.CompletedProcess[str]]

MODEL = "neuronfleet/tiny"
PREFILL_BUCKETS = [64, 128, 256]
MAX_BATCHED_TOKENS = 256
ENGINE: dict[str, Any] = {
    "max_num_seqs": 4,
    "max_num_batched_tokens": MAX_BATCHED_TOKENS,
    "max_model_len": 512,
    "num_batched_tokens_buckets": PREFILL_BUCKETS,
    "num_seqs_buckets": [1, 2, 4],
}
_words = words()


def prompt(length: int) -> str:
    """``length`` words never used before in this module: one token each, and no prefix-cache hits."""
    return " ".join(itertools.islice(_words, length))


@pytest.fixture(scope="module")
def server(servers: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> EngineServer:
    directory = tmp_path_factory.mktemp("engine")
    config = write_engine_config(directory, **ENGINE)
    store = directory / "store"
    compiled = subprocess.run(
        [
            str(SCRIPTS / "neuronfleet-engine"),
            "compile",
            "--config",
            str(config),
            "--device",
            "sim",
            "--artifact-store",
            str(store),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    server = servers.start(
        "--config", str(config), "--device", "sim", "--clock", "virtual", "--artifact-store", str(store)
    )
    server.extra["artifact"] = compiled.stdout.split("artifact ")[1].split()[0]
    return server


def completion(server: EngineServer, text: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    response = server.post("/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": max_tokens, **extra})
    assert response.status == 200, response.body
    result: dict[str, Any] = response.json()
    return result


def test_ready_names_the_model_and_the_artifact_loaded(server: EngineServer) -> None:
    response = server.request("/ready")
    assert response.status == 200
    assert response.json() == {
        "status": "ready",
        "model": MODEL,
        "device": "sim",
        "artifact": server.extra["artifact"],
    }


def test_models_and_health(server: EngineServer) -> None:
    assert server.request("/health").status == 200
    models = server.request("/v1/models").json()
    assert [model["id"] for model in models["data"]] == [MODEL]
    assert models["data"][0]["max_model_len"] == ENGINE["max_model_len"]


def test_every_response_names_the_artifact_that_served_it(server: EngineServer) -> None:
    answered = server.post("/v1/completions", {"model": MODEL, "prompt": prompt(4), "max_tokens": 2})
    assert answered.status == 200, answered.body
    refused = server.post("/v1/completions", {"model": MODEL, "prompt": prompt(4), "max_tokens": 0})
    assert refused.status == 400, refused.body
    for response in (answered, refused, server.request("/health")):
        assert response.headers[ARTIFACT_HEADER] == server.extra["artifact"]


def test_completion_returns_max_tokens_deterministically(server: EngineServer) -> None:
    text = prompt(12)
    first = completion(server, text, 9)
    assert first["usage"] == {
        "prompt_tokens": 12,
        "completion_tokens": 9,
        "total_tokens": 21,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    assert first["choices"][0]["finish_reason"] == "length"
    # Each token is one word of the local tokenizer.
    assert len(first["choices"][0]["text"].split()) == 9
    # The same prompt gets the same reply (served from the prefix cache the second time).
    assert completion(server, text, 9)["choices"][0]["text"] == first["choices"][0]["text"]


def test_streamed_completion_has_max_tokens(server: EngineServer) -> None:
    events = list(
        server.stream(
            "/v1/completions",
            {"model": MODEL, "prompt": prompt(30), "max_tokens": 40, "stream_options": {"include_usage": True}},
        )
    )
    text = "".join(choice["text"] for event in events for choice in event["choices"])
    assert len(text.split()) == 40
    assert events[-1]["usage"]["completion_tokens"] == 40
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["length"]


def test_chat_completion(server: EngineServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt(5)}], "max_tokens": 6}
    response = server.post("/v1/chat/completions", body)
    assert response.status == 200, response.body
    result = response.json()
    # The chat template wraps the message in single-token role markers: <|user|> ... <|end|> <|assistant|>.
    assert result["usage"]["prompt_tokens"] == 5 + 3
    assert result["usage"]["completion_tokens"] == 6
    assert result["choices"][0]["message"]["role"] == "assistant"
    assert len(result["choices"][0]["message"]["content"].split()) == 6


def test_streamed_chat_completion(server: EngineServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": prompt(3)}, {"role": "user", "content": prompt(4)}],
        "max_tokens": 25,
        "stream_options": {"include_usage": True},
    }
    events = list(server.stream("/v1/chat/completions", body))
    content = "".join(choice["delta"].get("content") or "" for event in events for choice in event["choices"])
    assert len(content.split()) == 25
    assert events[-1]["usage"]["completion_tokens"] == 25
    assert events[-1]["usage"]["prompt_tokens"] == 3 + 4 + 5


def padding_counters(server: EngineServer) -> dict[str, float]:
    """The padding and prefill-step samples of ``/metrics``, by sample name and bucket."""
    samples = server.metrics()
    return {
        f"{name}{dict(labels).get('bucket', '')}": value
        for (name, labels), value in samples.items()
        if name.startswith(("neuronfleet:padding_tokens", "neuronfleet:prefill_steps"))
    }


def test_padding_metrics_match_the_bucket_sets(server: EngineServer) -> None:
    lengths = [10, 64, 100, 300, 500]
    expected: dict[str, float] = {}
    for length in lengths:
        for chunk in chunk_sizes(length, MAX_BATCHED_TOKENS):
            bucket = get_bucket_for_count(chunk, PREFILL_BUCKETS)
            for name in ("neuronfleet:padding_tokens_total", f"neuronfleet:padding_tokens_by_bucket_total{bucket}"):
                expected[name] = expected.get(name, 0) + bucket - chunk
            step = f"neuronfleet:prefill_steps_total{bucket}"
            expected[step] = expected.get(step, 0) + 1

    before = padding_counters(server)
    for length in lengths:
        assert completion(server, prompt(length), 1)["usage"]["prompt_tokens"] == length
    after = padding_counters(server)

    added = {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}
    # 10 -> 64 (54), 64 -> 64 (0), 100 -> 128 (28), 300 -> 256 + 44 in 64 (20), 500 -> 256 + 244 in 256 (12).
    assert expected["neuronfleet:padding_tokens_total"] == 114
    assert added == {name: value for name, value in expected.items() if value}


def test_engine_metrics_are_exported(server: EngineServer) -> None:
    completion(server, prompt(20), 5)
    samples = server.metrics()
    names = {name for name, _ in samples}
    assert {
        "neuronfleet:scheduler_state",
        "neuronfleet:decode_steps_total",
        "neuronfleet:kv_admission_deferrals_total",
        "neuronfleet:prefill_chunk_tokens_count",
        "neuronfleet:sim_device_seconds_total",
        # vLLM's own metrics are still there.
        "vllm:num_requests_running",
        "vllm:generation_tokens_total",
    } <= names
    states = {
        dict(labels)["state"]: value
        for (name, labels), value in samples.items()
        if name == "neuronfleet:scheduler_state"
    }
    assert states == {"IDLE": 1.0, "ACTIVE_PREFILL": 0.0, "ACTIVE_DECODE": 0.0}
    decode_buckets = {
        dict(labels)["bucket"] for (name, labels), _ in samples.items() if name == "neuronfleet:decode_steps_total"
    }
    assert decode_buckets <= {"1", "2", "4"}


def test_the_series_autoscaling_queries_are_the_ones_vllm_exports(server: EngineServer) -> None:
    # KEDA's triggers (and the peers' routers) read vLLM's own names: a rename in vLLM breaks scaling silently.
    completion(server, prompt(20), 5)
    names = {name for name, _ in server.metrics()}
    queried = {scaling.WAITING_REQUESTS, scaling.KV_CACHE_USAGE, f"{scaling.TIME_TO_FIRST_TOKEN}_bucket"}
    assert queried <= names, queried - names


def test_prompt_longer_than_max_model_len_is_a_400(server: EngineServer) -> None:
    response = server.post("/v1/completions", {"model": MODEL, "prompt": prompt(600), "max_tokens": 1})
    assert response.status == 400
    message = response.json()["error"]["message"]
    assert "maximum context length is 512 tokens" in message
    assert "reduce the length of the input prompt" in message
    assert completion(server, prompt(3), 2)["usage"]["completion_tokens"] == 2


def test_malformed_json_is_a_400_and_the_server_stays_up(server: EngineServer) -> None:
    response = server.request("/v1/completions", b'{"model": "neuronfleet/tiny", "prompt": ')
    assert response.status == 400
    assert "JSON" in response.body.decode()
    assert server.request("/health").status == 200
    assert completion(server, prompt(3), 2)["usage"]["completion_tokens"] == 2


def test_logprobs_are_refused_with_a_400(server: EngineServer) -> None:
    response = server.post("/v1/completions", {"model": MODEL, "prompt": prompt(3), "max_tokens": 2, "logprobs": 1})
    assert response.status == 400
    assert response.json()["error"]["message"].startswith("logprobs is not supported by the simulated Neuron device")


def test_served_from_the_compiled_artifact(server: EngineServer) -> None:
    log = server.log.read_text()
    assert f"Loaded compiled artifact {server.extra['artifact']}" in log
    assert "NeuronScheduler: prefill buckets [64, 128, 256], decode buckets [1, 2, 4]" in log


def test_serve_refuses_a_missing_artifact(run_cli: RunCli, tmp_path: Path) -> None:
    config = write_engine_config(tmp_path, **ENGINE)
    result = run_cli(
        "neuronfleet-engine", "serve", "--config", str(config), "--device", "sim", "--artifact-store", str(tmp_path)
    )
    assert result.returncode == 3
    assert result.stderr.startswith(f"error: no compiled artifact at {tmp_path}/")
    assert "run `neuronfleet-engine compile` first" in result.stderr
