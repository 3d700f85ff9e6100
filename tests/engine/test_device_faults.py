"""A device that fails under a running engine: faults injected into the simulated device at run time.

The simulated device stands for Llama 3.1 8B on one Inferentia2 chip with the real clock (about 27 ms
a decode step), so a 200-token reply is still streaming when the fault comes. The tests run in order
on one server: a slow device first (nothing fails, every step takes longer), then an uncorrectable
HBM error, which stops the engine as a real Neuron runtime error does, and the server with it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from harness.engine_server import REQUEST_TIMEOUT_S, EngineServer, ServerPool, write_engine_config
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from neuronfleet.contract.faults import DEVICE_FAULT_PREFIX, TERMINATION_LOG_ENV, parse_termination_message
from neuronfleet.contract.metrics import REQUESTS_IN_FLIGHT
from neuronfleet.contract.names import REPLICA_ENV, REPLICA_HEADER
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.engine.serving.readiness import RUNTIME_ERROR_EXIT
from neuronfleet.engine.sim.faults import FAULTS_PATH

pytestmark = pytest.mark.vllm_matrix

MODEL = "meta-llama/Llama-3.1-8B"
REPLICA = "llama-6f9d8-faulty"
#: Long enough to be streaming when the fault is injected (about 5 s of decode steps).
LONG_TOKENS = 200
HBM_ERROR = "NRT_EXEC_HW_ERR_HBM_UE (1201)"


@pytest.fixture(scope="module")
def server(servers: ServerPool, tmp_path_factory: pytest.TempPathFactory) -> EngineServer:
    directory = tmp_path_factory.mktemp("engine")
    config = write_engine_config(
        directory, max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024, tensor_parallel_size=2
    )
    termination_log = directory / "termination-log"
    server = servers.start(
        *("--config", str(config), "--device", "sim", "--model", f"hf://{MODEL}"),
        *("--target", "inf2", "--instance-type", "inf2.xlarge"),
        *("--artifact-store", str(directory / "store"), "--compile-on-start"),
        env={REPLICA_ENV: REPLICA, TERMINATION_LOG_ENV: str(termination_log)},
    )
    server.extra["termination_log"] = termination_log
    return server


def complete(server: EngineServer, max_tokens: int) -> dict[str, Any]:
    response = server.post("/v1/completions", {"model": MODEL, "prompt": "hello there", "max_tokens": max_tokens})
    assert response.status == 200, response.body
    answer: dict[str, Any] = response.json()
    return answer


def decode_seconds_per_step(server: EngineServer) -> tuple[float, float]:
    """Device seconds spent decoding, and decode steps run, so far."""
    samples = server.metrics()
    seconds = steps = 0.0
    for (name, labels), value in samples.items():
        if name == "neuronfleet:device_busy_seconds_total" and ("kind", "decode") in labels:
            seconds += value
        elif name == "neuronfleet:decode_steps_total":
            steps += value
    return seconds, steps


def inject(server: EngineServer, fault: dict[str, Any]) -> None:
    response = server.post(FAULTS_PATH, fault)
    assert response.status == 200, response.body


def test_an_unknown_fault_is_refused_with_the_statuses_known(server: EngineServer) -> None:
    response = server.post(FAULTS_PATH, {"kind": "error", "status": "NRT_EXEC_BAD_INPUT"})
    assert response.status == 400
    assert "NRT_EXEC_HW_ERR_HBM_UE (1201)" in response.json()["error"]["message"]


def test_a_slow_device_takes_three_times_as_long_per_step_and_fails_nothing(server: EngineServer) -> None:
    # A single request of the same length each time: every decode step is the same graph, batch 1.
    complete(server, 20)
    seconds, steps = decode_seconds_per_step(server)
    complete(server, 20)
    healthy_seconds, healthy_steps = decode_seconds_per_step(server)
    inject(server, {"kind": "slow", "factor": 3})
    answer = complete(server, 20)
    slow_seconds, slow_steps = decode_seconds_per_step(server)
    inject(server, {"kind": "slow", "factor": 1})
    assert answer["usage"]["completion_tokens"] == 20
    healthy = (healthy_seconds - seconds) / (healthy_steps - steps)
    slow = (slow_seconds - healthy_seconds) / (slow_steps - healthy_steps)
    assert slow / healthy == pytest.approx(3.0, rel=1e-6)


class Held(threading.Thread):
    """A long completion, streamed or not, sent on its own thread and read to its end."""

    def __init__(self, server: EngineServer, stream: bool) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.stream = stream
        self.status = 0
        self.headers: dict[str, str] = {}
        self.events: list[dict[str, Any]] = []
        self.body = b""
        self.error: str | None = None

    def run(self) -> None:
        body = {"model": MODEL, "prompt": "tell me a story", "max_tokens": LONG_TOKENS, "stream": self.stream}
        url = self.server.url("/v1/completions")
        try:
            with httpx.stream("POST", url, json=body, timeout=REQUEST_TIMEOUT_S) as response:
                self.status, self.headers = response.status_code, dict(response.headers)
                if not self.stream:
                    self.body = response.read()
                    return
                for line in response.iter_lines():
                    payload = line.strip().removeprefix("data: ")
                    if payload and payload != "[DONE]":
                        self.events.append(json.loads(payload))
        except httpx.HTTPError as error:
            self.error = f"{type(error).__name__}: {error}"

    @property
    def tokens(self) -> int:
        """Tokens streamed."""
        return sum(1 for event in self.events if event.get("choices"))


def in_flight(server: EngineServer) -> float:
    return sum(v for (name, _), v in server.metrics().items() if name == REQUESTS_IN_FLIGHT)


def test_a_device_fault_fails_what_the_engine_held_refuses_the_rest_and_says_why(server: EngineServer) -> None:
    held = [Held(server, stream=True), Held(server, stream=False)]
    for request in held:
        request.start()
    wait_for(lambda: in_flight(server) == 2, timeout=60, interval=0.05, what="both completions held by the engine")
    inject(server, {"kind": "error", "status": "NRT_EXEC_HW_ERR_HBM_UE"})
    for request in held:
        request.join(60)
        assert not request.is_alive(), "a held completion did not end"
    streamed, whole = held
    try:
        after = server.post("/v1/completions", {"model": MODEL, "prompt": "hello", "max_tokens": 2})
    except (httpx.NetworkError, httpx.RemoteProtocolError):
        # The server had stopped listening already, or closed the connection, before or after reading the request.
        after = None
    exit_code = server.managed.wait(60)

    # The streamed completion ends short of its length; the other is answered 503 with the fault, by name.
    assert streamed.status == 200
    assert streamed.tokens < LONG_TOKENS, (streamed.error, streamed.events[-2:])
    assert whole.status == 503, whole.body
    assert HBM_ERROR in json.loads(whole.body)["error"]["message"]
    for answered in (streamed, whole):
        assert answered.headers[REPLICA_HEADER] == REPLICA
    # A request sent after the fault is refused, with the fault, or finds the server gone.
    if after is not None:
        assert after.status == 503, after.body
        assert HBM_ERROR in after.json()["error"]["message"]
    # The engine's last word, where Kubernetes keeps it, says what the operator must do: replace the replica.
    message = server.extra["termination_log"].read_text()
    assert message.startswith(DEVICE_FAULT_PREFIX + HBM_ERROR), message
    status = parse_termination_message(message)
    assert status is not None
    assert status.device_fault
    assert exit_code == RUNTIME_ERROR_EXIT, server.log_tail()
    assert f"{DEVICE_FAULT_PREFIX}{HBM_ERROR}" in server.log.read_text()
    # And the count of faults, by status, in the metrics files the engine core wrote.
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(server.log.parent / "metrics"))  # type: ignore[no-untyped-call]
    faults = {
        (sample.labels["status"], sample.labels["device_fault"]): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "neuronfleet:device_faults_total"
    }
    assert faults == {("NRT_EXEC_HW_ERR_HBM_UE", "true"): 1.0}
