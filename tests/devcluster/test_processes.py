"""Processes are stopped by recorded pid and start time, whole process group included."""

from __future__ import annotations

import signal
from pathlib import Path

from neuronfleet.devcluster.processes import ProcessRecord, is_alive, spawn, start_ticks, stop
from neuronfleet.devcluster.waiting import wait_for


def test_stop_ends_the_process_group(tmp_path: Path) -> None:
    # The shell forks a child: both must go, as a component's helpers would.
    child, record = spawn("sh", ["sh", "-c", "sleep 600 & echo $! > child.pid; wait"], tmp_path / "log", cwd=tmp_path)
    grandchild = int(wait_for(lambda: (tmp_path / "child.pid").read_text().strip(), timeout=10, what="child.pid"))

    assert stop([record], grace=5) == []
    child.wait(timeout=5)

    assert not is_alive(record.pid)
    assert not is_alive(grandchild)


def test_a_recycled_pid_is_not_signalled(tmp_path: Path) -> None:
    child, record = spawn("sleep", ["sleep", "600"], tmp_path / "log", cwd=tmp_path)
    try:
        stale = ProcessRecord(name="old", pid=record.pid, start_ticks=record.start_ticks - 1, log=record.log)

        assert not is_alive(stale.pid, stale.start_ticks)
        assert stop([stale], grace=0.1) == []
        assert is_alive(record.pid, record.start_ticks)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_start_ticks_of_a_missing_or_exited_process_is_none(tmp_path: Path) -> None:
    child, record = spawn("true", ["true"], tmp_path / "log", cwd=tmp_path)
    # A zombie until reaped, and a zombie already counts as gone.
    wait_for(lambda: start_ticks(record.pid), lambda ticks: ticks is None, timeout=10, what="the process to exit")
    child.wait()
    assert start_ticks(record.pid) is None
