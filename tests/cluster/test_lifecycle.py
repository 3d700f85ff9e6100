"""`neuronfleet-dev cluster`: start, inspect, and reap a cluster whose owner crashed, leaving nothing behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.programs import run_program

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.process.managed import is_alive

CLI = str(Path(sys.executable).parent / "neuronfleet-dev")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_program([CLI, *args], timeout=150, env={**os.environ, "COLUMNS": "120", "NO_COLOR": "1"})


def port_is_free(port: int) -> bool:
    """Nothing listens on it (closed connections may linger in TIME_WAIT, which servers bind over)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def owner() -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for a test run that will crash: the cluster is tied to it."""
    process = subprocess.Popen(["sleep", "600"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_cluster_of_a_crashed_owner_is_reaped_without_leaks(owner: subprocess.Popen[bytes]) -> None:
    name = f"reap-{uuid.uuid4().hex[:8]}"
    started = cli("cluster", "up", "--name", name, "--owner-pid", str(owner.pid))
    assert started.returncode == 0, started.stderr
    cluster = LocalCluster.find(name)
    assert cluster is not None
    assert f"export KUBECONFIG={cluster.kubeconfig}" in started.stdout
    assert cli("cluster", "status", "--name", name).returncode == 0
    records = cluster.state.processes
    assert sorted(r.name for r in records) == sorted(
        ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
    )

    owner.kill()  # the "test run" dies without stopping its cluster
    owner.wait()
    reaped = cli("cluster", "reap")

    assert reaped.returncode == 0, reaped.stderr
    assert name in reaped.stdout
    assert [r.name for r in records if is_alive(r.pid, r.started)] == []
    assert [p for p in cluster.state.ports.values() if not port_is_free(p)] == []
    assert not cluster.state.workdir.exists()
    assert LocalCluster.find(name) is None


def test_status_and_kubeconfig_find_a_running_cluster(cluster: LocalCluster) -> None:
    status = cli("cluster", "status", "--name", cluster.name)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "down" not in status.stdout
    assert cli("cluster", "kubeconfig", "--name", cluster.name).stdout.strip() == str(cluster.kubeconfig)


@pytest.mark.parametrize("command", ["down", "status", "kubeconfig"])
def test_unknown_cluster_is_one_line_and_exit_2(command: str) -> None:
    result = cli("cluster", command, "--name", "no-such-cluster")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: no cluster named 'no-such-cluster' (start one with `neuronfleet-dev cluster up --name no-such-cluster`)"
    ]


def test_a_name_that_is_no_file_name_is_refused() -> None:
    result = cli("cluster", "up", "--name", "../etc")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: invalid cluster name '../etc': use 1-40 lowercase letters, digits and dashes"
    ]
