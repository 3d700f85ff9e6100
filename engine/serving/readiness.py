"""``GET /ready``: a vLLM endpoint plugin that says which model and compiled artifact are serving.

vLLM opens its HTTP listener only after the engine core has started, and the
engine core starts only after the executor loaded the model and the compiled
artifact; before that, connections are refused. So ``/ready`` (like vLLM's
``/health``) answers only once both are loaded; it then answers 200 while the
engine is healthy and 503 once it is not, with what it serves:
``{"status": "ready", "model": ..., "device": "sim", "artifact": HASH}``.

While the engine drains (SIGTERM), ``/ready`` answers 503 and new POSTs are refused with
503 and ``Retry-After``, before they reach an engine core that would drop them (a 500).

Registered under vLLM's ``vllm.endpoint_plugins`` entry point group; vLLM
loads endpoint plugins only when named in ``VLLM_PLUGINS``, which the serve
command sets (see ``neuronfleet.engine.serving.serve.plugin_allowlist``).
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import State
from starlette.middleware.base import RequestResponseEndpoint

from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.serving.serve import READY_PLUGIN

#: Seconds a client is asked to wait before retrying a request refused while draining.
DRAINING_RETRY_AFTER_S = 1


def describe(args: Namespace) -> dict[str, Any]:
    """What this server serves, from vLLM's parsed arguments."""
    served = args.served_model_name or [args.model]
    sim = (args.additional_config or {}).get("neuronfleet_sim")
    artifact = sim.get("artifact_dir") if sim else None
    return {
        "model": served[0] if isinstance(served, list) else served,
        "device": "sim" if sim else "neuron",
        "artifact": Path(artifact).name if artifact else None,
    }


class ReadinessPlugin:
    """The endpoint plugin vLLM instantiates (zero-argument factory)."""

    name = READY_PLUGIN
    required_tasks = None

    def attach_router(self, app: FastAPI) -> None:
        """Add ``GET /ready``, and refuse new work with 503 while the engine drains."""
        router = APIRouter()

        @router.get("/ready", include_in_schema=False)
        async def ready(request: Request) -> JSONResponse:
            state = request.app.state
            serving = getattr(state, "neuronfleet_serving", None)
            client = getattr(state, "engine_client", None)
            if client is None or serving is None:
                return JSONResponse({"status": "not ready"}, status_code=503)
            if vllm_compat.engine_is_shutting_down(client):
                return JSONResponse({"status": "not ready", "reason": "draining"}, status_code=503)
            try:
                await client.check_health()
            except Exception as error:  # the engine is dead or dying: not ready, say why
                return JSONResponse({"status": "not ready", "reason": str(error) or type(error).__name__}, 503)
            return JSONResponse({"status": "ready", **serving})

        app.include_router(router)

        @app.middleware("http")
        async def refuse_while_draining(request: Request, call_next: RequestResponseEndpoint) -> Response:
            # The engine core drops requests added while it drains and vLLM answers 500; a 503 with
            # Retry-After tells clients and load balancers to go to another replica.
            client = getattr(request.app.state, "engine_client", None)
            if request.method == "POST" and client is not None and vllm_compat.engine_is_shutting_down(client):
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
            return await call_next(request)

    async def init_state(self, engine_client: Any, state: State, args: Namespace) -> None:
        """Record what is served."""
        state.neuronfleet_serving = describe(args)
