"""Real containers on the real node: probes, a Service through kube-proxy, Neuron capacity, preStop.

Every pod runs on ``real-0`` (pinned there: the ``real_cluster`` also has KWOK nodes) from the locally built
base image; all traffic stays inside the node's network namespace.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from neuronfleet.contract.hardware import NEURON_DEVICE_RESOURCE, NEURON_TAINT_KEY
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.api import Api
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode.capacity import neuron_capacity
from neuronfleet.devcluster.realnode.node import RealNode

Obj = dict[str, Any]
PODS = "/api/v1/namespaces/default/pods"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: Seconds the web server waits before it listens, so "not Ready yet" is observable.
WEB_DELAY = 4
#: A web server that answers with its uid once WEB_DELAY has passed, and exits on SIGTERM at once.
WEB_SERVER = f"""
import http.server, os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep({WEB_DELAY})
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"uid={{os.getuid()}}".encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("", 8080), Handler).serve_forever()
"""


def pod(name: str, command: list[str], **spec: Any) -> Obj:
    """A pod from the base image as its non-root user, pinned to the real node (it tolerates the Neuron taint)."""
    container = {"name": "main", "image": node_images.BASE_IMAGE, "imagePullPolicy": "Never", "command": command}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": node_images.BASE_USER_UID},
            "nodeSelector": {HOSTNAME_LABEL: REAL_NODE},
            "tolerations": [{"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [container],
            **spec,
        },
    }


def read(api: Api, name: str) -> Obj:
    """The pod named ``name`` (empty once it is gone)."""
    return api.get(f"{PODS}/{name}") or {}


def condition(found: Obj | None, kind: str) -> Obj | None:
    """The pod's condition of type ``kind``, if any."""
    conditions = (found or {}).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), None)


def _time(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.fixture
def api(real_cluster: LocalCluster) -> Iterator[Api]:
    """The real cluster's API as admin."""
    with real_cluster.admin_api() as client:
        yield client


@pytest.fixture
def web(api: Api) -> Iterator[str]:
    """A web server pod with an httpGet readiness probe (its name); deleted afterwards."""
    name = f"web-{uuid.uuid4().hex[:6]}"
    probe = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "failureThreshold": 1}
    api.request("POST", PODS, pod(name, ["python3", "-c", WEB_SERVER], container={"readinessProbe": probe}))
    yield name
    api.request("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0})


def test_pod_is_ready_only_once_it_answers(api: Api, web: str) -> None:
    running = wait_for(
        lambda: read(api, web),
        lambda found: (found or {}).get("status", {}).get("phase") == "Running",
        timeout=60,
        what=f"pod {web} Running",
        show=lambda found: (found or {}).get("status"),
    )
    # Running, but its server does not listen yet: the probe keeps it out of Ready.
    assert (condition(running, "Ready") or {}).get("status") == "False", running["status"]
    assert running["spec"]["nodeName"] == REAL_NODE
    ready = wait_for(
        lambda: read(api, web),
        lambda found: (condition(found, "Ready") or {}).get("status") == "True",
        timeout=60,
        what=f"pod {web} Ready",
        show=lambda found: (found or {}).get("status"),
    )
    started = _time(ready["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
    became_ready = _time((condition(ready, "Ready") or {})["lastTransitionTime"])
    assert (became_ready - started).total_seconds() >= WEB_DELAY - 1


def test_cluster_ip_answers_through_kube_proxy(
    api: Api, real_cluster: LocalCluster, real_node: RealNode, web: str
) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": web},
        "spec": {"selector": {"app": web}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    created = api.request("POST", "/api/v1/namespaces/default/services", service)
    try:
        cluster_ip = created["spec"]["clusterIP"]
        fetch = (
            f"import urllib.request; print(urllib.request.urlopen('http://{cluster_ip}/', timeout=2).read().decode())"
        )
        # From the node's namespace, as a node-local client: kube-proxy's rules DNAT the ClusterIP to the pod.
        answered = wait_for(
            lambda: real_node.in_netns(["python3", "-I", "-c", fetch], timeout=10),
            lambda result: result.returncode == 0,
            timeout=90,
            interval=1,
            what=f"Service {web} ({cluster_ip}) to answer from the node's namespace",
            show=lambda result: result.stderr[-300:],
        )
        assert answered.stdout.strip() == f"uid={node_images.BASE_USER_UID}"
        # The API server fetches the log from the kubelet through the egress proxy; it holds the server's
        # request lines (probes and the fetch) and nothing else: no runtime noise leaks into a pod's output.
        logs = real_cluster.kubectl("logs", web)
        assert logs.returncode == 0, logs.stderr
        lines = logs.stdout.splitlines()
        assert lines, "no log lines"
        assert all('"GET / HTTP/1.1" 200' in line for line in lines), lines
    finally:
        api.request("DELETE", f"/api/v1/namespaces/default/services/{web}")


def test_neuron_pods_fit_the_advertised_capacity(api: Api) -> None:
    devices = int(neuron_capacity("trn2.48xlarge")[NEURON_DEVICE_RESOURCE])
    suffix = uuid.uuid4().hex[:6]
    names = {"fits": f"neuron-{devices}-{suffix}", "too-big": f"neuron-{devices + 1}-{suffix}"}
    for count, name in ((devices, names["fits"]), (devices + 1, names["too-big"])):
        limits = {NEURON_DEVICE_RESOURCE: str(count)}
        api.request("POST", PODS, pod(name, ["sleep", "3600"], container={"resources": {"limits": limits}}))
    try:
        fits = wait_for(
            lambda: read(api, names["fits"]),
            lambda found: (found or {}).get("status", {}).get("phase") == "Running",
            timeout=60,
            what="the pod within capacity Running",
            show=lambda found: (found or {}).get("status"),
        )
        assert fits["spec"]["nodeName"] == REAL_NODE
        unscheduled = wait_for(
            lambda: condition(read(api, names["too-big"]), "PodScheduled") or {},
            lambda found: found.get("reason") == "Unschedulable",
            timeout=30,
            what="the pod over capacity to be Unschedulable",
        )
        assert f"Insufficient {NEURON_DEVICE_RESOURCE}" in unscheduled["message"]
        assert read(api, names["too-big"])["status"]["phase"] == "Pending"
    finally:
        for name in names.values():
            api.request("DELETE", f"{PODS}/{name}", {"gracePeriodSeconds": 0})


def test_delete_runs_prestop_and_ends_within_grace(api: Api, real_cluster: LocalCluster) -> None:
    name = f"stopper-{uuid.uuid4().hex[:6]}"
    # A directory on the node's disk, writable by the pod's user, outlives the pod.
    marks = real_cluster.state.workdir / REAL_NODE / f"marks-{name}"
    marks.mkdir()
    marks.chmod(0o777)
    grace = 20
    hook = {"exec": {"command": ["sh", "-c", "id -u > /marks/prestop"]}}
    # PID 1 ignores a SIGTERM it has no handler for: the pod is Ready only once the handler is installed,
    # so a delete that lands while Python is still starting cannot leave the kubelet waiting out the grace.
    armed = "/tmp/sigterm-handled"
    program = (
        "import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        f"pathlib.Path({armed!r}).touch(); time.sleep(3600)"
    )
    spec = pod(
        name,
        ["python3", "-c", program],
        container={
            "lifecycle": {"preStop": hook},
            "readinessProbe": {"exec": {"command": ["test", "-f", armed]}, "periodSeconds": 1},
            "volumeMounts": [{"name": "marks", "mountPath": "/marks"}],
        },
        terminationGracePeriodSeconds=grace,
        volumes=[{"name": "marks", "hostPath": {"path": str(marks), "type": "Directory"}}],
    )
    api.request("POST", PODS, spec)
    wait_for(
        lambda: read(api, name),
        lambda found: (condition(found, "Ready") or {}).get("status") == "True",
        timeout=60,
        what=f"pod {name} Ready (its SIGTERM handler installed)",
        show=lambda found: (found or {}).get("status"),
    )
    deleted = time.monotonic()
    api.request("DELETE", f"{PODS}/{name}")
    wait_for(lambda: read(api, name), lambda found: not found, timeout=grace + 10, what=f"pod {name} gone")
    assert time.monotonic() - deleted < grace
    assert Path(marks / "prestop").read_text().strip() == str(node_images.BASE_USER_UID)
    events = api.request("GET", f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name={name}")
    killing = [e for e in events["items"] if e["reason"] == "Killing" and e["source"].get("component") == "kubelet"]
    assert killing, [e["reason"] for e in events["items"]]
    assert "Stopping container main" in killing[0]["message"]


def test_capacity_is_advertised_again_once_lost(api: Api) -> None:
    capacity = neuron_capacity("trn2.48xlarge")
    # What a kubelet that registers the node anew starts with: no extended resources.
    lost = {"status": {"capacity": dict.fromkeys(capacity)}}
    path = f"/api/v1/nodes/{REAL_NODE}"
    patched = api.request("PATCH", f"{path}/status", lost, content_type="application/merge-patch+json")
    assert not set(capacity) & set(patched["status"].get("capacity", {})), "the patch removed nothing"
    wait_for(
        lambda: api.get(path) or {},
        lambda found: all(
            found["status"].get(field, {}).get(resource) == value
            for field in ("capacity", "allocatable")
            for resource, value in capacity.items()
        ),
        timeout=30,
        what="the Neuron capacity advertised again (capacity and allocatable)",
        show=lambda found: {f: found.get("status", {}).get(f) for f in ("capacity", "allocatable")},
    )
