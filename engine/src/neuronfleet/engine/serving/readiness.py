"""``GET /ready``: a vLLM endpoint plugin that says which model and compiled artifact are serving.

vLLM opens its HTTP listener only after the engine core has started, and the
engine core starts only after the executor loaded the model and the compiled
artifact; before that, connections are refused. So ``/ready`` (like vLLM's
``/health``) answers only once both are loaded; it then answers 200 while the
engine is healthy and 503 once it is not, with what it serves:
``{"status": "ready", "model": ..., "device": "sim", "artifact": HASH}``. Every
HTTP response carries the artifact's hash too, in ``X-Neuronfleet-Artifact``,
and the replica's pod name, in ``X-Neuronfleet-Replica``, so a client or gateway
sees which revision and which replica answered each request.

When a step fails on the device (``neuronfleet.contract.faults``) the engine core stops, and vLLM's
server follows it within seconds. Until then every POST, and every request the engine held, is
answered 503 with the fault's own message (which the engine core left as the container's
termination message), and ``/ready`` says the same.

From SIGTERM on, ``/ready`` answers 503 and every answer closes its connection; a few seconds
later new POSTs are refused with 503 and ``Retry-After``; once the requests admitted before have
finished, the listener closes (see ``neuronfleet.engine.serving.drain``).

Registered under vLLM's ``vllm.endpoint_plugins`` entry point group; vLLM
loads endpoint plugins only when named in ``VLLM_PLUGINS``, which the serve
command sets (see ``neuronfleet.engine.serving.serve.plugin_allowlist``).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import socket
import sys
import time
from argparse import Namespace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import Gauge
from starlette.datastructures import State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from neuronfleet.contract.faults import read_termination_message
from neuronfleet.contract.metrics import REQUESTS_IN_FLIGHT
from neuronfleet.contract.names import REPLICA_ENV, REPLICA_HEADER
from neuronfleet.contract.sim_settings import DEVICE_ENV, SETTINGS_KEY
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.serving.drain import (
    ACCEPT_QUEUE_WAIT_S,
    HANDSHAKE_GRACE_S,
    DrainGate,
    DrainGateMiddleware,
    close_listeners,
    sending_header,
)
from neuronfleet.engine.serving.serve import READY_PLUGIN, SERVED_ARTIFACT_ENV
from neuronfleet.engine.sim.faults import FAULTS_PATH, InjectedFault

logger = logging.getLogger(__name__)

#: Seconds the listener's close may take (its waits, and a margin) before vLLM's shutdown goes on without it.
LISTENER_CLOSE_TIMEOUT_S = HANDSHAKE_GRACE_S + ACCEPT_QUEUE_WAIT_S + 1.0

#: The response header naming the compiled artifact that served the request.
ARTIFACT_HEADER = "x-neuronfleet-artifact"


def served_artifact() -> str | None:
    """The hash of the artifact being served (set by the serve command), or None when none was given."""
    return os.environ.get(SERVED_ARTIFACT_ENV) or None


def replica_name() -> str:
    """The name of the replica answering: its pod's, as the operator sets it, else the host's."""
    return os.environ.get(REPLICA_ENV) or socket.gethostname()


def describe(args: Namespace) -> dict[str, Any]:
    """What this server serves, from vLLM's parsed arguments."""
    served = args.served_model_name or [args.model]
    sim = (args.additional_config or {}).get(SETTINGS_KEY)
    return {
        "model": served[0] if isinstance(served, list) else served,
        "device": "sim" if sim else "neuron",
        "artifact": served_artifact(),
    }


#: One gauge per process (prometheus_client refuses a name twice).
_IN_FLIGHT: list[Gauge] = []


def requests_in_flight_gauge() -> Gauge:
    """``neuronfleet:requests_in_flight``, which the drain gate sets as it admits and releases requests.

    Set, not computed at scrape time: ``vllm serve`` runs prometheus_client in multiprocess mode, which
    exports what was written, and ``livesum`` leaves out a ``pid`` label. Live all the same: the gate
    counts on the server's event loop as requests come and go, while vLLM's own gauges change only as
    each engine step ends.
    """
    if not _IN_FLIGHT:
        _IN_FLIGHT.append(
            Gauge(
                REQUESTS_IN_FLIGHT,
                "Completions this server holds: admitted, not yet answered.",
                multiprocess_mode="livesum",
            )
        )
    return _IN_FLIGHT[0]


class ServedByMiddleware:
    """ASGI middleware: every HTTP response names the replica, and the artifact, that served it."""

    def __init__(self, app: ASGIApp, headers: list[tuple[bytes, bytes]]) -> None:
        self.app = app
        self.headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, adding the headers to its response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for header in self.headers:
            send = sending_header(send, header)
        await self.app(scope, receive, send)


def engine_stopped(state: State) -> str | None:
    """Why the engine core stopped (its termination message, else a pointer to its log); None while it runs."""
    client = getattr(state, "engine_client", None)
    if client is None or not client.errored:
        return None
    return read_termination_message() or "the engine stopped: its log says why"


def stopped_response(reason: str) -> JSONResponse:
    """What a request gets from a replica whose engine stopped: 503, OpenAI-style, with the reason."""
    error = {"message": f"this replica stopped ({reason}): retry on another replica", "type": "ServiceUnavailable"}
    return JSONResponse({"error": {**error, "code": 503}}, status_code=503)


class EngineStoppedMiddleware:
    """ASGI middleware: once the engine core has stopped, POSTs and the failures of held requests say why.

    vLLM answers the requests its dead engine held with a bare 500; a client, or its retry policy, can
    do more with a 503 that names the device fault.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse a POST at once when the engine has stopped; restate a 500 sent because it stopped."""
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        state = scope["app"].state
        reason = engine_stopped(state)
        if reason is not None:
            await stopped_response(reason)(scope, receive, send)
            return
        replaced = False

        async def restating_send(message: Message) -> None:
            nonlocal replaced
            if message["type"] == "http.response.start" and message["status"] == 500:
                stopped = engine_stopped(state)
                if stopped is not None:
                    replaced = True
                    await stopped_response(stopped)(scope, receive, send)
                    return
            if not replaced:
                await send(message)

        await self.app(scope, receive, restating_send)


#: The exit status of a server whose engine core a Neuron runtime error stopped (vLLM's own is 0).
RUNTIME_ERROR_EXIT = 4


def exit_failed_after_runtime_error() -> None:
    """At exit, end with :data:`RUNTIME_ERROR_EXIT` if a runtime error stopped the engine core.

    vLLM exits 0 after its engine core died, which Kubernetes records as ``Completed``; a container
    whose device failed should read as an error. The engine core's termination message is the sign:
    nothing else writes it.
    """
    if read_termination_message() is not None:
        logger.error("exiting %d: a Neuron runtime error stopped the engine core", RUNTIME_ERROR_EXIT)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(RUNTIME_ERROR_EXIT)


async def inject_fault(request: Request) -> JSONResponse:
    """``POST /neuronfleet/sim/faults``: the simulated device takes the fault on its next step."""
    try:
        fault = InjectedFault.model_validate_json(await request.body())
    except ValueError as error:
        return JSONResponse({"error": {"message": str(error), "type": "BadRequest", "code": 400}}, status_code=400)
    await request.app.state.engine_client.collective_rpc("inject_fault", args=(fault.model_dump(mode="json"),))
    return JSONResponse({"injected": json.loads(fault.model_dump_json())})


class ReadinessPlugin:
    """The endpoint plugin vLLM instantiates (zero-argument factory)."""

    name = READY_PLUGIN
    required_tasks = None

    def __init__(self) -> None:
        self.gate = DrainGate(on_count=requests_in_flight_gauge().set)

    def attach_router(self, app: FastAPI) -> None:
        """Add ``GET /ready``, and the drain gate every POST passes."""
        router = APIRouter()
        gate = self.gate

        @router.get("/ready", include_in_schema=False)
        async def ready(request: Request) -> JSONResponse:
            state = request.app.state
            serving = getattr(state, "neuronfleet_serving", None)
            client = getattr(state, "engine_client", None)
            if client is None or serving is None:
                return JSONResponse({"status": "not ready"}, status_code=503)
            if gate.closing:
                return JSONResponse({"status": "not ready", "reason": "draining"}, status_code=503)
            stopped = engine_stopped(state)
            if stopped is not None:
                return JSONResponse({"status": "not ready", "reason": stopped}, status_code=503)
            try:
                await client.check_health()
            except Exception as error:  # the engine is dead or dying: not ready, say why
                return JSONResponse({"status": "not ready", "reason": str(error) or type(error).__name__}, 503)
            return JSONResponse({"status": "ready", **serving})

        if os.environ.get(DEVICE_ENV) == "sim":
            router.add_api_route(FAULTS_PATH, inject_fault, methods=["POST"], include_in_schema=False)
        app.include_router(router)
        app.add_middleware(EngineStoppedMiddleware)
        app.add_middleware(DrainGateMiddleware, gate=gate)
        served_by = [(REPLICA_HEADER.encode(), replica_name().encode())]
        artifact = served_artifact()
        if artifact is not None:
            served_by.append((ARTIFACT_HEADER.encode(), artifact.encode()))
        # Added last, so outermost: the drain gate's and a stopped engine's 503s name them too.
        app.add_middleware(ServedByMiddleware, headers=served_by)

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        """Record what is served, and drain through the gate, then close the listener, before vLLM's shutdown."""
        state.neuronfleet_serving = describe(args)
        if engine_client is not None:
            atexit.register(exit_failed_after_runtime_error)
            loop = asyncio.get_running_loop()
            gate = self.gate

            def drain(timeout: float) -> float:
                left = gate.drain(timeout)
                # vLLM's launcher keeps its uvicorn server in the app's state.
                server = getattr(state, "server", None)
                if server is not None:
                    started = time.monotonic()
                    closed = asyncio.run_coroutine_threadsafe(close_listeners(server.servers), loop)
                    try:
                        closed.result(LISTENER_CLOSE_TIMEOUT_S)
                    except Exception as error:  # the close only tidies up: vLLM's shutdown must run all the same
                        closed.cancel()
                        logger.warning("draining: the listener did not close cleanly (%r); shutting down", error)
                    left = max(0.0, left - (time.monotonic() - started))
                return left

            vllm_compat.drain_before_shutdown(engine_client, drain, lambda: gate.active == 0)
