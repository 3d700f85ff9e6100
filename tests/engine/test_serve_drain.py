"""Graceful drain: SIGTERM lets in-flight requests finish, refuses new ones, then the engine exits 0.

The simulated device stands for Llama 3.1 8B on one Inferentia2 chip with the
real clock, so each decode step takes the cost model's ~27 ms and a 150-token
reply is still streaming when the signal arrives. The server compiles its
artifact on start (``--compile-on-start``) into an empty store.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from engine_server import EngineServer, ServerPool, write_engine_config

from neuronfleet.devcluster.waiting import wait_for
from neuronfleet.engine.hardware import get_instance_type
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.model_shapes import get_shape

MODEL = "meta-llama/Llama-3.1-8B"
MAX_TOKENS = 150


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


def test_the_simulated_decode_step_is_slow_enough_to_interrupt() -> None:
    cost = CostModel(get_instance_type("inf2.xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=2)
    assert 0.02 < cost.decode_seconds(1, 100) < 0.04


def test_sigterm_finishes_the_generation_in_flight_then_exits_0(server: EngineServer) -> None:
    body = {
        "model": MODEL,
        "prompt": "bada bade badi",
        "max_tokens": MAX_TOKENS,
        "stream_options": {"include_usage": True},
    }
    events: list[dict[str, Any]] = []
    first_token = threading.Event()
    failure: list[BaseException] = []

    def read_stream() -> None:
        try:
            for event in server.stream("/v1/completions", body):
                events.append(event)
                first_token.set()
        except BaseException as error:  # reported by the test thread below
            failure.append(error)
            first_token.set()

    reader = threading.Thread(target=read_stream)
    reader.start()
    assert first_token.wait(60), f"no token streamed within 60 s:\n{server.log_tail()}"
    signalled_at = time.monotonic()
    server.process.send_signal(15)

    # New work is refused with 503 and Retry-After while the request in flight drains.
    refused = wait_for(
        lambda: server.post("/v1/completions", {"model": MODEL, "prompt": "bada", "max_tokens": 2}),
        lambda response: response.status != 200,
        timeout=10,
        what="a new request refused",
        show=lambda response: response.status,
    )
    assert refused.status == 503, refused.body
    assert refused.headers["retry-after"] == "1"
    assert "draining" in refused.json()["error"]["message"]
    ready = server.request("/ready")
    assert (ready.status, ready.json()["reason"]) == (503, "draining")

    reader.join(120)
    assert not reader.is_alive(), "the stream did not end within 120 s of SIGTERM"
    assert not failure, failure
    assert events[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    text = "".join(choice["text"] for event in events for choice in event["choices"])
    assert len(text.split()) == MAX_TOKENS
    # It was cut short of nothing: most of the reply streamed after the signal.
    assert time.monotonic() - signalled_at > 1.0
    assert server.terminate(timeout=90) == 0
