"""`neuronfleet-engine serve --device sim`: vLLM's real server, the Neuron scheduler, the simulated device.

One server for the module, serving a tiny shape from an artifact compiled first; the module's
last test stops it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.engine_server import (
    REQUEST_TIMEOUT_S,
    SCRIPTS,
    EngineServer,
    ServerPool,
    error_lines,
    write_engine_config,
)
from harness.kv_events import replayed
from vllm.distributed.kv_events import BlockStored

from neuronfleet.contract import metrics, names
from neuronfleet.contract.buckets import chunk_sizes, get_bucket_for_count
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.model_shapes import shape_for_model
from neuronfleet.contract.sim_settings import STEP_TIMES_ENV
from neuronfleet.devcluster.addons.metrics import Samples
from neuronfleet.devcluster.process.managed import free_ports
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.engine.cli import serve
from neuronfleet.engine.serving.drain import CLOSE_CONNECTIONS_S
from neuronfleet.engine.serving.readiness import ARTIFACT_HEADER
from neuronfleet.engine.sim.tokenizer import words

# pydantic and yaml only, so it imports in the vLLM 0.29 venv of `make compat` too.
from neuronfleet.operator.policy import canary, scaling

pytestmark = pytest.mark.vllm_matrix

RunCli = Callable[..., subprocess.CompletedProcess[str]]

MODEL = "neuronfleet/tiny"
#: The pod name the operator would give the replica.
REPLICA = "tiny-7d4b9c-x2kq9"
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
#: The LoRA slots the module's artifact is compiled with, and the adapters served in them, by rank.
LORA_SLOTS = ("--max-loras", "2", "--max-lora-rank", "16")
ADAPTER_RANKS = {"fr": 8, "de": 16}


def write_adapter(directory: Path, rank: int) -> Path:
    """A LoRA adapter folder as PEFT writes one; the simulated device reads only its configuration."""
    directory.mkdir(parents=True)
    config = {"r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"], "bias": "none"}
    (directory / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "LORA"}))
    (directory / "adapter_model.safetensors").write_bytes(bytes(range(256)) * rank)
    return directory


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
            *LORA_SLOTS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert compiled.returncode == 0, compiled.stderr
    kv_events, kv_replay = free_ports(2)
    server = servers.start(
        "--config",
        str(config),
        "--device",
        "sim",
        "--clock",
        "virtual",
        "--artifact-store",
        str(store),
        "--kv-events-port",
        str(kv_events),
        "--kv-events-replay-port",
        str(kv_replay),
        *LORA_SLOTS,
        *(
            f"--lora-adapter={name}={write_adapter(directory / 'adapters' / name, rank)}"
            for name, rank in ADAPTER_RANKS.items()
        ),
        env={names.REPLICA_ENV: REPLICA},
    )
    server.extra["artifact"] = compiled.stdout.split("artifact ")[1].split()[0]
    server.extra["kv_replay"] = f"tcp://127.0.0.1:{kv_replay}"
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
    assert [model["id"] for model in models["data"]] == [MODEL, *ADAPTER_RANKS]
    assert models["data"][0]["max_model_len"] == ENGINE["max_model_len"]
    assert [model["parent"] for model in models["data"][1:]] == [MODEL] * len(ADAPTER_RANKS)


def test_each_lora_adapter_answers_by_its_name_and_an_unknown_one_is_a_404(server: EngineServer) -> None:
    text = prompt(10)
    replies = {}
    for model in (MODEL, *ADAPTER_RANKS):
        response = server.post("/v1/completions", {"model": model, "prompt": text, "max_tokens": 6})
        assert response.status == 200, response.body
        assert response.json()["model"] == model
        replies[model] = response.json()["choices"][0]["text"]
    # Each adapter changes the reply, and the same adapter gives the same reply again.
    assert len(set(replies.values())) == 1 + len(ADAPTER_RANKS), replies
    again = completion(server, text, 6, model="fr")
    assert again["choices"][0]["text"] == replies["fr"]
    unknown = server.post("/v1/completions", {"model": "es", "prompt": text, "max_tokens": 6})
    assert unknown.status == 404, unknown.body


def test_every_response_names_the_replica_and_the_artifact_that_served_it(server: EngineServer) -> None:
    answered = server.post("/v1/completions", {"model": MODEL, "prompt": prompt(4), "max_tokens": 2})
    assert answered.status == 200, answered.body
    refused = server.post("/v1/completions", {"model": MODEL, "prompt": prompt(4), "max_tokens": 0})
    assert refused.status == 400, refused.body
    streamed = server.request_stream("/v1/completions", {"model": MODEL, "prompt": prompt(4), "max_tokens": 2})
    for response in (answered, refused, streamed, server.request("/health")):
        assert response.headers[ARTIFACT_HEADER] == server.extra["artifact"]
        assert response.headers[names.REPLICA_HEADER] == REPLICA


def test_completion_returns_max_tokens_deterministically(server: EngineServer) -> None:
    text = prompt(12)
    first = completion(server, text, 9)
    # vLLM 0.34 leaves out the details that are None; 0.29 sends them as null.
    usage = {key: value for key, value in first["usage"].items() if value is not None}
    assert usage == {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21}
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


def test_the_canary_analysis_reads_what_a_served_completion_adds_to_the_engines_metrics(server: EngineServer) -> None:
    """The operator's canary parser (``neuronfleet.operator.policy.canary``) on the engine's own ``/metrics``."""
    before = canary.parse_figures(server.request("/metrics").body.decode())
    completion(server, prompt(30), 4)
    added = canary.parse_figures(server.request("/metrics").body.decode()) - before
    assert (added.requests, added.errors) == (1, 0)
    assert added.ttft[math.inf] == 1
    # Three tokens after the first: three inter-token latencies.
    assert added.itl[math.inf] == 3
    assert added.prefill_tokens == 30
    # 30 prompt tokens in the smallest prefill bucket, 64: 34 of padding.
    assert added.padding_tokens == 64 - 30


def test_engine_metrics_are_exported(server: EngineServer) -> None:
    completion(server, prompt(20), 5)
    samples = server.metrics()
    names = {name for name, _ in samples}
    assert {
        "neuronfleet:scheduler_state",
        "neuronfleet:decode_steps_total",
        "neuronfleet:kv_admission_deferrals_total",
        "neuronfleet:prefill_chunk_tokens_count",
        "neuronfleet:device_busy_seconds_total",
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


def test_the_series_the_endpoint_picker_reads_are_exported(server: EngineServer) -> None:
    # GIE's Endpoint Picker reads vLLM's names: a renamed series and it routes to this pod blind.
    completion(server, prompt(20), 5)
    exported = {name for name, _ in server.metrics()}
    assert set(metrics.PICKER_METRICS) <= exported, set(metrics.PICKER_METRICS) - exported
    assert metrics.REQUESTS_IN_FLIGHT in exported
    # The LoRA series the picker's adapter affinity reads, with the slots.
    lora_info = [labels for name, labels in server.metrics() if name == metrics.LORA_INFO]
    assert lora_info
    assert all(("max_lora", "2") in labels for labels in lora_info), lora_info


#: The loaded server: Llama 3.1 8B on one Inferentia2 chip with the real clock, so a decode step takes the
#: cost model's ~27 ms and a reply of LOAD_MAX_TOKENS streams for seconds; two running slots, twice as
#: many requests. Its block size is not the default, so the picker's labels are seen to follow it.
LOAD_MODEL = "meta-llama/Llama-3.1-8B"
LOAD_ENGINE: dict[str, Any] = {
    "max_num_seqs": 2,
    "max_num_batched_tokens": 512,
    "max_model_len": 1024,
    "tensor_parallel_size": 2,
    "block_size": 16,
}
LOAD_REQUESTS = 4
LOAD_PROMPT = 40
LOAD_MAX_TOKENS = 120
#: The picker scrapes every 50 ms; the test scrapes as often while it waits for a state.
SCRAPE_INTERVAL_S = 0.05
#: Far longer than a queued request takes to reach the engine core, and than the gauges take to follow a
#: step; shorter than the load lasts (two waves of LOAD_MAX_TOKENS decode steps).
SCRAPE_TIMEOUT_S = 10.0
#: What the simulated device logs it has: the picker's ``num_gpu_blocks`` must say the same.
DEVICE_BLOCKS = re.compile(r"Simulated Neuron device: .*; KV cache (\d+) blocks")


def start_loaded(servers: ServerPool, directory: Path, env: dict[str, str] | None = None) -> EngineServer:
    """The loaded server's engine, in ``directory``."""
    config = write_engine_config(directory, **LOAD_ENGINE)
    return servers.start(
        "--config",
        str(config),
        "--device",
        "sim",
        "--model",
        f"hf://{LOAD_MODEL}",
        "--target",
        "inf2",
        "--instance-type",
        "inf2.xlarge",
        "--artifact-store",
        str(directory / "store"),
        "--compile-on-start",
        env=env,
    )


@pytest.fixture
def loaded_server(servers: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    server = start_loaded(servers, tmp_path_factory.mktemp("loaded"))
    yield server
    # Its CPU goes back to the module's server for the tests after this one.
    server.terminate()


class Streamed:
    """A streamed completion on its own thread: whether its first token came, and whether it ended."""

    def __init__(self, server: EngineServer, text: str) -> None:
        self.first_token = threading.Event()
        self.done = threading.Event()
        self.completion_tokens = 0
        self.errors: list[BaseException] = []
        body = {
            "model": LOAD_MODEL,
            "prompt": text,
            "max_tokens": LOAD_MAX_TOKENS,
            "stream_options": {"include_usage": True},
        }
        self._thread = threading.Thread(target=self._run, args=(server, body), daemon=True)
        self._thread.start()

    def _run(self, server: EngineServer, body: dict[str, Any]) -> None:
        try:
            for event in server.stream("/v1/completions", body):
                if event["choices"]:
                    self.first_token.set()
                if event.get("usage"):
                    self.completion_tokens = event["usage"]["completion_tokens"]
        except BaseException as error:  # reported by finish(), in the test's thread
            self.errors.append(error)
        finally:
            self.done.set()

    def finish(self) -> int:
        """Wait for the stream to end; its completion tokens."""
        self._thread.join(REQUEST_TIMEOUT_S)
        assert self.done.is_set(), "the stream is still open"
        assert not self.errors, self.errors
        return self.completion_tokens


def gauge(samples: Samples, name: str) -> float:
    """The value of the one series of ``name`` (one engine, one model)."""
    values = [value for (sample, _), value in samples.items() if sample == name]
    assert len(values) == 1, (name, values)
    return values[0]


def picker_view(samples: Samples) -> dict[str, float]:
    """The picker's gauges in ``samples``, for failure messages."""
    gauges = (metrics.RUNNING, metrics.WAITING, metrics.KV_CACHE_USAGE)
    return {name: value for (name, _), value in samples.items() if name in gauges}


def scrape_until(server: EngineServer, condition: Callable[[Samples], bool], what: str) -> Samples:
    """Scrape ``/metrics`` as the picker does until ``condition`` holds; fail after ``SCRAPE_TIMEOUT_S``."""
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while True:
        samples = server.metrics()
        if condition(samples):
            return samples
        if time.monotonic() > deadline:
            pytest.fail(f"/metrics never showed {what}: {picker_view(samples)}")
        time.sleep(SCRAPE_INTERVAL_S)


def test_the_picker_reads_running_waiting_and_kv_use_under_load(
    loaded_server: EngineServer, record_property: Callable[[str, object], None]
) -> None:
    server = loaded_server
    slots = LOAD_ENGINE["max_num_seqs"]
    running = [Streamed(server, prompt(LOAD_PROMPT)) for _ in range(slots)]
    for stream in running:
        assert stream.first_token.wait(REQUEST_TIMEOUT_S), "a request in a free slot never started"
    # These find every slot taken. They reach the engine core after their HTTP request does: scrape until
    # the queue counts them, which times out if the gauge never does.
    queued = [Streamed(server, prompt(LOAD_PROMPT)) for _ in range(LOAD_REQUESTS - slots)]
    samples = scrape_until(
        server, lambda samples: gauge(samples, metrics.WAITING) == len(queued), f"{len(queued)} waiting"
    )
    # The sample was taken under load: the queued requests had not started, the running ones not ended.
    assert not any(stream.first_token.is_set() for stream in queued)
    assert not any(stream.done.is_set() for stream in running)
    assert gauge(samples, metrics.RUNNING) == min(LOAD_REQUESTS, slots)
    # The engine's own live count, which the operator's picker reads as running: every request it holds.
    assert gauge(samples, metrics.REQUESTS_IN_FLIGHT) == LOAD_REQUESTS

    # The picker parses both labels as integers: the KV cache holds num_gpu_blocks * block_size tokens.
    ((_, labels),) = [key for key in samples if key[0] == metrics.CACHE_CONFIG]
    block_size = int(dict(labels)[metrics.BLOCK_SIZE_LABEL])
    num_blocks = int(dict(labels)[metrics.NUM_BLOCKS_LABEL])
    assert block_size == LOAD_ENGINE["block_size"]
    device = DEVICE_BLOCKS.search(server.log.read_text())
    assert device is not None
    assert num_blocks == int(device[1])

    # vLLM's usage is blocks held over blocks usable (all but its null block): a whole number of blocks.
    usage = gauge(samples, metrics.KV_CACHE_USAGE)
    held = usage * (num_blocks - 1)
    assert held == pytest.approx(round(held), abs=1e-6)
    # Each running request holds its prompt's blocks at least; at most those of its prompt, every token
    # it may generate and the one more async scheduling may allocate ahead. Queued ones hold none (their
    # prompts are new: no prefix-cache hits).
    least = slots * math.ceil(LOAD_PROMPT / block_size)
    most = slots * math.ceil((LOAD_PROMPT + LOAD_MAX_TOKENS + 1) / block_size)
    assert least <= round(held) <= most, (usage, held, least, most)
    assert 0 < usage <= 1
    record_property("under_load", {**picker_view(samples), "blocks_held": round(held), "bounds": [least, most]})
    record_property("cache_config", {"block_size": block_size, "num_gpu_blocks": num_blocks})

    assert [stream.finish() for stream in running + queued] == [LOAD_MAX_TOKENS] * LOAD_REQUESTS
    idle = {metrics.RUNNING: 0.0, metrics.WAITING: 0.0, metrics.KV_CACHE_USAGE: 0.0}
    idled = scrape_until(server, lambda samples: picker_view(samples) == idle, "an idle engine")
    assert gauge(idled, metrics.REQUESTS_IN_FLIGHT) == 0


def test_a_device_that_reports_no_step_times_is_timed_by_the_scheduler(
    servers: ServerPool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """As on a real Neuron device, whose executor publishes neither the steps' device time nor a prefill rate:
    the scheduler times each step from its dispatch to its output's return, and its seconds for four prompts of
    a full prefill graph each are the simulated device's own (the cost model's, the steps sleeping that long),
    with the host's share of each step on top. It publishes no prefill rate."""
    server = start_loaded(servers, tmp_path_factory.mktemp("scheduler-timed"), {STEP_TIMES_ENV: "scheduler"})
    try:
        for _ in range(4):
            completion(server, prompt(LOAD_ENGINE["max_num_batched_tokens"] - 8), 16, model=LOAD_MODEL)
        samples = server.metrics()
    finally:
        server.terminate()
    engine = EngineConfig.model_validate(LOAD_ENGINE)
    cost = serve.step_times("inf2.xlarge", shape_for_model(f"hf://{LOAD_MODEL}"), engine)
    steps = {
        (name, int(dict(labels)["bucket"])): value
        for (name, labels), value in samples.items()
        if name in ("neuronfleet:prefill_steps_total", "neuronfleet:decode_steps_total")
    }
    modelled = {
        "prefill": sum(
            n * cost.packed_prefill_seconds([(b, 0)]) for (name, b), n in steps.items() if "prefill" in name
        ),
        "decode": sum(
            n * cost.decode_seconds(b, engine.max_model_len) for (name, b), n in steps.items() if "decode" in name
        ),
    }
    timed = {
        kind: samples[(f"{metrics.DEVICE_BUSY_SECONDS}_total", (("kind", kind),))] for kind in ("prefill", "decode")
    }
    print(f"device seconds: timed by the scheduler {timed}, the cost model's {modelled}")
    for kind in ("prefill", "decode"):
        # Async scheduling may take a step's output in after the device began the next: a little less, then.
        assert 0.9 * modelled[kind] <= timed[kind] <= 1.5 * modelled[kind], kind
    assert metrics.PREFILL_TOKENS_PER_SECOND not in {name for name, _ in samples}


def stored_blocks(server: EngineServer) -> int:
    """Blocks the engine's KV cache events say it cached so far (``--kv-events-port``), from its replay."""
    return sum(
        len(event.block_hashes)
        for batch in replayed(server.extra["kv_replay"])
        for event in batch.events
        if isinstance(event, BlockStored)
    )


def test_kv_cache_events_publish_the_blocks_a_prompt_filled(server: EngineServer) -> None:
    before = stored_blocks(server)
    answer = completion(server, "kv events " + prompt(90), 4)
    filled = answer["usage"]["prompt_tokens"] // EngineConfig.model_fields["block_size"].default
    assert filled >= 2
    # The engine core publishes a step's events as the step ends: the answer may come first.
    wait_for(lambda: stored_blocks(server) - before >= filled, timeout=10, interval=0.2, what="the events")
    assert stored_blocks(server) - before == filled


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


#: ``serve --drain-timeout``'s default, the module's server's.
DRAIN_TIMEOUT_S = 30
#: A clean stop: SIGTERM to exit, nothing in flight (the drain gate's 5 s of closing connections included).
CLEAN_STOP_S = 15


# Last in the module: it stops the module's server (which the module's teardown would SIGTERM anyway).
def test_sigterm_with_nothing_in_flight_exits_0_quickly_and_logs_no_error(
    server: EngineServer, record_property: Callable[[str, object], None]
) -> None:
    # Served a request first, so vLLM's output handler runs (it starts on the first request): a stop
    # used to end in its EngineDeadError traceback at ERROR.
    assert completion(server, prompt(4), 2)["usage"]["completion_tokens"] == 2
    offset = server.log_size()
    signalled_at = time.monotonic()
    exit_code = server.terminate(timeout=CLEAN_STOP_S)
    stopped_in = time.monotonic() - signalled_at
    record_property("clean_stop_s", round(stopped_in, 1))
    output = server.output_since(offset)
    assert exit_code == 0, output
    assert not error_lines(output), output
    # vLLM's own shutdown ran after the drain gate's, with what the gate left of the 30 s drain timeout.
    left = re.search(r"\[shutdown\] MPClient: start timeout=([0-9.]+)s", output)
    assert left is not None, output
    assert DRAIN_TIMEOUT_S - CLEAN_STOP_S < float(left[1]) <= DRAIN_TIMEOUT_S - CLOSE_CONNECTIONS_S, output
