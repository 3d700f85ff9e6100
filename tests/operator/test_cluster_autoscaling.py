"""Autoscaled services on a real control plane with fake Neuron nodes: the ScaledObject, the scale subresource.

KEDA and Prometheus themselves run in ``tests/realnode/test_autoscaling.py``; here the API server serves KEDA's
own CRD (or not), and the test plays the HPA by writing the scale subresource as it does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.services import Services

from neuronfleet.devcluster.cluster import LocalCluster
from neuronfleet.devcluster.operator_process import OperatorProcess
from neuronfleet.devcluster.status import condition, phase_of
from neuronfleet.devcluster.waiting import WaitFor
from neuronfleet.operator.kube import DEPLOYMENTS, SERVICES_NIS, Kube

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


@pytest.fixture
def scaling_operator(
    cluster: LocalCluster, namespace: str, crds: Path, wait_for: WaitFor, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator with a Prometheus address, as the chart runs it with autoscaling enabled."""
    running = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path, resync_seconds=5.0, prometheus=PROMETHEUS)
    running.start(wait_for)
    try:
        yield running
    finally:
        running.stop()
        print(f"--- operator log ---\n{running.tail(60)}")


def autoscaling_condition(body: Obj) -> tuple[str, str, str] | None:
    found = condition(body, "Autoscaling")
    return None if found is None else (found["status"], found["reason"], found.get("message", ""))


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
