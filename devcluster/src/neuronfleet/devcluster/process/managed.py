"""Programs as managed processes: free ports, a log file, a wait until ready, stop by recorded pid.

Each program leads its own session (so its process group is its pid), and is identified by pid plus
start time (psutil's ``create_time``), so a recycled pid is never signalled. The control plane's
components, the operator, the demo's engine and the tests' engine servers all run through here.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import httpx
import psutil
from pydantic import BaseModel

from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.process.waiting import WaitFor, WaitTimeoutError, wait_for

#: The installed console scripts (``neuronfleet-engine``, ``neuronfleet-operator``) sit beside the interpreter.
SCRIPTS = Path(sys.executable).parent


class ProcessRecord(BaseModel):
    """A started program, identified by pid plus start time so a recycled pid is never signalled."""

    name: str
    pid: int
    #: Seconds since the epoch, as psutil's ``Process.create_time()`` reports it.
    started: float
    log: Path

    def alive(self) -> bool:
        """Whether this very process still runs."""
        return is_alive(self.pid, self.started)


class ProcessNotReadyError(RigError):
    """A program exited before it was ready, or was not ready in time; the message ends with its log."""


def started_at(pid: int) -> float | None:
    """When the process started (``create_time``), or None when no live process has this pid."""
    try:
        process = psutil.Process(pid)
        # A zombie has exited and only waits to be reaped.
        return None if process.status() == psutil.STATUS_ZOMBIE else process.create_time()
    except psutil.Error:
        return None


def is_alive(pid: int, started: float | None = None) -> bool:
    """Whether ``pid`` is a live process (and, given ``started``, still the same one)."""
    now = started_at(pid)
    return now is not None and (started is None or now == started)


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nothing listens on (held open together, so none repeats)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def log_tail(path: Path, lines: int = 40) -> str:
    """The end of a log file (or a note that there is none)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def answers(url: str, *, verify: bool = True, timeout: float = 2.0) -> bool:
    """Whether a GET of ``url`` answers 200 (a readiness probe; no connection counts as no)."""
    try:
        return httpx.get(url, verify=verify, timeout=timeout).status_code == httpx.codes.OK
    except httpx.TransportError:
        return False


def send_signal(record: ProcessRecord, sig: signal.Signals, *, group: bool = True) -> None:
    """Send ``sig`` to the process group (or, ``group=False``, to the process alone) if it is still this process."""
    if not record.alive():
        return
    with contextlib.suppress(ProcessLookupError):
        if group:
            # The program leads its own session, so its group id is its pid; helpers it forked go too.
            os.killpg(record.pid, sig)
        else:
            os.kill(record.pid, sig)


def group_alive(pgid: int) -> bool:
    """Whether a live process (not a zombie waiting to be reaped) is still in process group ``pgid``."""
    for process in psutil.process_iter(["status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(process.pid) == pgid:
                return True
    return False


def _wait_gone(check: Callable[[], list[int]], seconds: float, interval: float) -> list[int]:
    with contextlib.suppress(WaitTimeoutError):
        return wait_for(check, lambda left: not left, timeout=seconds, interval=interval)
    return check()


def stop(records: Sequence[ProcessRecord], *, grace: float = 10.0, group: bool = True) -> list[ProcessRecord]:
    """SIGTERM each process group (or, ``group=False``, each process alone, as Kubernetes signals pid 1), then
    SIGKILL the groups that outlive ``grace`` seconds; returns any still alive after that.

    A group outlives its leader when a member ignores SIGTERM (vLLM's engine core under ``serve``), so the
    wait covers every member of the groups this call signalled, not only the recorded processes.
    """
    owned = [r for r in records if r.alive()]
    for record in owned:
        send_signal(record, signal.SIGTERM, group=group)

    def left() -> list[int]:
        return [r.pid for r in owned if r.alive() or (group and group_alive(r.pid))]

    if not _wait_gone(left, grace, 0.1):
        return []
    for record in owned:
        # The process itself (it may lead no group), then what is left of its group.
        send_signal(record, signal.SIGKILL, group=False)
        if group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(record.pid, signal.SIGKILL)
    survivors = set(_wait_gone(left, 5.0, 0.05))
    return [r for r in owned if r.pid in survivors]


def stop_all(processes: Sequence[ManagedProcess], *, grace: float = 10.0, group: bool = True) -> bool:
    """:func:`stop` these processes together, then reap them; whether all are gone."""
    survivors = stop([p.record for p in processes], grace=grace, group=group)
    for process in processes:
        if process.record not in survivors:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.popen.wait(5)
    return not survivors


class ManagedProcess:
    """A program this process started: its record (what another process needs to stop it) and its handle."""

    def __init__(self, popen: subprocess.Popen[bytes], record: ProcessRecord) -> None:
        self.popen = popen
        self.record = record

    @classmethod
    def spawn(
        cls,
        name: str,
        argv: Sequence[str],
        log: Path,
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ManagedProcess:
        """Start ``argv`` in a new session (its own process group) with its output appended to ``log``."""
        with log.open("ab") as out:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=None if env is None else dict(env),
                start_new_session=True,
            )
        # A program that exits at once has no start time left to read: it can never be signalled.
        started = started_at(popen.pid) or 0.0
        return cls(popen, ProcessRecord(name=name, pid=popen.pid, started=started, log=log))

    @property
    def pid(self) -> int:
        """Its process id (and process group id)."""
        return self.popen.pid

    @property
    def log(self) -> Path:
        """Its output."""
        return self.record.log

    def alive(self) -> bool:
        """Whether it still runs."""
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The end of its log."""
        return log_tail(self.log, lines)

    def wait_ready(
        self,
        probe: str | Callable[[], bool],
        *,
        timeout: float,
        what: str,
        interval: float = 0.25,
        wait: WaitFor = wait_for,
    ) -> None:
        """Poll ``probe`` (a URL that must answer 200, or a callable) until it holds.

        Raises :class:`ProcessNotReadyError`, with the end of the log, as soon as the program exits, or when
        ``timeout`` seconds pass first.
        """
        check = partial(answers, probe) if isinstance(probe, str) else probe

        def ready() -> bool:
            if not self.alive():
                raise ProcessNotReadyError(
                    f"{self.record.name} exited with {self.popen.returncode} before {what}; "
                    f"the end of its log ({self.log}):\n{self.tail()}"
                )
            return check()

        try:
            wait(ready, timeout=timeout, interval=interval, what=what, fatal=(ProcessNotReadyError,))
        except WaitTimeoutError as error:
            log = f"the end of the {self.record.name} log ({self.log}):\n{self.tail()}"
            raise ProcessNotReadyError(f"{error}\n{log}") from None

    def signal(self, sig: signal.Signals, *, group: bool = True) -> None:
        """Send ``sig`` to its process group, or (``group=False``) to it alone, as Kubernetes signals pid 1."""
        send_signal(self.record, sig, group=group)

    def wait(self, timeout: float) -> int:
        """Wait for it to exit; its exit status (raises ``subprocess.TimeoutExpired`` if it runs on)."""
        return self.popen.wait(timeout)

    def stop(self, grace: float = 10.0, *, group: bool = True) -> bool:
        """SIGTERM it (its group, unless ``group=False``), SIGKILL its group after ``grace`` seconds, reap it;
        whether it is gone."""
        return stop_all([self], grace=grace, group=group)
