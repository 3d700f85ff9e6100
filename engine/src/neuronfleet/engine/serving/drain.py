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

Once the gate has drained, the listener closes (:func:`close_listeners`), before vLLM's
own shutdown: left open, it would take connections nobody answers any more, and reset them
when the process exits. It closes without resetting any: it first stops taking new
connections (a refused or retried connect), then answers those already queued (503), then
stops listening. So a client sees each request served, refused with 503, or its connection
refused: never a reset.

The gate is plain threading: requests are admitted on the server's event loop,
the drain waits on the thread vLLM runs its shutdown in.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

#: Seconds a client is asked to wait before retrying a request refused while draining.
DRAINING_RETRY_AFTER_S = 1
#: Seconds from SIGTERM during which requests are still served, each answer closing its connection.
CLOSE_CONNECTIONS_S = 5.0
CONNECTION_CLOSE = (b"connection", b"close")


class DrainGate:
    """Counts the requests admitted; on drain, closes connections for a while, then refuses new requests."""

    def __init__(
        self, close_connections_s: float = CLOSE_CONNECTIONS_S, on_count: Callable[[int], None] = lambda _: None
    ) -> None:
        self._changed = threading.Condition()
        self.close_connections_s = close_connections_s
        #: Told each new count of admitted requests, under the gate's lock (so in order).
        self.on_count = on_count
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
            self.on_count(self._active)
            return True

    def release(self) -> None:
        """An admitted request has finished."""
        with self._changed:
            self._active -= 1
            self.on_count(self._active)
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


#: Seconds a listener that takes no new connections still completes the handshakes it began
#: (a round trip: microseconds on loopback, milliseconds across a network).
HANDSHAKE_GRACE_S = 0.2
#: Seconds at most to wait for the server to accept the connections queued on its listener.
ACCEPT_QUEUE_WAIT_S = 2.0
#: ``SO_ATTACH_FILTER`` (Linux ``<asm-generic/socket.h>``): a classic BPF program run on every packet a socket gets.
SO_ATTACH_FILTER = 26
#: From the TCP header (where a socket filter starts): drop a segment with SYN set and ACK not (a new
#: connection's first), pass the rest (handshakes under way, data on accepted connections).
_DROP_NEW_CONNECTIONS = (
    (0x30, 0, 0, 13),  # ldb [13]: the flags
    (0x54, 0, 0, 0x12),  # and #(SYN | ACK)
    (0x15, 0, 1, 0x02),  # jeq #SYN: drop; else pass
    (0x06, 0, 0, 0),  # ret #0: drop
    (0x06, 0, 0, 0xFFFFFFFF),  # ret #-1: pass it whole
)
#: ``struct tcp_info``'s ``tcpi_unacked``: on a listener, the connections queued for ``accept``.
_TCPI_UNACKED_OFFSET = 24


def stop_taking_connections(listener: socket.socket) -> None:
    """Drop new connections' SYNs on ``listener`` (Linux only): the client retries its connect a second later."""
    program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *op) for op in _DROP_NEW_CONNECTIONS))
    listener.setsockopt(
        socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("HL", len(_DROP_NEW_CONNECTIONS), ctypes.addressof(program))
    )


def accept_queue(listener: socket.socket) -> int:
    """Connections established on ``listener`` and not accepted yet."""
    info = listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCPI_UNACKED_OFFSET + 4)
    queued: int = struct.unpack_from("I", info, _TCPI_UNACKED_OFFSET)[0]
    return queued


async def close_listeners(servers: Sequence[asyncio.Server]) -> None:
    """Stop ``servers`` listening without resetting a connection, each one answered or refused.

    Closing a listener resets the connections queued on it, which their clients count as
    established (a request sent, then ``Connection reset by peer``). So the listener first
    drops new connections' SYNs and finishes the handshakes under way, the server accepts
    and answers what is queued, and only then does it stop listening: a client retrying its
    connect is refused. ``shutdown`` stops the socket listening whatever else holds it
    (vLLM keeps its own handle until the process ends). Off Linux the listener just closes.
    """
    handles = [socket.socket(fileno=os.dup(sock.fileno())) for server in servers for sock in server.sockets]
    listeners = [handle for handle in handles if handle.family in (socket.AF_INET, socket.AF_INET6)]
    try:
        if sys.platform == "linux":
            try:
                for listener in listeners:
                    stop_taking_connections(listener)
            except PermissionError:
                # A container's seccomp profile may refuse socket filters: then a connection made in the
                # moment between the queue emptying and the close is reset, as without this function.
                logger.info("draining: no socket filter allowed here; the listener closes once its queue is empty")
            await asyncio.sleep(HANDSHAKE_GRACE_S)
            deadline = time.monotonic() + ACCEPT_QUEUE_WAIT_S
            while any(map(accept_queue, listeners)) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        for server in servers:
            server.close()
        for listener in listeners:
            listener.shutdown(socket.SHUT_RDWR)
    finally:
        for handle in handles:
            handle.close()
