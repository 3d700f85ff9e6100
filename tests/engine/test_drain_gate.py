"""The drain gate on its own: admission, the wait for admitted requests, the 503 answer.

Its hook into vLLM's shutdown is tested only through vLLM's real server, on both vLLM versions:
the drain under load in ``test_serve_drain.py``, a stop with nothing in flight at the end of
``test_serve_sim.py``.
"""

from __future__ import annotations

import threading
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from neuronfleet.engine.serving.drain import DrainGate, DrainGateMiddleware

pytestmark = pytest.mark.vllm_matrix


def test_the_drain_refuses_new_requests_and_waits_for_the_admitted_ones() -> None:
    gate = DrainGate(close_connections_s=0)
    assert gate.admit()
    left: list[float] = []
    drain = threading.Thread(target=lambda: left.append(gate.drain(30)))
    drain.start()
    while gate.admit():  # until the drain has begun
        gate.release()
    assert gate.draining
    assert drain.is_alive(), "the drain ended with a request still admitted"
    gate.release()
    drain.join(10)
    assert not drain.is_alive()
    assert 0 < left[0] <= 30
    assert gate.active == 0


def test_the_drain_gives_up_at_its_timeout() -> None:
    gate = DrainGate()
    assert gate.admit()
    assert gate.drain(0.05) == 0.0
    assert (gate.draining, gate.active) == (True, 1)


def test_a_drain_with_nothing_admitted_leaves_all_but_the_closing_time() -> None:
    assert DrainGate(close_connections_s=0).drain(30) > 29
    assert 24 < DrainGate(close_connections_s=5).drain(30) <= 25


def test_the_drain_first_admits_for_a_while_closing_each_connection() -> None:
    gate = DrainGate(close_connections_s=0.5)
    drain = threading.Thread(target=gate.drain, args=(30,))
    drain.start()
    while not gate.closing:
        time.sleep(0.001)
    # Closing: still admitted (kept-alive clients get their answer), not yet refused.
    assert gate.admit()
    assert not gate.draining
    gate.release()
    drain.join(10)
    assert (gate.closing, gate.draining, gate.admit()) == (True, True, False)


def echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(request.method)


def test_the_middleware_refuses_posts_with_503_and_retry_after_once_draining() -> None:
    gate = DrainGate()
    app = Starlette(routes=[Route("/", echo, methods=["GET", "POST"])])
    app.add_middleware(DrainGateMiddleware, gate=gate)
    with TestClient(app) as client:
        assert client.post("/").text == "POST"
        assert gate.active == 0, "an answered request must leave the gate"
        assert "connection" not in client.post("/").headers
        gate.drain(0)
        refused = client.post("/")
        # The refusal closes the connection too: the client's next request opens a new one.
        assert refused.headers["connection"] == "close"
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == 503
        assert "draining" in refused.json()["error"]["message"]
        # Reads still work: health checks and metrics during the drain.
        assert client.get("/").text == "GET"
