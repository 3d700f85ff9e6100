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

from neuronfleet.devcluster.addons.autoscaling_rig import keda_crds
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.kwok import COMPLETE_AFTER_ANNOTATION
from neuronfleet.devcluster.controlplane.status import condition, phase_of
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator.cluster.kube import DEPLOYMENTS, SCALED_OBJECTS, SERVICES_NIS, Kube
from neuronfleet.operator.policy import scaling

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
