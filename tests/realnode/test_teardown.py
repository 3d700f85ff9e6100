"""Stopping a cluster with a real node leaves no process, network namespace or mount behind, even when
its kubelet and containerd died first (a crashed run leaves shims and containers running)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.process.managed import send_signal
from neuronfleet.devcluster.process.waiting import wait_for


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if text in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(cmdline)
    return found


def test_down_after_a_crash_leaves_nothing_behind() -> None:
    cluster = LocalCluster.start(f"pytest-down-{os.getpid()}", fleet=(), owner_pid=os.getpid(), real_node=True)
    workdir, netns = cluster.state.workdir, cluster.state.netns
    assert netns is not None
    try:
        pause = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "main", "image": node_images.PAUSE_IMAGE, "imagePullPolicy": "Never"}],
            },
        }
        with cluster.admin_api() as api:
            api.request("POST", "/api/v1/namespaces/default/pods", pause)
            wait_for(
                lambda: api.get("/api/v1/namespaces/default/pods/sleeper"),
                lambda found: (found or {}).get("status", {}).get("phase") == "Running",
                timeout=60,
                what="pod sleeper Running",
            )
        assert any("containerd-shim-runc-v2" in c for c in _processes_mentioning(str(workdir)))
        # The crash: kubelet and containerd die at once; the pod's shim and container run on.
        for record in cluster.state.processes:
            if record.name in ("kubelet", "containerd"):
                send_signal(record, signal.SIGKILL)
    finally:
        cluster.stop()
    assert _processes_mentioning(str(workdir)) == []
    assert not (Path("/var/run/netns") / netns).exists()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True, timeout=10).stdout
    assert netns not in listed.split()
    assert str(workdir) not in Path("/proc/self/mountinfo").read_text()
    assert not (workdir / REAL_NODE).exists()
