"""The operator as a child process: ``neuronfleet-operator run``, launched as a user would launch it.

Only the console script is started; nothing here imports the operator's package, so the demo and the
benchmarks see it from outside, through its liveness endpoint, its ``/metrics`` and its log.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from neuronfleet.devcluster.addons.metrics import Samples, scrape
from neuronfleet.devcluster.process.managed import SCRIPTS, ManagedProcess, free_ports, log_tail
from neuronfleet.devcluster.process.waiting import WaitFor

#: The operator's counter of finished full resyncs (``neuronfleet.operator.metrics.RESYNCS``), as scraped.
RESYNCS_TOTAL = "neuronfleet_operator_resyncs_total"
#: 1 while it reconciles, 0 while it stands by for the Lease (``neuronfleet.operator.metrics.LEADER``).
LEADER = "neuronfleet_operator_leader"


class OperatorProcess:
    """``neuronfleet-operator run`` for some namespaces, as a child process (so it can be killed)."""

    def __init__(
        self,
        kubeconfig: Path,
        namespaces: list[str],
        log_dir: Path,
        resync_seconds: float = 5.0,
        prometheus: str | None = None,
        leader_election: str | None = None,
        options: tuple[str, ...] = (),
    ) -> None:
        self.kubeconfig = kubeconfig
        self.namespaces = namespaces
        self.log_dir = log_dir
        self.resync_seconds = resync_seconds
        #: The Prometheus URL autoscaled services' ScaledObjects query (``--prometheus-address``).
        self.prometheus = prometheus
        #: The namespace of the Lease it is elected on (``--leader-election-namespace``); none: it always leads.
        self.leader_election = leader_election
        #: More of ``run``'s options, as given (``--renew-deadline-seconds 6``).
        self.options = options
        self.managed: ManagedProcess | None = None
        self.runs = 0
        self.metrics_port = 0

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The running (or last) operator's process handle."""
        return None if self.managed is None else self.managed.popen

    @property
    def log(self) -> Path:
        """This run's log file."""
        return self.log_dir / f"operator-{self.runs}.log"

    def start(self, wait_for: WaitFor, timeout: float = 60) -> None:
        """Start it and wait until its liveness endpoint answers (it is watching, or standing by to)."""
        if self.managed is not None and self.managed.alive():
            raise RuntimeError("the operator is still running: stop() or kill() it before starting it again")
        self.runs += 1
        port, self.metrics_port = free_ports(2)
        argv = [str(SCRIPTS / "neuronfleet-operator"), "run", "--kubeconfig", str(self.kubeconfig)]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        argv += ["--liveness", f"http://127.0.0.1:{port}/healthz", "--resync-seconds", str(self.resync_seconds)]
        argv += ["--metrics-port", str(self.metrics_port), "--metrics-address", "127.0.0.1"]
        if self.prometheus is not None:
            argv += ["--prometheus-address", self.prometheus]
        if self.leader_election is not None:
            argv += ["--leader-election-namespace", self.leader_election]
        argv += self.options
        self.managed = ManagedProcess.spawn("operator", argv, self.log)
        self.managed.wait_ready(
            f"http://127.0.0.1:{port}/healthz", timeout=timeout, what="the operator's liveness endpoint", wait=wait_for
        )

    def metrics(self) -> Samples:
        """Every sample of its ``/metrics``."""
        return scrape(f"http://127.0.0.1:{self.metrics_port}/metrics")

    def resyncs(self) -> int:
        """Full resyncs this run has finished (its resyncs counter)."""
        return int(self.metrics().get((RESYNCS_TOTAL, (("outcome", "ok"),)), 0))

    def leading(self) -> bool:
        """Whether it reconciles now (it may be standing by for the Lease)."""
        return self.metrics().get((LEADER, ()), 0) == 1

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when its node dies."""
        assert self.managed is not None
        self.managed.signal(signal.SIGKILL)
        self.managed.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.managed is not None:
            self.managed.stop(grace=20)

    def tail(self, lines: int = 40) -> str:
        """The end of this run's log."""
        return log_tail(self.log, lines) if self.log.exists() else ""
