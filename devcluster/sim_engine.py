"""The demo's engine: one ``neuronfleet-engine serve --device sim`` behind the demo service's model."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from neuronfleet.devcluster.processes import ProcessRecord, is_alive, spawn, stop
from neuronfleet.engine.hardware import DEFAULT_INSTANCE_TYPE, get_instance_type

#: The installed console scripts sit beside the running interpreter.
SCRIPTS = Path(sys.executable).parent
#: Overrides which ``neuronfleet-engine`` the demo starts (another checkout's, say).
ENGINE_ENV = "NEURONFLEET_DEMO_ENGINE"
#: vLLM's start on the simulated device: loading, profiling, the first graphs.
START_TIMEOUT = 300.0


class EngineError(RuntimeError):
    """The engine did not start, or did not answer."""


def engine_program() -> Path:
    """The ``neuronfleet-engine`` to start: this build's, unless ``$NEURONFLEET_DEMO_ENGINE`` names another."""
    return Path(os.environ.get(ENGINE_ENV) or SCRIPTS / "neuronfleet-engine")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SimEngine:
    """One engine on the simulated device, serving ``model`` with the service's engine configuration."""

    def __init__(self, workdir: Path, service: dict[str, Any]) -> None:
        spec = service["spec"]
        self.workdir = workdir
        self.model = str(spec["model"]["uri"])
        self.served_name = self.model.split("://", 1)[-1]
        self.instance_type = str(spec.get("instanceType", DEFAULT_INSTANCE_TYPE))
        self.engine = dict(spec.get("engine") or {})
        self.port = _free_port()
        self.record: ProcessRecord | None = None

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        """Its output."""
        return self.workdir / "engine.log"

    def start(self) -> None:
        """Start it and wait until it lists the model (what the serving pods' readiness probe asks)."""
        config = self.workdir / "engine.yaml"
        config.write_text(yaml.safe_dump(self.engine, sort_keys=False))
        argv = [
            str(engine_program()),
            "serve",
            "--device",
            "sim",
            "--config",
            str(config),
            "--model",
            self.model,
            "--target",
            get_instance_type(self.instance_type).target,
            "--instance-type",
            self.instance_type,
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        _, self.record = spawn("engine", argv, self.log, cwd=self.workdir)
        deadline = time.monotonic() + START_TIMEOUT
        while not self._lists_model():
            if not self._alive():
                raise EngineError(f"the engine exited; the end of its log:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise EngineError(
                    f"the engine did not list {self.served_name} within {START_TIMEOUT:g} s; "
                    f"the end of its log:\n{self.tail()}"
                )
            time.sleep(1)

    def tail(self, lines: int = 15) -> str:
        """The end of its log (the log goes with the cluster's directory at teardown)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _alive(self) -> bool:
        return self.record is not None and is_alive(self.record.pid, self.record.start_ticks)

    def _lists_model(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as response:
                models = json.load(response).get("data") or []
        except (OSError, ValueError):
            return False
        return any(m.get("id") == self.served_name for m in models)

    def complete(self, prompt: str, max_tokens: int = 16) -> str:
        """One completion, as the printed curl sends it."""
        request = urllib.request.Request(
            f"{self.url}/v1/completions",
            data=json.dumps(self.completion_body(prompt, max_tokens)).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                answer = json.load(response)
        except (OSError, ValueError) as error:
            raise EngineError(f"no completion from {self.url}: {error}") from None
        return str(answer["choices"][0]["text"])

    def completion_body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The OpenAI completion request."""
        return {"model": self.served_name, "prompt": prompt, "max_tokens": max_tokens}

    def curl(self, prompt: str, max_tokens: int = 16) -> str:
        """The curl command line that asks for a completion."""
        body = json.dumps(self.completion_body(prompt, max_tokens))
        return f"curl -s {self.url}/v1/completions -H 'Content-Type: application/json' -d '{body}'"

    def stop(self) -> None:
        """SIGTERM (the engine drains), then SIGKILL if it lingers."""
        if self.record is not None:
            stop([self.record], grace=15.0)
