"""``neuronfleet-engine serve``: vLLM's OpenAI-compatible server with the Neuron scheduler.

The serve command only prepares: it renders the ``vllm serve`` arguments from
the engine configuration, checks the compiled artifact, makes the local model
directory the simulated device needs, sets the environment, and then replaces
itself with ``vllm serve`` (same process id, so Kubernetes' SIGTERM reaches
vLLM directly). Everything after that is vLLM's own serving stack.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, NoReturn

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.lora import LoraSlots
from neuronfleet.contract.names import HTTP_KEEP_ALIVE_S
from neuronfleet.contract.sim_settings import DEVICE_ENV, EXECUTOR_CLS, SETTINGS_KEY, Device, SimSettings
from neuronfleet.engine.artifacts.store import GRAPHS_DIR

#: Where the vLLM Neuron plugin looks for precompiled graphs (its remote compile cache).
NEURON_CACHE_ENV = "NEURON_LIBTORCH_REMOTE_CACHE"
#: Set to 1, a graph missing from the compile cache stops the plugin instead of compiling at start-up.
NO_WARMUP_COMPILE_ENV = "VLLM_NEURON_DISABLE_WARMUP_COMPILE"
#: The CPU compile route's switches (``neuronfleet.engine.artifacts.neuron_compile``): never for serving.
CPU_COMPILE_ENVS = ("VLLM_NEURON_CPU_COMPILE", "NEURON_PLATFORM_TARGET_OVERRIDE")
#: The hash of the compiled artifact being served; ``/ready`` and every response header report it.
SERVED_ARTIFACT_ENV = "NEURONFLEET_SERVED_ARTIFACT"
#: How vLLM starts its engine core process; ``vllm serve`` chooses spawn unless it is set.
MULTIPROC_METHOD_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
#: How long vLLM's HTTP server keeps an idle connection (:data:`~neuronfleet.contract.names.HTTP_KEEP_ALIVE_S`).
KEEP_ALIVE_ENV = "VLLM_HTTP_TIMEOUT_KEEP_ALIVE"


#: The ``GET /ready`` endpoint plugin (``neuronfleet.engine.serving.readiness``), for ``VLLM_PLUGINS``.
READY_PLUGIN = "neuronfleet_ready"
_VLLM_GROUPS = (
    "vllm.platform_plugins",
    "vllm.general_plugins",
    "vllm.stat_logger_plugins",
    "vllm.io_processor_plugins",
)


def plugin_allowlist(current: str | None) -> str:
    """``VLLM_PLUGINS`` that adds ``/ready`` and keeps every other plugin vLLM would load.

    Naming any plugin in ``VLLM_PLUGINS`` restricts every group to the names
    listed, so the installed platform and general plugins are listed too (the
    Neuron plugin among them on a Neuron host). Other endpoint plugins stay off.
    """
    if current is not None:
        names = [name for name in current.split(",") if name]
    else:
        names = sorted({plugin.name for group in _VLLM_GROUPS for plugin in entry_points(group=group)})
    return ",".join([*names, READY_PLUGIN] if READY_PLUGIN not in names else names)


@dataclass(frozen=True)
class ServeRequest:
    """What to serve, where, and on which device."""

    engine: EngineConfig
    device: Device
    #: What vLLM loads: a local directory (sim) or a Hugging Face id / local path (neuron).
    model: str
    served_model_name: str
    #: The model revision vLLM loads (neuron device; the simulated model directory has none).
    revision: str | None
    host: str
    port: int
    drain_timeout: int
    async_scheduling: bool = True
    #: A complete compiled artifact's directory; ``None`` compiles at start (sim only).
    artifact_dir: Path | None = None
    sim: SimSettings = field(default_factory=SimSettings)
    #: Publish KV cache events on this port, and replay them on ``kv_events_replay_port``; ``None``: off.
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    #: The LoRA slots the artifact was compiled with, and the adapters loaded into them (name: local folder).
    lora: LoraSlots | None = None
    adapters: dict[str, Path] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()


def replace_additional_config(args: list[str], extra: dict[str, Any]) -> list[str]:
    """``args`` with ``extra`` merged into the JSON after ``--additional-config``."""
    index = args.index("--additional-config")
    merged = {**json.loads(args[index + 1]), **extra}
    return [*args[: index + 1], json.dumps(merged, separators=(",", ":")), *args[index + 2 :]]


def vllm_serve_argv(request: ServeRequest) -> list[str]:
    """The ``vllm serve`` arguments (after ``serve``) for ``request``."""
    args = request.engine.vllm_serve_args(async_scheduling=request.async_scheduling)
    if request.device == "sim":
        sim = request.sim.model_copy(
            update={"artifact_dir": None if request.artifact_dir is None else str(request.artifact_dir)}
        )
        # Unset settings stay off the command line: the engine core reads them back as their defaults.
        args = replace_additional_config(args, {SETTINGS_KEY: sim.model_dump(mode="json", exclude_none=True)})
        args += ["--distributed-executor-backend", EXECUTOR_CLS]
    elif request.revision is not None:
        args += ["--revision", request.revision]
    if request.lora is not None:
        args += request.lora.vllm_serve_args()
    if request.adapters:
        args += ["--lora-modules", *(f"{name}={path}" for name, path in request.adapters.items())]
    if request.kv_events_port is not None:
        args += ["--kv-events-config", kv_events_config(request.kv_events_port, request.kv_events_replay_port)]
    return [
        request.model,
        "--served-model-name",
        request.served_model_name,
        "--host",
        request.host,
        "--port",
        str(request.port),
        # vLLM drains in-flight requests for this long on SIGTERM, then exits.
        "--shutdown-timeout",
        str(request.drain_timeout),
        *args,
        *request.extra_args,
    ]


def kv_events_config(port: int, replay_port: int | None) -> str:
    """vLLM's ``--kv-events-config``: every block the scheduler caches or evicts, published on all addresses
    at ``port`` (ZMQ PUB, msgpack ``KVEventBatch``), and the last batches replayed on ``replay_port`` (the
    next port by default) to a subscriber that joins late or missed some."""
    replay = port + 1 if replay_port is None else replay_port
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay}",
    }
    return json.dumps(config, separators=(",", ":"))


def metrics_dir(port: int) -> Path:
    """A fresh directory for prometheus-client's multiprocess files, one per port on the host."""
    path = Path(tempfile.gettempdir()) / f"neuronfleet-metrics-{port}"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    return path


def serve_environment(request: ServeRequest, base: dict[str, str]) -> dict[str, str]:
    """The environment ``vllm serve`` runs in."""
    env = dict(base)
    # No usage reports leave the host.
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    # The engine core writes the neuronfleet: metrics; the API server's /metrics collects them.
    env["VLLM_PLUGINS"] = plugin_allowlist(env.get("VLLM_PLUGINS"))
    # The router's Envoy closes idle connections before this (HTTP_KEEP_ALIVE_S); a different one would race it.
    env[KEEP_ALIVE_ENV] = str(HTTP_KEEP_ALIVE_S)
    if "PROMETHEUS_MULTIPROC_DIR" not in env:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir(request.port))
    if request.artifact_dir is not None:
        env[SERVED_ARTIFACT_ENV] = request.artifact_dir.name
    else:
        env.pop(SERVED_ARTIFACT_ENV, None)
    if request.device == "sim":
        env[DEVICE_ENV] = "sim"
        # The model directory is local; nothing is downloaded.
        env["HF_HUB_OFFLINE"] = "1"
        env["TRANSFORMERS_OFFLINE"] = "1"
        # The engine core is forked from the API server, which has imported torch, vLLM and the
        # scheduler by then: spawned, it imports them all again (a quarter of a start-up on 2 cores).
        # vLLM spawns for accelerators that cannot be forked once initialised; a host device can.
        env.setdefault(MULTIPROC_METHOD_ENV, "fork")
    else:
        env.pop(DEVICE_ENV, None)
        # Inherited from a compile's environment, these would make the plugin compile for a target, not run.
        for name in CPU_COMPILE_ENVS:
            env.pop(name, None)
        if request.artifact_dir is not None:
            env[NEURON_CACHE_ENV] = str(request.artifact_dir / GRAPHS_DIR)
            # Serving never compiles: a cache miss is an error, not hours of compiling on a Neuron node.
            env[NO_WARMUP_COMPILE_ENV] = "1"
    return env


def exec_vllm_serve(request: ServeRequest) -> NoReturn:
    """Become ``vllm serve`` for ``request`` (this process's id is kept)."""
    argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", *vllm_serve_argv(request)]
    env = serve_environment(request, dict(os.environ))
    if request.device == "neuron" and request.artifact_dir is not None:
        print(
            f"serving artifact {request.artifact_dir.name} from {env[NEURON_CACHE_ENV]}: a graph missing from it "
            f"stops the engine ({NO_WARMUP_COMPILE_ENV}=1), nothing is compiled here",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)
