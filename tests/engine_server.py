"""Running ``neuronfleet-engine serve`` as a user would: a subprocess on a free loopback port.

Imported by tests (``tests`` is on pytest's ``pythonpath``); the fixtures live in ``conftest.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from neuronfleet.operator.testing import Samples, parse_samples

SCRIPTS = Path(sys.executable).parent
#: vLLM start-up on a small shared CPU machine: imports, engine core process, model directory.
READY_TIMEOUT_S = 300
REQUEST_TIMEOUT_S = 120


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def engine_env() -> dict[str, str]:
    """The environment a user's shell would give the engine: no network for models."""
    keep = ("PATH", "HOME", "XDG_CACHE_HOME", "TMPDIR", "LANG")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    env.update({"HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "PYTHONSAFEPATH": "1"})
    return env


def _lower(headers: Any) -> dict[str, str]:
    return {str(name).lower(): str(value) for name, value in headers.items()}


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

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def url(self, path: str) -> str:
        """The full URL of ``path``."""
        return f"http://127.0.0.1:{self.port}{path}"

    def request(self, path: str, body: bytes | None = None, timeout: float = REQUEST_TIMEOUT_S) -> Response:
        """GET (no body) or POST ``body`` as JSON; HTTP errors are returned, not raised."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        request = urllib.request.Request(self.url(path), data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return Response(response.status, response.read(), _lower(response.headers))
        except urllib.error.HTTPError as error:
            return Response(error.code, error.read(), _lower(error.headers))

    def post(self, path: str, document: dict[str, Any]) -> Response:
        """POST ``document`` as JSON."""
        return self.request(path, json.dumps(document).encode())

    def stream(self, path: str, document: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST with ``stream: true``; yield each server-sent event's JSON until ``[DONE]``."""
        body = json.dumps({**document, "stream": True}).encode()
        request = urllib.request.Request(self.url(path), data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            assert response.status == 200
            for raw in response:
                line = raw.decode().strip()
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

    def log_tail(self, lines: int = 60) -> str:
        """The end of the server's output, for failure messages."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Poll ``/health`` until it answers 200; fail with the log if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"serve exited with {self.process.returncode} before it was ready:\n{self.log_tail()}")
            try:
                if self.request("/health", timeout=5).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"serve was not ready within {timeout} s:\n{self.log_tail()}")

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM the server (its process only, as Kubernetes does) and wait for it to exit."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)
            pytest.fail(f"serve did not exit within {timeout} s of SIGTERM:\n{self.log_tail()}")


class ServerPool:
    """Starts servers and stops every one it started."""

    def __init__(self, logs: Callable[[], Path]) -> None:
        self.logs = logs
        self.servers: list[EngineServer] = []

    def start(self, *args: str, wait: bool = True) -> EngineServer:
        """``neuronfleet-engine serve ARGS`` on a free port, ready unless ``wait`` is false."""
        port = free_port()
        log = self.logs() / "serve.log"
        # The engine's metrics files go to the test's directory, not the host's temporary one.
        metrics = log.parent / "metrics"
        metrics.mkdir()
        with log.open("wb") as output:
            process = subprocess.Popen(
                [str(SCRIPTS / "neuronfleet-engine"), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**engine_env(), "PROMETHEUS_MULTIPROC_DIR": str(metrics)},
                cwd=log.parent,
                # Signals reach this process alone, as in a container.
                start_new_session=True,
            )
        server = EngineServer(process, port, log)
        self.servers.append(server)
        if wait:
            server.wait_ready()
        return server

    def stop_all(self) -> None:
        """SIGTERM every server still running, then wait (bounded) for each."""
        for server in self.servers:
            if server.process.poll() is None:
                server.process.send_signal(signal.SIGTERM)
        for server in self.servers:
            try:
                server.process.wait(60)
            except subprocess.TimeoutExpired:
                server.process.kill()
                server.process.wait(30)


def write_engine_config(directory: Path, **settings: Any) -> Path:
    """An engine configuration file holding ``settings`` (JSON is YAML)."""
    path = directory / "engine.yaml"
    path.write_text(json.dumps(settings))
    return path
