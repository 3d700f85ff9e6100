"""The autoscaling rig end to end: a real Prometheus scrapes a pod on the real node, a KEDA ScaledObject with a
prometheus trigger drives the controller manager's real HPA, which scales a plain Deployment up and back down.

The metric comes from a tiny gauge pod (the base image's Python), labelled as the operator labels its serving
pods, so the rig scrapes it exactly as it scrapes the engines. The test sets the gauge through the API
server's pod proxy and records the HPA and the Deployment every second: the assertions are on that
timeline, not only on where it ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from neuronfleet.contract.names import LABEL_SERVICE, MANAGED_BY_LABEL, OPERATOR_NAME, SERVICE_METRIC_LABEL
from neuronfleet.devcluster.addons.autoscaling_rig import SCRAPED_PORT, AutoscalingRig
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.api import Api
from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode.node import pinned_here

Obj = dict[str, Any]
METRIC = "rig_level"
GAUGE_PORT = 8080
#: Replicas while the gauge is high: threshold 1 per replica, AverageValue, so desired = ceil(level / 1).
HIGH = 3
#: A gauge on /metrics in Prometheus's text format; PUT /level/N sets it.
GAUGE_SERVER = f"""
import http.server, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
level = 0
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"# TYPE {METRIC} gauge\\n{METRIC} {{level}}\\n".encode()
        self.send_response(200); self.send_header("Content-Type", "text/plain; version=0.0.4"); self.end_headers()
        self.wfile.write(body)
    def do_PUT(self):
        global level
        level = int(self.path.rsplit("/", 1)[1])
        self.send_response(204); self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("", {GAUGE_PORT}), Handler).serve_forever()
"""
IDLE = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(86400)"
#: Labels the operator puts on serving pods (``neuronfleet.operator.plan``): the rig's Prometheus keeps these pods and
#: names their service in label ``neuronfleet_io_service``, which the trigger's query selects on.
SERVICE = "gauge"
SERVING_LABELS = {MANAGED_BY_LABEL: OPERATOR_NAME, LABEL_SERVICE: SERVICE}


def container(name: str, script: str, **extra: Any) -> Obj:
    """A container from the base image running ``script`` with Python."""
    return {
        "name": name,
        "image": node_images.BASE_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "-c", script],
        **extra,
    }


def pod_spec(*containers: Obj) -> Obj:
    """A pod spec on the real node, as the base image's non-root user."""
    return {
        "securityContext": {"runAsNonRoot": True, "runAsUser": node_images.BASE_USER_UID},
        "terminationGracePeriodSeconds": 2,
        "containers": list(containers),
        **pinned_here(),
    }


def scaled_object(name: str, namespace: str, prometheus_url: str) -> Obj:
    """KEDA scaling Deployment ``name`` between 1 and HIGH on the gauge, with short windows for the test."""
    fast = [{"type": "Pods", "value": HIGH, "periodSeconds": 1}]
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"name": name},
            "minReplicaCount": 1,
            "maxReplicaCount": HIGH,
            "pollingInterval": 2,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {"stabilizationWindowSeconds": 0, "policies": fast},
                        "scaleDown": {"stabilizationWindowSeconds": 5, "policies": fast},
                    }
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": f'max({METRIC}{{namespace="{namespace}",{SERVICE_METRIC_LABEL}="{SERVICE}"}})',
                        "threshold": "1",
                    },
                }
            ],
        },
    }


@dataclass(frozen=True)
class Sample:
    """One second of the timeline."""

    at: float
    #: The gauge as the test set it.
    level: int
    #: The trigger's value as the HPA last read it (through the adapter), None before its first read.
    metric: str | None
    #: The HPA's desired replicas.
    desired: int | None
    #: The Deployment's replicas (what the HPA set) and its ready pods.
    replicas: int
    ready: int


@dataclass
class Scene:
    """The test's namespace, its gauge pod and Deployment, and the API that reaches them."""

    api: Api
    namespace: str
    gauge: str
    workers: str

    def set_level(self, level: int) -> None:
        """Set the gauge, through the API server's pod proxy (the egress proxy, then the pod network)."""
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.gauge}:{GAUGE_PORT}/proxy/level/{level}"
        self.api.request("PUT", path)

    def hpa(self) -> Obj | None:
        """The HPA KEDA made for the workers."""
        return self.api.get(
            f"/apis/autoscaling/v2/namespaces/{self.namespace}/horizontalpodautoscalers/keda-hpa-{self.workers}"
        )

    def workers_now(self) -> tuple[int, int]:
        """The workers' replicas and ready replicas."""
        found = self.api.get(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.workers}") or {}
        return int(found.get("spec", {}).get("replicas", 0)), int(found.get("status", {}).get("readyReplicas", 0))


@pytest.fixture
def scene(real_cluster: LocalCluster) -> Iterator[Scene]:
    """A fresh namespace holding the gauge pod (Ready and scraped) and a one-replica Deployment; deleted after."""
    namespace = f"as-{uuid.uuid4().hex[:8]}"
    with real_cluster.admin_api() as api:
        api.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        try:
            wait_for(
                lambda: api.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default"),
                timeout=30,
                what=f"ServiceAccount default in {namespace}",
            )
            probe = {"httpGet": {"path": "/metrics", "port": SCRAPED_PORT}, "periodSeconds": 1}
            gauge = container(
                "gauge",
                GAUGE_SERVER,
                ports=[{"name": SCRAPED_PORT, "containerPort": GAUGE_PORT}],
                readinessProbe=probe,
            )
            pod = {"metadata": {"name": "gauge", "labels": {**SERVING_LABELS, "app": "gauge"}}, "spec": pod_spec(gauge)}
            api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
            deployment = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "workers"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "workers"}},
                    "template": {"metadata": {"labels": {"app": "workers"}}, "spec": pod_spec(container("idle", IDLE))},
                },
            }
            api.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deployment)
            yield Scene(api, namespace, "gauge", "workers")
        finally:
            api.request("DELETE", f"/api/v1/namespaces/{namespace}")


def record(scene: Scene, level: int, begun: float) -> Sample:
    """What the HPA read and decided, and the workers, now."""
    status = (scene.hpa() or {}).get("status", {})
    metrics = status.get("currentMetrics") or [{}]
    metric = metrics[0].get("external", {}).get("current", {}).get("averageValue")
    replicas, ready = scene.workers_now()
    return Sample(round(time.monotonic() - begun, 1), level, metric, status.get("desiredReplicas"), replicas, ready)


def watch(
    scene: Scene, level: int, begun: float, until: Callable[[Sample], bool], timeout: float, what: str
) -> list[Sample]:
    """Samples every second until ``until(sample)`` holds (that sample included)."""
    samples: list[Sample] = []

    def observe() -> Sample:
        samples.append(record(scene, level, begun))
        return samples[-1]

    wait_for(observe, until, timeout=timeout, interval=1.0, what=what, show=lambda _: samples[-5:])
    return samples


def test_keda_scales_a_deployment_up_and_down_on_a_scraped_gauge(autoscaling_rig: AutoscalingRig, scene: Scene) -> None:
    begun = time.monotonic()
    query = f'{METRIC}{{namespace="{scene.namespace}",{SERVICE_METRIC_LABEL}="{SERVICE}"}}'
    wait_for(lambda: autoscaling_rig.value(query), lambda v: v == 0, timeout=60, interval=1, what="the gauge scraped")
    wait_for(scene.workers_now, lambda now: now == (1, 1), timeout=60, what="one ready worker")

    scene.api.request(
        "POST",
        f"/apis/keda.sh/v1alpha1/namespaces/{scene.namespace}/scaledobjects",
        scaled_object(scene.workers, scene.namespace, autoscaling_rig.prometheus_url),
    )
    # The HPA reads the trigger's metric through the aggregation layer and the adapter: a value means the path works.
    idle = watch(
        scene,
        0,
        begun,
        lambda s: s.metric == "0" and s.desired == 1,
        timeout=90,
        what="KEDA's HPA to read the metric at 0",
    )
    hpa = scene.hpa() or {}
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": scene.workers}
    assert [m["type"] for m in hpa["status"]["currentMetrics"]] == ["External"], hpa["status"]

    raised_at = time.monotonic() - begun
    scene.set_level(HIGH)
    wait_for(
        lambda: autoscaling_rig.value(query), lambda v: v == HIGH, timeout=30, interval=1, what="the raise scraped"
    )
    up = watch(scene, HIGH, begun, lambda s: s.ready == HIGH, timeout=120, what=f"{HIGH} ready workers")

    lowered_at = time.monotonic() - begun
    scene.set_level(0)
    down = watch(
        scene,
        0,
        begun,
        lambda s: s.desired == 1 and s.replicas == 1 and s.ready == 1,
        timeout=120,
        what="the workers back to one",
    )
    timeline = [*idle, *up, *down]
    print(f"\nraised at {raised_at:.1f} s, lowered at {lowered_at:.1f} s")
    print("     t  level  HPA read  desired  replicas  ready")
    for s in timeline:
        print(f"{s.at:6.1f}  {s.level:5}  {s.metric!s:>8}  {s.desired!s:>7}  {s.replicas:8}  {s.ready:5}")

    # Nothing scaled before the gauge rose, and nothing went past maxReplicaCount.
    assert all(s.desired in (None, 1) and s.replicas == 1 for s in idle), idle
    assert max(s.replicas for s in timeline) == HIGH
    # Up: the HPA read the raised gauge, and its count and the Deployment's only grew while the gauge was high.
    assert any(s.metric == str(HIGH) for s in up), up
    for column in ("desired", "replicas"):
        values = [getattr(s, column) for s in up]
        assert values == sorted(values), (column, up)
        assert values[-1] == HIGH, (column, up)
    # Down: HIGH until the HPA read the lowered gauge, then back to one without rising again.
    assert down[0].replicas == HIGH, down
    for column in ("desired", "replicas"):
        values = [getattr(s, column) for s in down]
        assert values == sorted(values, reverse=True), (column, down)
        assert values[-1] == 1, (column, down)
    print(f"rig started in {autoscaling_rig.started_in:.1f} s; scale-up/down took {time.monotonic() - begun:.1f} s")
