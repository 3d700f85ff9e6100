"""The drain gate: from SIGTERM on, connections close after each answer, then new POSTs get 503 while
the ones admitted before run to completion.

vLLM's own shutdown first closes the API server's renderer (tokenizer) pool and
only then tells the engine core to drain, so a request that reaches the server
in between fails with 500 (``cannot schedule new futures after shutdown``), and
one that reaches the engine core while it drains is dropped. The gate closes
that window: it is shut, under the same lock that admits requests, before
vLLM's shutdown starts, and vLLM's shutdown runs only once every request the
gate admitted has finished (or the drain timeout has passed). So each POST is
either served in full or refused with 503 and ``Retry-After``.

Before it shuts, the gate lingers: for :data:`CLOSE_CONNECTIONS_S` it still admits
requests, but every answer carries ``Connection: close``. A Service's endpoints
stop naming a deleted pod within a second or so, yet a client's kept-alive
connection stays pinned to it (kube-proxy's NAT is per connection); answered
with ``Connection: close``, the client's next request opens a new connection,
which goes to another replica, instead of meeting the 503.

The gate is plain threading: requests are admitted on the server's event loop,
the drain waits on the thread vLLM runs its shutdown in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Seconds a client is asked to wait before retrying a request refused while draining.
DRAINING_RETRY_AFTER_S = 1
#: Seconds from SIGTERM during which requests are still served, each answer closing its connection.
CLOSE_CONNECTIONS_S = 5.0
CONNECTION_CLOSE = (b"connection", b"close")


class DrainGate:
    """Counts the requests admitted; on drain, closes connections for a while, then refuses new requests."""

    def __init__(self, close_connections_s: float = CLOSE_CONNECTIONS_S) -> None:
        self._changed = threading.Condition()
        self.close_connections_s = close_connections_s
        self._closing = False
        self._draining = False
        self._active = 0

    @property
    def closing(self) -> bool:
        """Whether the drain has begun: every answer closes its connection."""
        return self._closing

    @property
    def draining(self) -> bool:
        """Whether new requests are refused."""
        return self._draining

    @property
    def active(self) -> int:
        """Requests admitted and not yet finished."""
        return self._active

    def admit(self) -> bool:
        """Admit a request (the caller must :meth:`release` it), unless the drain has begun."""
        with self._changed:
            if self._draining:
                return False
            self._active += 1
            return True

    def release(self) -> None:
        """An admitted request has finished."""
        with self._changed:
            self._active -= 1
            self._changed.notify_all()

    def drain(self, timeout: float) -> float:
        """Close connections for a while, then refuse new requests and wait for the admitted ones.

        All within ``timeout`` seconds; returns what is left of it.
        """
        deadline = time.monotonic() + timeout
        with self._changed:
            self._closing = True
        # Clients still pinned to this replica get their answers, and reconnect elsewhere after them.
        time.sleep(min(self.close_connections_s, timeout))
        with self._changed:
            self._draining = True
            self._changed.wait_for(lambda: self._active == 0, max(0.0, deadline - time.monotonic()))
        return max(0.0, deadline - time.monotonic())


def draining_response() -> JSONResponse:
    """What a request refused during the drain gets: 503, ``Retry-After``, an OpenAI-style error."""
    return JSONResponse(
        {
            "error": {
                "message": "the engine is draining for shutdown: retry on another replica",
                "type": "ServiceUnavailable",
                "code": 503,
            }
        },
        status_code=503,
        headers={"Retry-After": str(DRAINING_RETRY_AFTER_S)},
    )


def sending_header(send: Send, header: tuple[bytes, bytes], when: Callable[[], bool] = lambda: True) -> Send:
    """``send`` that adds ``header`` to a response's start whenever ``when()`` holds then."""

    async def send_with_header(message: Message) -> None:
        if message["type"] == "http.response.start" and when():
            message = {**message, "headers": [*message.get("headers", []), header]}
        await send(message)

    return send_with_header


class DrainGateMiddleware:
    """ASGI middleware: every POST passes the gate, and holds it until its response (streamed or not) is sent.

    Once the drain has begun, every response closes its connection.
    """

    def __init__(self, app: ASGIApp, gate: DrainGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or serve and count, one HTTP request."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate = self.gate
        send_closing = sending_header(send, CONNECTION_CLOSE, lambda: gate.closing)
        if scope["method"] != "POST":
            await self.app(scope, receive, send_closing)
            return
        if not gate.admit():
            await draining_response()(scope, receive, send_closing)
            return
        try:
            await self.app(scope, receive, send_closing)
        finally:
            gate.release()
