"""The drain gate on its own: admission, the wait for admitted requests, the 503 answer; the listener's close.

Its hook into vLLM's shutdown is tested only through vLLM's real server, on both vLLM versions:
the drain under load in ``test_serve_drain.py``, a stop with nothing in flight at the end of
``test_serve_sim.py``.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from neuronfleet.engine.serving.drain import (
    DrainGate,
    DrainGateMiddleware,
    accept_queue,
    close_listeners,
    stop_taking_connections,
)

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


def test_a_listener_that_stops_taking_connections_still_serves_those_it_has() -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=8) as listener:
        address = listener.getsockname()
        with socket.create_connection(address) as established, socket.create_connection(address) as queued:
            accepted, _ = listener.accept()
            assert accept_queue(listener) == 1, "the second connection is established, not accepted yet"
            stop_taking_connections(listener)
            with socket.socket() as late:
                late.settimeout(0.3)
                # Its SYN is dropped: the connect is retried later (and refused once closed), never reset.
                with pytest.raises(TimeoutError):
                    late.connect(address)
            established.sendall(b"a")
            assert accepted.recv(1) == b"a"
            second, _ = listener.accept()
            queued.sendall(b"b")
            assert second.recv(1) == b"b"
            assert accept_queue(listener) == 0
            accepted.close()
            second.close()


def test_closed_listeners_refuse_connections_though_another_handle_stays_open() -> None:
    async def close_and_connect() -> None:
        server = await asyncio.start_server(lambda _reader, writer: writer.close(), "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        # vLLM's launcher keeps its own handle on the listening socket until the process exits.
        with socket.socket(fileno=os.dup(server.sockets[0].fileno())):
            socket.create_connection(address).close()
            await close_listeners([server])
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(address, timeout=5)

    asyncio.run(close_and_connect())
