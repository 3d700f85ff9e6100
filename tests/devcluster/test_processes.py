"""Managed processes: stopped by recorded pid and start time, whole process group included; ready waits."""

from __future__ import annotations

import http.server
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from neuronfleet.devcluster.process.managed import (
    ManagedProcess,
    ProcessNotReadyError,
    ProcessRecord,
    answers,
    free_ports,
    is_alive,
    started_at,
    stop,
)
from neuronfleet.devcluster.process.waiting import wait_for


def test_stop_ends_the_process_group(tmp_path: Path) -> None:
    # The shell forks a child: both must go, as a component's helpers would.
    child = ManagedProcess.spawn(
        "sh", ["sh", "-c", "sleep 600 & echo $! > child.pid; wait"], tmp_path / "log", cwd=tmp_path
    )
    grandchild = int(wait_for(lambda: (tmp_path / "child.pid").read_text().strip(), timeout=10, what="child.pid"))

    assert stop([child.record], grace=5) == []
    child.wait(timeout=5)

    assert not is_alive(child.pid)
    assert not is_alive(grandchild)


def test_stop_kills_a_group_member_that_outlives_its_leader(tmp_path: Path) -> None:
    # The leader exits on SIGTERM; its child ignores SIGTERM, as vLLM's engine core can.
    script = "(trap '' TERM; exec sleep 600) & echo $! > child.pid; trap 'exit 0' TERM; wait"
    leader = ManagedProcess.spawn("sh", ["sh", "-c", script], tmp_path / "log", cwd=tmp_path)
    member = int(wait_for(lambda: (tmp_path / "child.pid").read_text().strip(), timeout=10, what="child.pid"))

    assert stop([leader.record], grace=1) == []
    leader.wait(timeout=5)

    assert not is_alive(member)


def test_a_recycled_pid_is_not_signalled(tmp_path: Path) -> None:
    child = ManagedProcess.spawn("sleep", ["sleep", "600"], tmp_path / "log", cwd=tmp_path)
    try:
        record = child.record
        stale = ProcessRecord(name="old", pid=record.pid, started=record.started - 1, log=record.log)

        assert not stale.alive()
        assert stop([stale], grace=0.1) == []
        assert record.alive()
    finally:
        child.popen.send_signal(signal.SIGKILL)
        child.wait(timeout=5)


def test_the_start_time_of_a_missing_or_exited_process_is_none(tmp_path: Path) -> None:
    child = ManagedProcess.spawn("true", ["true"], tmp_path / "log", cwd=tmp_path)
    # A zombie until reaped, and a zombie already counts as gone.
    wait_for(lambda: started_at(child.pid), lambda started: started is None, timeout=10, what="the process to exit")
    child.wait(timeout=5)
    assert started_at(child.pid) is None


def test_sigterm_to_the_process_alone_spares_its_group(tmp_path: Path) -> None:
    # As Kubernetes signals a container's pid 1: the program decides what its children do.
    script = "trap 'exit 0' TERM; sleep 600 & echo $! > child.pid; wait"
    child = ManagedProcess.spawn("sh", ["sh", "-c", script], tmp_path / "log", cwd=tmp_path)
    grandchild = int(wait_for(lambda: (tmp_path / "child.pid").read_text().strip(), timeout=10, what="child.pid"))
    try:
        child.signal(signal.SIGTERM, group=False)
        assert child.wait(timeout=5) == 0
        assert is_alive(grandchild)
    finally:
        orphan = ProcessRecord(name="sleep", pid=grandchild, started=started_at(grandchild) or 0, log=child.log)
        assert stop([orphan], grace=5, group=False) == []


def test_wait_ready_stops_at_once_when_the_program_exits(tmp_path: Path) -> None:
    child = ManagedProcess.spawn("sh", ["sh", "-c", "echo cannot bind; exit 3"], tmp_path / "log", cwd=tmp_path)
    with pytest.raises(ProcessNotReadyError, match=r"(?s)sh exited with 3 before it listens.*cannot bind"):
        # Far longer than the test may take: the exit must end the wait.
        child.wait_ready(lambda: False, timeout=300, what="it listens")


def test_wait_ready_on_timeout_shows_the_log(tmp_path: Path) -> None:
    child = ManagedProcess.spawn("sh", ["sh", "-c", "echo starting; sleep 600"], tmp_path / "log", cwd=tmp_path)
    try:
        with pytest.raises(ProcessNotReadyError, match=r"(?s)timed out after 0.3 s waiting for it listens.*starting"):
            child.wait_ready(lambda: False, timeout=0.3, interval=0.05, what="it listens")
    finally:
        assert child.stop(grace=5)


@pytest.fixture
def http_server() -> Iterator[str]:
    """A loopback HTTP server that answers 200 on / and 404 elsewhere."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/" else 404)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_answers_is_a_200_and_nothing_else(http_server: str) -> None:
    (closed,) = free_ports(1)
    assert answers(f"{http_server}/")
    assert not answers(f"{http_server}/missing")
    assert not answers(f"http://127.0.0.1:{closed}/")


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20


def test_stop_kills_a_process_that_ignores_sigterm_and_leads_no_group(tmp_path: Path) -> None:
    script = "(trap '' TERM; exec sleep 600) & echo $! > child.pid; wait"
    leader = ManagedProcess.spawn("sh", ["sh", "-c", script], tmp_path / "log", cwd=tmp_path)
    member = int(wait_for(lambda: (tmp_path / "child.pid").read_text().strip(), timeout=10, what="child.pid"))
    record = ProcessRecord(name="sleep", pid=member, started=started_at(member) or 0, log=leader.log)

    assert stop([record], grace=0.5, group=False) == []
    assert not is_alive(member)
    assert stop([leader.record], grace=5) == []
    leader.wait(timeout=5)
