"""Autoscaled services on a real control plane with fake Neuron nodes: the ScaledObject, the scale subresource,
and which pods a scale-in removes.

KEDA runs in ``tests/realnode/test_autoscaling.py``; here the API server serves KEDA's own CRD (or not), and the
test plays the HPA by writing the scale subresource as it does. For scale-in, a real Prometheus scrapes the
requests each fake pod holds (as its engine would publish them) and the controller manager's own ReplicaSet
controller removes pods.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.fleet import pod_ready
from harness.services import Services
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from neuronfleet.contract import metrics
from neuronfleet.contract.names import SERVICE_METRIC_LABEL
from neuronfleet.devcluster.addons.autoscaling_rig import keda_crds
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.kwok import COMPLETE_AFTER_ANNOTATION
from neuronfleet.devcluster.controlplane.status import condition, phase_of
from neuronfleet.devcluster.process.managed import ManagedProcess, free_ports
from neuronfleet.devcluster.process.tools import ToolsMissingError, bin_dir
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator import plan
from neuronfleet.operator.cluster.kube import DEPLOYMENTS, PODS, SCALED_OBJECTS, SERVICES_NIS, Kube
from neuronfleet.operator.policy import scaling
from neuronfleet.operator.reconcilers.scale_in import query_by_pod

pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]
PROMETHEUS = "http://prometheus.monitoring:9090"
SPEC: Obj = {
    "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
    "engine": {"max_num_seqs": 8, "num_seqs_buckets": [1, 2, 4, 8], "tensor_parallel_size": 4},
    "autoscaling": {"minReplicas": 2, "maxReplicas": 4},
    "compile": {"artifactStore": "s3://neuronfleet-test/neff", "resources": {"cpu": "1", "memory": "1Gi"}},
    "drain": {"preStopSeconds": 1, "drainTimeoutSeconds": 5},
}


def operator_querying(
    prometheus: str, cluster: LocalCluster, namespace: str, wait_for: WaitFor, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator with a Prometheus address, as the chart runs it with autoscaling enabled; its log after."""
    running = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path, resync_seconds=5.0, prometheus=prometheus)
    running.start(wait_for)
    try:
        yield running
    finally:
        running.stop()
        print(f"--- operator log ---\n{running.tail(60)}")


@pytest.fixture
def scaling_operator(
    cluster: LocalCluster, namespace: str, crds: Path, wait_for: WaitFor, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator with an address no Prometheus answers at (nothing here queries it)."""
    yield from operator_querying(PROMETHEUS, cluster, namespace, wait_for, tmp_path)


def autoscaling_condition(body: Obj) -> tuple[str, str, str] | None:
    found = condition(body, "Autoscaling")
    return (found["status"], found["reason"], found.get("message", "")) if found else None


def test_without_keda_the_service_serves_its_minimum_and_says_why_it_cannot_scale(
    services: Services, scaling_operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    services.create("llama", SPEC)
    ready = services.wait(
        "llama", lambda b: phase_of(b) == "Ready" and autoscaling_condition(b) is not None, "Ready", timeout=90
    )
    assert autoscaling_condition(ready) == (
        "False",
        "AutoscalingUnavailable",
        "KEDA is not installed: the cluster serves no keda.sh ScaledObject",
    )
    assert ready["status"]["desiredReplicas"] == 2
    # Started at minReplicas through the scale subresource, which cannot be read without spec.replicas.
    assert ready["spec"]["replicas"] == 2
    assert api.request("GET", SERVICES_NIS.path(namespace, "llama", "scale"))["spec"]["replicas"] == 2
    deployment = api.get(DEPLOYMENTS, namespace, "llama")
    assert deployment is not None
    assert deployment["spec"]["replicas"] == 2

    # What KEDA's HPA does: write the scale subresource. The operator follows it, within the bounds.
    api.merge_patch(SERVICES_NIS, namespace, "llama", {"spec": {"replicas": 3}}, subresource="scale")
    scaled = wait_for(
        lambda: api.get(DEPLOYMENTS, namespace, "llama") or {},
        lambda found: found.get("spec", {}).get("replicas") == 3,
        what="the Deployment to follow the scale subresource",
        show=lambda found: found.get("spec", {}).get("replicas"),
    )
    assert scaled["spec"]["replicas"] == 3
    scale = api.request("GET", SERVICES_NIS.path(namespace, "llama", "scale"))
    assert scale["spec"]["replicas"] == 3
    services.wait("llama", lambda b: b["status"].get("desiredReplicas") == 3, "desiredReplicas 3")


@pytest.fixture
def keda_crd(cluster: LocalCluster) -> Iterator[Path]:
    """KEDA's own ScaledObject CRD (from the pinned release that ``make tools`` builds), served for one test."""
    path = keda_crds() / "keda.sh_scaledobjects.yaml"
    cluster.install_crds(path, "KEDA's ScaledObject CRD")
    try:
        yield path
    finally:
        cluster.kubectl("delete", "-f", str(path), "--wait=false")


def test_the_scaled_object_waits_for_a_served_revision_and_goes_with_autoscaling(
    services: Services, scaling_operator: OperatorProcess, api: Kube, namespace: str, keda_crd: Path
) -> None:
    # The compile takes a while, so for the first part no revision serves.
    slow = {**SPEC, "compile": {**SPEC["compile"], "podAnnotations": {COMPLETE_AFTER_ANNOTATION: "15s"}}}
    services.create("llama", slow)
    paused = services.wait("llama", lambda b: autoscaling_condition(b) is not None, "an Autoscaling condition")
    assert phase_of(paused) == "Compiling"
    assert autoscaling_condition(paused) == (
        "False",
        "ScalingPaused",
        "paused until a revision is compiled and serving (between 2 and 4 replicas)",
    )
    scaled_object = api.get(SCALED_OBJECTS, namespace, "llama")
    assert scaled_object is not None
    assert scaled_object["metadata"]["annotations"] == {scaling.PAUSED_ANNOTATION: "true"}
    assert scaled_object["spec"]["scaleTargetRef"] == {
        "apiVersion": "neuronfleet.io/v1alpha1",
        "kind": "NeuronInferenceService",
        "name": "llama",
    }
    assert scaled_object["spec"]["triggers"][0]["metadata"]["serverAddress"] == PROMETHEUS
    assert api.get(DEPLOYMENTS, namespace, "llama") is None

    # Compiled and serving: the operator's apply drops the pause.
    scaling_now = services.wait(
        "llama", lambda b: (autoscaling_condition(b) or ("",))[0] == "True", "Autoscaling=True", timeout=90
    )
    assert autoscaling_condition(scaling_now) == (
        "True",
        "Scaling",
        "KEDA scales between 2 and 4 replicas on vllm:num_requests_waiting (target 4/replica)",
    )
    unpaused = api.get(SCALED_OBJECTS, namespace, "llama")
    assert unpaused is not None
    assert scaling.PAUSED_ANNOTATION not in (unpaused["metadata"].get("annotations") or {})

    # Autoscaling removed: the ScaledObject and the condition go, replicas are the user's again.
    services.patch_spec("llama", {"autoscaling": None, "replicas": 1})
    plain = services.wait("llama", lambda b: autoscaling_condition(b) is None, "no Autoscaling condition")
    assert plain["status"]["desiredReplicas"] == 1
    assert api.get(SCALED_OBJECTS, namespace, "llama") is None


class InFlight:
    """The requests each serving pod holds, as the pods' engines would publish them, and a real Prometheus
    scraping them every second (the pod and service labels as the chart's PodMonitor gives them)."""

    def __init__(self, directory: Path, namespace: str) -> None:
        binary = bin_dir("prometheus") / "prometheus"
        if not binary.is_file():
            raise ToolsMissingError(f"Prometheus is not built ({binary} is missing): run `make tools`")
        directory.mkdir(parents=True)
        listen, port = free_ports(2)
        registry = CollectorRegistry()
        labels = ["namespace", SERVICE_METRIC_LABEL, "pod"]
        self.gauge = Gauge(metrics.REQUESTS_IN_FLIGHT, "in flight", labels, registry=registry)
        self.namespace = namespace
        self.server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
        job = {"job_name": "engines", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
        config = directory / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [job]}))
        argv = [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{listen}",
            "--log.level=warn",
        ]
        self.url = f"http://127.0.0.1:{listen}"
        self.process = ManagedProcess.spawn("prometheus", argv, directory / "prometheus.log")
        self.process.wait_ready(f"{self.url}/-/ready", timeout=60, what="Prometheus ready")

    def hold(self, service: str, held: dict[str, int]) -> None:
        """Publish each pod's requests in flight."""
        for pod, count in held.items():
            self.gauge.labels(self.namespace, service, pod).set(count)

    def scraped(self, service: str) -> dict[str, float]:
        """What the operator's query reads now."""
        return query_by_pod(self.url, scaling.in_flight_query(self.namespace, service))

    def stop(self) -> None:
        self.process.stop()
        self.server.shutdown()


@pytest.fixture
def in_flight(tmp_path: Path, namespace: str) -> Iterator[InFlight]:
    running = InFlight(tmp_path / "prometheus", namespace)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def ranking_operator(
    cluster: LocalCluster, namespace: str, wait_for: WaitFor, tmp_path: Path, in_flight: InFlight
) -> Iterator[OperatorProcess]:
    """The operator querying the real Prometheus."""
    yield from operator_querying(in_flight.url, cluster, namespace, wait_for, tmp_path)


def serving_pods(api: Kube, namespace: str) -> list[Obj]:
    """The service's pods not being deleted, oldest first."""
    pods = api.list(PODS, namespace, plan.serving_pod_selector("llama"))
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return sorted(live, key=lambda p: (p["metadata"]["creationTimestamp"], p["metadata"]["name"]))


def test_scale_in_removes_the_replicas_holding_fewest_requests(
    services: Services, ranking_operator: OperatorProcess, in_flight: InFlight, api: Kube, namespace: str,
    wait_for: WaitFor,
) -> None:  # fmt: skip
    """Left to itself the ReplicaSet controller removes the newest Ready pods first; here the newest holds most, so
    each step removes an older one, the one holding fewest."""
    services.create("llama", {**SPEC, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}})
    services.wait("llama", lambda b: (b.get("status") or {}).get("desiredReplicas") == 1, "started at minReplicas")
    api.merge_patch(SERVICES_NIS, namespace, "llama", {"spec": {"replicas": 3}}, subresource="scale")
    # Ready: only among Ready pods does the ReplicaSet go by their costs.
    pods = wait_for(
        lambda: serving_pods(api, namespace),
        lambda found: len(found) == 3 and all(pod_ready(p) for p in found),
        timeout=120,
        what="three serving pods Ready",
        show=lambda found: [(p["metadata"]["name"], pod_ready(p)) for p in found],
    )
    oldest, middle, newest = (p["metadata"]["name"] for p in pods)

    def scale_to(replicas: int, held: dict[str, int]) -> tuple[set[str], dict[str, str | None]]:
        # Prometheus holds the figures before the HPA (this test) writes the scale subresource.
        in_flight.hold("llama", held)
        wait_for(lambda: in_flight.scraped("llama"), lambda found: found == held, what=f"Prometheus scraped {held}")
        api.merge_patch(SERVICES_NIS, namespace, "llama", {"spec": {"replicas": replicas}}, subresource="scale")
        left = wait_for(
            lambda: serving_pods(api, namespace),
            lambda found: len(found) == replicas,
            what=f"{replicas} pods left",
            show=lambda found: [p["metadata"]["name"] for p in found],
        )
        costs = {
            p["metadata"]["name"]: (p["metadata"].get("annotations") or {}).get(scaling.DELETION_COST_ANNOTATION)
            for p in left
        }
        return {p["metadata"]["name"] for p in left}, costs

    assert scale_to(2, {oldest: 0, middle: 2, newest: 5}) == ({middle, newest}, {middle: "2", newest: "5"})
    # The load moved: now the middle one holds nothing.
    assert scale_to(1, {oldest: 0, middle: 0, newest: 3}) == ({newest}, {newest: "3"})
