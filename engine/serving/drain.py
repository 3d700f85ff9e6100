"""The drain gate: from SIGTERM on, new POSTs get 503 and the ones admitted before run to completion.

vLLM's own shutdown first closes the API server's renderer (tokenizer) pool and
only then tells the engine core to drain, so a request that reaches the server
in between fails with 500 (``cannot schedule new futures after shutdown``), and
one that reaches the engine core while it drains is dropped. The gate closes
that window: it is shut, under the same lock that admits requests, before
vLLM's shutdown starts, and vLLM's shutdown runs only once every request the
gate admitted has finished (or the drain timeout has passed). So each POST is
either served in full or refused with 503 and ``Retry-After``.

The gate is plain threading: requests are admitted on the server's event loop,
the drain waits on the thread vLLM runs its shutdown in.
"""

from __future__ import annotations

import threading
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

#: Seconds a client is asked to wait before retrying a request refused while draining.
DRAINING_RETRY_AFTER_S = 1


class DrainGate:
    """Counts the requests admitted, and refuses new ones once the drain has begun."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._draining = False
        self._active = 0

    @property
    def draining(self) -> bool:
        """Whether the drain has begun."""
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
        """Refuse new requests, wait up to ``timeout`` s for the admitted ones; the seconds left of it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            self._draining = True
            self._changed.wait_for(lambda: self._active == 0, timeout)
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


class DrainGateMiddleware:
    """ASGI middleware: every POST passes the gate, and holds it until its response (streamed or not) is sent."""

    def __init__(self, app: ASGIApp, gate: DrainGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse, or serve and count, one HTTP request."""
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        if not self.gate.admit():
            await draining_response()(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.release()
