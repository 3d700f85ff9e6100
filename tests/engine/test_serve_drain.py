"""Graceful drain: SIGTERM lets in-flight requests finish, refuses new ones, then the engine exits 0.

The simulated device stands for Llama 3.1 8B on one Inferentia2 chip with the
real clock, so each decode step takes the cost model's ~27 ms and a 150-token
reply is still streaming when the signal arrives. Meanwhile clients keep sending
small requests, from before the signal until the server stops listening, and
every outcome is checked: served in full, or refused with 503 and Retry-After;
only once the last of them is served may a connection be refused (the listener
is closed). The server compiles its artifact on start (``--compile-on-start``)
into an empty store. It runs on both supported vLLM versions (``make compat``):
the gate hooks into vLLM's shutdown, whose internals differ between them.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from harness.engine_server import START_TIME_SCALE, EngineServer, ServerPool, error_lines, write_engine_config

from neuronfleet.contract import metrics
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.contract.start_time import predict_start
from neuronfleet.engine.sim.cost_model import CostModel

pytestmark = pytest.mark.vllm_matrix

MODEL = "meta-llama/Llama-3.1-8B"
MAX_TOKENS = 150
#: Clients sending new requests through the drain, each one request at a time.
BURST_THREADS = 8
#: Tokens each of their requests asks for.
BURST_TOKENS = 2
#: The burst is bounded: at most this many requests in all.
MAX_BURST = 10_000
#: The in-flight reply takes seconds to finish: the burst is refused many times over meanwhile.
MIN_REFUSED = 20


@pytest.fixture(scope="module")
def server(servers: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> EngineServer:
    directory = tmp_path_factory.mktemp("engine")
    config = write_engine_config(
        directory,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        max_model_len=1024,
        tensor_parallel_size=2,
    )
    server = servers.start(
        "--config",
        str(config),
        "--device",
        "sim",
        "--model",
        f"hf://{MODEL}",
        "--target",
        "inf2",
        "--instance-type",
        "inf2.xlarge",
        "--drain-timeout",
        "60",
        "--artifact-store",
        str(directory / "store"),
        "--compile-on-start",
    )
    server.extra["store"] = directory / "store"
    return server


def test_the_artifact_was_compiled_on_start(server: EngineServer) -> None:
    ready = server.request("/ready").json()
    assert ready["model"] == MODEL
    manifest = json.loads((server.extra["store"] / ready["artifact"] / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    assert [(entry["kind"], entry["size"]) for entry in manifest["buckets"]] == [
        ("prefill", 128),
        ("prefill", 256),
        ("prefill", 512),
        ("decode", 1),
        ("decode", 2),
        ("decode", 4),
    ]


def test_the_replica_spends_a_neuron_replicas_start_time_scaled_as_the_tests_ask(server: EngineServer) -> None:
    """The harness sets a start time scale of 1/100: each phase is the model's figure for Llama 3.1 8B times
    that, published by phase and logged. The artifact carries the weights pre-sharded, so the replica reads them
    from the store (a mounted volume) and shards nothing, never fetching the checkpoint from the Hub."""
    weights = CostModel(get_instance_type("inf2.xlarge"), get_shape("llama-3.1-8b"), 2).weight_bytes
    modelled = predict_start(weights, "pvc", graphs_bytes=1, warmup_s=0.0, presharded=True)
    series = [
        (dict(labels), value)
        for (name, labels), value in server.metrics().items()
        if name == metrics.REPLICA_START_SECONDS
    ]
    assert {(labels["weights_from"], labels["weights"]) for labels, _ in series} == {("pvc", "shards")}
    spent = {labels["phase"]: value for labels, value in series}
    assert spent.keys() == set(modelled.phases())
    for phase in ("fetch", "load"):
        assert spent[phase] == pytest.approx(modelled.phases()[phase] * START_TIME_SCALE, rel=1e-6), phase
    assert spent["shard"] == 0.0
    assert spent["graphs"] > 0, "the compiled graphs are loaded"
    assert spent["warmup"] > 0, "every compiled graph runs once"
    # From the Hub, sharded on load, the same replica takes over twice as long.
    from_hub = predict_start(weights, "hf", graphs_bytes=1, warmup_s=0.0)
    assert from_hub.total_s > 2 * modelled.total_s
    assert (
        "Replica start, as a Neuron replica of llama-3.1-8b from pvc (weights pre-sharded) takes"
        in server.log.read_text()
    )


def test_the_replica_publishes_the_prefill_rate_its_warm_up_timed(server: EngineServer) -> None:
    """What KEDA's prefill backlog divides by: the fastest prefill bucket's tokens a second (the largest, here)."""
    cost = CostModel(get_instance_type("inf2.xlarge"), get_shape("llama-3.1-8b"), 2)
    published = {name: value for (name, _), value in server.metrics().items()}
    assert published[metrics.PREFILL_TOKENS_PER_SECOND] == pytest.approx(512 / cost.prefill_seconds(512, 0), rel=1e-6)
    assert 512 / cost.prefill_seconds(512, 0) > 128 / cost.prefill_seconds(128, 0), "a small bucket pays fixed costs"


def test_the_simulated_decode_step_is_slow_enough_to_interrupt() -> None:
    cost = CostModel(get_instance_type("inf2.xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=2)
    assert 0.02 < cost.decode_seconds(1, 100) < 0.04


#: What a refused connection says (``ECONNREFUSED``): the one transport error excused, once the listener is closed.
CONNECTION_REFUSED = "Connection refused"


@dataclass(frozen=True)
class Outcome:
    """What one request sent during the drain got: a response (its body parsed if it is JSON), or a transport error."""

    started_at: float
    ended_at: float
    status: int | None = None
    retry_after: str | None = None
    body: Any = None
    error: str | None = None

    def kind(self) -> str:
        """A short name to count outcomes by."""
        if served_in_full(self):
            return "served in full"
        if refused_for_the_drain(self):
            return "refused: 503, Retry-After"
        if self.status is None:
            return f"no response: {self.error}"
        return f"{self.status}: {str(self.body)[:120]}"


class Burst:
    """Threads that POST small completions, one new connection each, until the server stops listening.

    Every request sent is counted before it is sent and recorded once it ends, whatever it got; a worker
    thread that fails for any other reason records its exception, so no outcome goes missing unseen.
    """

    def __init__(self, server: EngineServer) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.sent = 0
        self.outcomes: list[Outcome] = []
        self.failures: list[BaseException] = []
        self.first_served = threading.Event()
        self.first_refusal = threading.Event()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._post_until_stopped) for _ in range(BURST_THREADS)]

    def __enter__(self) -> Burst:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    @property
    def running(self) -> int:
        """Worker threads still alive."""
        return sum(thread.is_alive() for thread in self.threads)

    def _post_until_stopped(self) -> None:
        try:
            body = {"model": MODEL, "prompt": "bada", "max_tokens": BURST_TOKENS}
            # No keep-alive: every request is a new connection, as from many clients.
            with httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as client:
                while not self.stop.is_set():
                    with self.lock:
                        if self.sent >= MAX_BURST:
                            return
                        self.sent += 1
                    outcome = self._post(client, body)
                    with self.lock:
                        self.outcomes.append(outcome)
                    if connection_refused(outcome):
                        return  # the listener is closed: the server is exiting
        except BaseException as error:  # reported by the test
            with self.lock:
                self.failures.append(error)

    def _post(self, client: httpx.Client, body: dict[str, Any]) -> Outcome:
        started_at = time.monotonic()
        try:
            response = client.post(self.server.url("/v1/completions"), json=body)
        except httpx.TransportError as error:
            return Outcome(started_at, time.monotonic(), error=f"{type(error).__name__}: {error}")
        ended_at = time.monotonic()
        try:
            answer: Any = response.json()
        except ValueError:
            answer = response.text
        outcome = Outcome(started_at, ended_at, response.status_code, response.headers.get("retry-after"), answer)
        if served_in_full(outcome):
            self.first_served.set()
        elif refused_for_the_drain(outcome):
            self.first_refusal.set()
        return outcome


def served_in_full(outcome: Outcome) -> bool:
    """A 200 completion run to its last token (not aborted); any other body, malformed included, is not."""
    if outcome.status != 200 or not isinstance(outcome.body, dict):
        return False
    choices, usage = outcome.body.get("choices"), outcome.body.get("usage")
    return (
        isinstance(choices, list)
        and len(choices) == 1
        and isinstance(choices[0], dict)
        and choices[0].get("finish_reason") == "length"
        and isinstance(choices[0].get("text"), str)
        and len(choices[0]["text"].split()) == BURST_TOKENS
        and isinstance(usage, dict)
        and usage.get("completion_tokens") == BURST_TOKENS
    )


def refused_for_the_drain(outcome: Outcome) -> bool:
    """503, ``Retry-After: 1``, and the reason in an OpenAI-style error body."""
    if outcome.status != 503 or outcome.retry_after != "1" or not isinstance(outcome.body, dict):
        return False
    error = outcome.body.get("error")
    return isinstance(error, dict) and error.get("code") == 503 and "draining" in str(error.get("message"))


def connection_refused(outcome: Outcome) -> bool:
    """No response because the connection was refused: nothing listens on the port any more."""
    return (
        outcome.error is not None and outcome.error.startswith("ConnectError") and CONNECTION_REFUSED in outcome.error
    )


def test_sigterm_finishes_the_generation_in_flight_then_exits_0(
    server: EngineServer, record_property: Callable[[str, object], None]
) -> None:
    body = {
        "model": MODEL,
        "prompt": "bada bade badi",
        "max_tokens": MAX_TOKENS,
        "stream_options": {"include_usage": True},
    }
    events: list[dict[str, Any]] = []
    #: When each event arrived, taken on the reader's thread (the test's thread may learn of the end later).
    arrivals: list[float] = []
    first_token = threading.Event()
    failure: list[BaseException] = []

    def read_stream() -> None:
        try:
            for event in server.stream("/v1/completions", body):
                arrivals.append(time.monotonic())
                events.append(event)
                first_token.set()
        except BaseException as error:  # reported by the test thread below
            failure.append(error)
            first_token.set()

    reader = threading.Thread(target=read_stream)
    reader.start()
    assert first_token.wait(60), f"no token streamed within 60 s:\n{server.log_tail()}"

    # Clients keep sending new requests through the signal until the process exits, as during a rollout:
    # each is served in full (it reached the server before the drain began) or refused with 503 and
    # Retry-After while the requests in flight drain.
    with Burst(server) as burst:
        assert burst.first_served.wait(60), f"no burst request served within 60 s:\n{server.log_tail()}"
        log_at_signal = server.log_size()
        signalled_at = time.monotonic()
        server.process.send_signal(15)
        assert burst.first_refusal.wait(10), f"no request refused within 10 s of SIGTERM:\n{server.log_tail()}"
        ready = server.request("/ready")
        assert (ready.status, ready.json()["reason"]) == (503, "draining")
        reader.join(120)
        assert not reader.is_alive(), "the stream did not end within 120 s of SIGTERM"
        exit_code = server.process.wait(90)
    # Every request sent has its outcome recorded: no worker thread died or hung with one in hand.
    assert burst.running == 0, "a burst thread still runs a minute after the server exited"
    assert not burst.failures, f"a burst thread failed: {burst.failures[0]!r}"
    assert not failure, failure
    stream_ended_at = arrivals[-1]
    outcomes = burst.outcomes
    assert burst.sent == len(outcomes), f"{burst.sent} requests sent, {len(outcomes)} outcomes recorded"
    counts = Counter(outcome.kind() for outcome in outcomes)
    # In flight at the signal: the stream, and the burst requests sent before it that ended after it.
    in_flight = [o for o in outcomes if o.started_at < signalled_at < o.ended_at]
    summary = (
        f"{len(outcomes) + 1} requests sent around the drain, {len(in_flight) + 1} in flight at SIGTERM: "
        f"the stream, and {dict(counts)}"
    )
    record_property("drain_outcomes", summary)
    # For 5 s after the signal the gate still admits: whatever was sent before it is served in full.
    early = [o for o in outcomes if o.started_at < signalled_at and not served_in_full(o)]
    assert not early, f"{summary}; sent before SIGTERM and not served in full: {early[0]}"
    # Once the last request in flight is done the server closes its listener: only then may a connection
    # fail, and only by being refused (nothing listens any more).
    last_served_at = max([stream_ended_at, *(o.ended_at for o in outcomes if served_in_full(o))])
    unexpected = [
        o
        for o in outcomes
        if not (
            served_in_full(o) or refused_for_the_drain(o) or (connection_refused(o) and o.ended_at > last_served_at)
        )
    ]
    assert not unexpected, (
        f"{summary}; the first unexpected, {unexpected[0].ended_at - signalled_at:.3f} s after SIGTERM "
        f"(the last served: {last_served_at - signalled_at:.3f} s): {unexpected[0]}"
    )
    assert sum(map(refused_for_the_drain, outcomes)) >= MIN_REFUSED, summary

    assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    text = "".join(choice["text"] for event in events for choice in event["choices"])
    assert len(text.split()) == MAX_TOKENS
    # It was cut short of nothing: most of the reply streamed after the signal.
    assert stream_ended_at - signalled_at > 1.0
    assert exit_code == 0, server.log_tail()
    # A drain is a clean stop: nothing at ERROR, no traceback (vLLM's output handler used to log one).
    assert not error_lines(server.output_since(log_at_signal)), server.output_since(log_at_signal)
