"""``GET /ready``: a vLLM endpoint plugin that says which model and compiled artifact are serving.

vLLM opens its HTTP listener only after the engine core has started, and the
engine core starts only after the executor loaded the model and the compiled
artifact; before that, connections are refused. So ``/ready`` (like vLLM's
``/health``) answers only once both are loaded; it then answers 200 while the
engine is healthy and 503 once it is not, with what it serves:
``{"status": "ready", "model": ..., "device": "sim", "artifact": HASH}``. Every
HTTP response carries the artifact's hash too, in ``X-Neuronfleet-Artifact``,
so a client or gateway sees which revision answered each request.

From SIGTERM on, ``/ready`` answers 503 and every answer closes its connection; a few seconds
later new POSTs are refused with 503 and ``Retry-After``; once the requests admitted before have
finished, the listener closes (see ``neuronfleet.engine.serving.drain``).

Registered under vLLM's ``vllm.endpoint_plugins`` entry point group; vLLM
loads endpoint plugins only when named in ``VLLM_PLUGINS``, which the serve
command sets (see ``neuronfleet.engine.serving.serve.plugin_allowlist``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from argparse import Namespace
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import Gauge
from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from neuronfleet.engine.names import REQUESTS_IN_FLIGHT
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
from neuronfleet.engine.sim_settings import SETTINGS_KEY

logger = logging.getLogger(__name__)

#: Seconds the listener's close may take (its waits, and a margin) before vLLM's shutdown goes on without it.
LISTENER_CLOSE_TIMEOUT_S = HANDSHAKE_GRACE_S + ACCEPT_QUEUE_WAIT_S + 1.0

#: The response header naming the compiled artifact that served the request.
ARTIFACT_HEADER = "x-neuronfleet-artifact"


def served_artifact() -> str | None:
    """The hash of the artifact being served (set by the serve command), or None when none was given."""
    return os.environ.get(SERVED_ARTIFACT_ENV) or None


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


class ArtifactHeaderMiddleware:
    """ASGI middleware: every HTTP response names the artifact that served it."""

    def __init__(self, app: ASGIApp, artifact: str) -> None:
        self.app = app
        self.header = (ARTIFACT_HEADER.encode(), artifact.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, adding the header to its response's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, sending_header(send, self.header))


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
            try:
                await client.check_health()
            except Exception as error:  # the engine is dead or dying: not ready, say why
                return JSONResponse({"status": "not ready", "reason": str(error) or type(error).__name__}, 503)
            return JSONResponse({"status": "ready", **serving})

        app.include_router(router)
        app.add_middleware(DrainGateMiddleware, gate=gate)
        artifact = served_artifact()
        if artifact is not None:
            # Added last, so outermost: the drain gate's 503s name the artifact too.
            app.add_middleware(ArtifactHeaderMiddleware, artifact=artifact)

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        """Record what is served, and drain through the gate, then close the listener, before vLLM's shutdown."""
        state.neuronfleet_serving = describe(args)
        if engine_client is not None:
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
