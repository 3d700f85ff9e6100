"""Start programs in their own sessions and stop them by recorded process id, never by name."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel


class ProcessRecord(BaseModel):
    """A started program, identified by pid plus start time so a recycled pid is never signalled."""

    name: str
    pid: int
    start_ticks: int
    log: Path


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None when no live process has this pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields are counted after its closing one.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # exited, waiting to be reaped
        return None
    return int(fields[19])


def is_alive(pid: int, ticks: int | None = None) -> bool:
    """Whether ``pid`` is a live process (and, given ``ticks``, still the same one)."""
    now = start_ticks(pid)
    return now is not None and (ticks is None or now == ticks)


def spawn(name: str, argv: Sequence[str], log: Path, *, cwd: Path) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start ``argv`` in a new session (its own process group) with output appended to ``log``."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )
    ticks = start_ticks(process.pid)
    return process, ProcessRecord(name=name, pid=process.pid, start_ticks=ticks or 0, log=log)


def _signal_group(record: ProcessRecord, sig: signal.Signals) -> None:
    if not is_alive(record.pid, record.start_ticks):
        return
    # The program leads its own session, so its group id is its pid; helpers it forked go too.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, sig)


def stop(records: Sequence[ProcessRecord], *, grace: float = 10.0) -> list[ProcessRecord]:
    """SIGTERM each process group, SIGKILL what outlives ``grace`` seconds; returns any still alive after that."""
    for record in records:
        _signal_group(record, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(r.pid, r.start_ticks) for r in records):
        time.sleep(0.1)
    for record in records:
        _signal_group(record, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(is_alive(r.pid, r.start_ticks) for r in records):
        time.sleep(0.05)
    return [r for r in records if is_alive(r.pid, r.start_ticks)]
