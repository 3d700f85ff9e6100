"""The demo's engine: one ``neuronfleet-engine serve --device sim`` behind the demo service's model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import yaml

from neuronfleet.devcluster.processes import SCRIPTS, ManagedProcess, ProcessNotReadyError, free_ports
from neuronfleet.engine.hardware import DEFAULT_INSTANCE_TYPE, get_instance_type

#: Overrides which ``neuronfleet-engine`` the demo starts (another checkout's, say).
ENGINE_ENV = "NEURONFLEET_DEMO_ENGINE"
#: vLLM's start on the simulated device: loading, profiling, the first graphs.
START_TIMEOUT = 300.0


class EngineError(RuntimeError):
    """The engine did not start, or did not answer."""


def engine_program() -> Path:
    """The ``neuronfleet-engine`` to start: this build's, unless ``$NEURONFLEET_DEMO_ENGINE`` names another."""
    return Path(os.environ.get(ENGINE_ENV) or SCRIPTS / "neuronfleet-engine")


class SimEngine:
    """One engine on the simulated device, serving ``model`` with the service's engine configuration."""

    def __init__(self, workdir: Path, service: dict[str, Any]) -> None:
        spec = service["spec"]
        self.workdir = workdir
        self.model = str(spec["model"]["uri"])
        self.served_name = self.model.split("://", 1)[-1]
        self.instance_type = str(spec.get("instanceType", DEFAULT_INSTANCE_TYPE))
        self.engine = dict(spec.get("engine") or {})
        (self.port,) = free_ports(1)
        self.process: ManagedProcess | None = None

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
        self.process = ManagedProcess.spawn("engine", argv, self.log, cwd=self.workdir)
        try:
            self.process.wait_ready(
                self._lists_model, timeout=START_TIMEOUT, interval=1.0, what=f"the engine to list {self.served_name}"
            )
        except ProcessNotReadyError as error:
            raise EngineError(str(error)) from None

    def _lists_model(self) -> bool:
        try:
            models = httpx.get(f"{self.url}/v1/models", timeout=5).json().get("data") or []
        except (httpx.TransportError, ValueError):
            return False
        return any(m.get("id") == self.served_name for m in models)

    def complete(self, prompt: str, max_tokens: int = 16) -> str:
        """One completion, as the printed curl sends it."""
        try:
            response = httpx.post(
                f"{self.url}/v1/completions", json=self.completion_body(prompt, max_tokens), timeout=60
            )
            answer = response.raise_for_status().json()
        except (httpx.HTTPError, ValueError) as error:
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
        if self.process is not None:
            self.process.stop(grace=15.0)
