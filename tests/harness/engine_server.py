"""Running ``neuronfleet-engine serve`` as a user would: a subprocess on a free loopback port.

Imported by tests (``tests`` is on pytest's ``pythonpath``); the fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from neuronfleet.contract.sim_settings import START_TIME_SCALE_ENV
from neuronfleet.devcluster.addons.metrics import Samples, parse_samples
from neuronfleet.devcluster.process.managed import SCRIPTS as SCRIPTS
from neuronfleet.devcluster.process.managed import ManagedProcess, ProcessNotReadyError, free_ports, stop_all

#: vLLM start-up on a small shared CPU machine: imports, engine core process, model directory.
READY_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 120
#: A line logged at ERROR level (vLLM's format and uvicorn's) or the first line of a traceback.
ERROR_LINE = re.compile(r"\bERROR\b|Traceback")


def error_lines(output: str) -> list[str]:
    """The lines of a server's ``output`` that a clean stop must not have: ERROR level, or a traceback."""
    return [line for line in output.splitlines() if ERROR_LINE.search(line)]


#: The share of a Neuron replica's start time the engines of the tests spend.
START_TIME_SCALE = 0.01


def engine_env() -> dict[str, str]:
    """The environment a user's shell would give the engine: no network for models."""
    keep = ("PATH", "HOME", "XDG_CACHE_HOME", "TMPDIR", "LANG")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    # A simulated replica of a large shape would take a Neuron replica's minutes to start: tests take 1/100 of it.
    env.update({"HF_HUB_OFFLINE": "1", "NO_COLOR": "1", START_TIME_SCALE_ENV: str(START_TIME_SCALE)})
    return env


@dataclass
class Response:
    """An HTTP response: status, body and headers (names in lower case)."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


@dataclass
class EngineServer:
    """A running ``serve`` process and a small HTTP client for it."""

    managed: ManagedProcess
    port: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The server's process handle."""
        return self.managed.popen

    @property
    def log(self) -> Path:
        """The server's output."""
        return self.managed.log

    def url(self, path: str) -> str:
        """The full URL of ``path``."""
        return f"http://127.0.0.1:{self.port}{path}"

    def request(self, path: str, body: bytes | None = None, timeout: float = REQUEST_TIMEOUT_S) -> Response:
        """GET (no body) or POST ``body`` as JSON; HTTP errors are returned, not raised."""
        if body is None:
            response = httpx.get(self.url(path), timeout=timeout)
        else:
            headers = {"Content-Type": "application/json"}
            response = httpx.post(self.url(path), content=body, headers=headers, timeout=timeout)
        return Response(response.status_code, response.content, dict(response.headers))

    def post(self, path: str, document: dict[str, Any]) -> Response:
        """POST ``document`` as JSON."""
        return self.request(path, json.dumps(document).encode())

    def request_stream(self, path: str, document: dict[str, Any]) -> Response:
        """POST with ``stream: true`` and read the whole stream: its status, raw events and headers."""
        body = {**document, "stream": True}
        with httpx.stream("POST", self.url(path), json=body, timeout=REQUEST_TIMEOUT_S) as response:
            return Response(response.status_code, response.read(), dict(response.headers))

    def stream(self, path: str, document: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST with ``stream: true``; yield each server-sent event's JSON until ``[DONE]``."""
        body = {**document, "stream": True}
        with httpx.stream("POST", self.url(path), json=body, timeout=REQUEST_TIMEOUT_S) as response:
            assert response.status_code == 200
            for raw in response.iter_lines():
                line = raw.strip()
                if not line.startswith("data: "):
                    continue
                payload = line.removeprefix("data: ")
                if payload == "[DONE]":
                    return
                yield json.loads(payload)
        raise AssertionError("the stream ended without [DONE]")

    def metrics(self) -> Samples:
        """Every sample of ``/metrics``: (name, sorted labels) -> value."""
        response = self.request("/metrics")
        assert response.status == 200
        return parse_samples(response.body.decode())

    def log_size(self) -> int:
        """How many bytes of output the server has written so far (an offset for :meth:`output_since`)."""
        return self.log.stat().st_size

    def output_since(self, offset: int) -> str:
        """The server's output from byte ``offset`` on."""
        with self.log.open("rb") as log:
            log.seek(offset)
            return log.read().decode(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        """The end of the server's output, for failure messages."""
        return self.managed.tail(lines)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll ``/health`` until it answers 200; fail with the log if the process exits or time runs out."""
        try:
            self.managed.wait_ready(self.url("/health"), timeout=timeout, interval=0.5, what="serve to be ready")
        except ProcessNotReadyError as error:
            pytest.fail(str(error))

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM the server (its process only, as Kubernetes does) and wait for it to exit."""
        self.managed.signal(signal.SIGTERM, group=False)
        try:
            return self.managed.wait(timeout)
        except subprocess.TimeoutExpired:
            self.managed.stop(grace=0.1)
            pytest.fail(f"serve did not exit within {timeout} s of SIGTERM:\n{self.log_tail()}")


class ServerPool:
    """Starts servers and stops every one it started."""

    def __init__(self, logs: Callable[[], Path]) -> None:
        self.logs = logs
        self.servers: list[EngineServer] = []

    def start(self, *args: str, wait: bool = True, env: dict[str, str] | None = None) -> EngineServer:
        """``neuronfleet-engine serve ARGS`` on a free port (``env`` added), ready unless ``wait`` is false."""
        (port,) = free_ports(1)
        log = self.logs() / "serve.log"
        # The engine's metrics files go to the test's directory, not the host's temporary one.
        metrics = log.parent / "metrics"
        metrics.mkdir()
        managed = ManagedProcess.spawn(
            "serve",
            [str(SCRIPTS / "neuronfleet-engine"), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            log,
            cwd=log.parent,
            env={**engine_env(), "PROMETHEUS_MULTIPROC_DIR": str(metrics), **(env or {})},
        )
        server = EngineServer(managed, port)
        self.servers.append(server)
        if wait:
            server.wait_ready()
        return server

    def stop_all(self) -> None:
        """SIGTERM every server still running (its process only), then wait (bounded) for them."""
        stop_all([server.managed for server in self.servers], grace=60, group=False)


def write_engine_config(directory: Path, **settings: Any) -> Path:
    """An engine configuration file holding ``settings`` (JSON is YAML)."""
    path = directory / "engine.yaml"
    path.write_text(json.dumps(settings))
    return path
