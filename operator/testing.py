"""Drive the operator from tests and demos: run it as a process, read and wait on services.

Waiting is delegated to a ``wait_for(observe, until, *, timeout, what, show)`` callable
(the local control plane's), so every wait is bounded and reports what it saw last.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from neuronfleet.operator.api import API_VERSION
from neuronfleet.operator.kube import ARTIFACTS, SERVICES_NIS, Kube
from neuronfleet.operator.metrics import RESYNCS

Obj = dict[str, Any]
WaitFor = Callable[..., Any]
#: Prometheus samples by (name, sorted labels).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

#: The installed console scripts sit beside the running interpreter.
SCRIPTS = Path(sys.executable).parent


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (all held open while picking, so they cannot repeat)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class OperatorProcess:
    """``neuronfleet-operator run`` for some namespaces, as a child process (so it can be killed)."""

    def __init__(self, kubeconfig: Path, namespaces: list[str], log_dir: Path, resync_seconds: float = 5.0) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.log_dir = log_dir
        self.resync_seconds = resync_seconds
        self.process: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.metrics_port = 0

    @property
    def log(self) -> Path:
        """This run's log file."""
        return self.log_dir / f"operator-{self.runs}.log"

    def start(self, wait_for: WaitFor, timeout: float = 60) -> None:
        """Start it and wait until its liveness endpoint answers (it is watching)."""
        self.runs += 1
        port, self.metrics_port = _free_ports(2)
        argv = [str(SCRIPTS / "neuronfleet-operator"), "run", "--kubeconfig", str(self.kubeconfig)]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        argv += ["--liveness", f"http://127.0.0.1:{port}/healthz", "--resync-seconds", str(self.resync_seconds)]
        argv += ["--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def live() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"operator exited with {self.process.returncode}:\n{self.tail()}")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                return bool(response.status == 200)

        wait_for(live, timeout=timeout, what="the operator's liveness endpoint")

    def metrics(self) -> Samples:
        """Every sample of its ``/metrics``."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return parse_samples(response.read().decode())

    def resyncs(self) -> int:
        """Full resyncs this run has finished (its resyncs counter)."""
        return int(self.metrics().get((f"{RESYNCS}_total", (("outcome", "ok"),)), 0))

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when its node dies."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        """The end of this run's log."""
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def phase_of(body: Obj) -> str | None:
    """A service's or artifact's ``status.phase``."""
    phase = (body.get("status") or {}).get("phase")
    return str(phase) if phase is not None else None


def observed(body: Obj) -> bool:
    """Whether the status is about the current spec."""
    return bool((body.get("status") or {}).get("observedGeneration") == body["metadata"].get("generation"))


def condition(body: Obj, type_: str) -> Obj:
    """One condition of the status (empty if absent)."""
    for c in (body.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def summary(body: Obj) -> Obj:
    """The telling part of a service, for failure messages."""
    status = body.get("status") or {}
    return {
        "generation": body["metadata"].get("generation"),
        "observed": status.get("observedGeneration"),
        "phase": status.get("phase"),
        "conditions": [(c["type"], c["status"], c["reason"], c.get("message")) for c in status.get("conditions", [])],
        "replicas": (status.get("replicas"), status.get("readyReplicas"), status.get("updatedReplicas")),
        "revisions": (status.get("currentRevision"), status.get("targetRevision")),
    }


class Services:
    """NeuronInferenceServices in one namespace: create, patch, read and wait."""

    def __init__(self, kube: Kube, namespace: str, wait_for: WaitFor) -> None:
        self.kube = kube
        self.namespace = namespace
        self.wait_for = wait_for

    def create(self, name: str, spec: Obj) -> Obj:
        """Create a service."""
        return self.kube.create(
            {
                "apiVersion": API_VERSION,
                "kind": SERVICES_NIS.kind,
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": spec,
            }
        )

    def get(self, name: str) -> Obj:
        """Read a service that must exist."""
        body = self.kube.get(SERVICES_NIS, self.namespace, name)
        if body is None:
            raise LookupError(f"service {self.namespace}/{name} does not exist")
        return body

    def patch_spec(self, name: str, spec: Obj) -> Obj:
        """Merge-patch a service's spec."""
        return self.kube.merge_patch(SERVICES_NIS, self.namespace, name, {"spec": spec})

    def artifacts(self) -> list[Obj]:
        """The namespace's compiled artifacts."""
        return self.kube.list(ARTIFACTS, self.namespace)

    def wait(self, name: str, until: Callable[[Obj], bool], what: str, timeout: float = 60) -> Obj:
        """Poll the service until ``until`` holds."""
        result: Obj = self.wait_for(
            lambda: self.get(name), until, timeout=timeout, what=f"{name}: {what}", show=summary
        )
        return result

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> Obj:
        """Wait for a phase, reached for the current spec."""
        return self.wait(name, lambda b: phase_of(b) == phase and observed(b), f"phase {phase}", timeout)

    def wait_ready(self, name: str, generation: int = 1, timeout: float = 60) -> Obj:
        """Wait until the service is Ready at ``generation``."""
        return self.wait(
            name,
            lambda b: phase_of(b) == "Ready" and observed(b) and b["metadata"]["generation"] == generation,
            f"Ready at generation {generation}",
            timeout,
        )
