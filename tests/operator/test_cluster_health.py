"""Neuron health on a real control plane with fake Neuron nodes: a device fault or a node's fault condition takes
replicas out of service, replacements start on another node, and the service says so until it is whole."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness.services import Services, is_ready, sample, serving_pods
from kubernetes.client import ApiClient, CoreV1Api

from neuronfleet.contract.faults import NeuronRuntimeError, runtime_status, termination_message
from neuronfleet.contract.names import ANNOTATION_FAULT, LABEL_QUARANTINED, LABEL_SERVICE
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.controlplane.kwok import FAIL_ANNOTATION, FAIL_MESSAGE_ANNOTATION, READY_AFTER_ANNOTATION
from neuronfleet.devcluster.controlplane.status import condition
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator import plan
from neuronfleet.operator.cluster.kube import EVENTS, PODS, SERVICES_NIS, Kube
from neuronfleet.operator.metrics import QUARANTINED

pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]

SPEC = {
    "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
    "engine": {"max_num_seqs": 8, "tensor_parallel_size": 4},
    "replicas": 2,
    "compile": {"artifactStore": "s3://neuronfleet-test/neff", "resources": {"cpu": "1", "memory": "1Gi"}},
    "drain": {"preStopSeconds": 1, "drainTimeoutSeconds": 5},
    # Replacements take a while to turn Ready, so the service is seen Degraded meanwhile.
    "podAnnotations": {READY_AFTER_ANNOTATION: "3s"},
}
HBM = termination_message(NeuronRuntimeError(runtime_status("NRT_EXEC_HW_ERR_HBM_UE"), "nc 3, step 812"))


def all_pods(api: Kube, namespace: str, name: str) -> list[Obj]:
    return [
        p
        for p in api.list(PODS, namespace, plan.serving_pod_selector(name))
        if not p["metadata"].get("deletionTimestamp")
    ]


def quarantined(api: Kube, namespace: str, name: str) -> list[Obj]:
    return [p for p in all_pods(api, namespace, name) if LABEL_QUARANTINED in p["metadata"]["labels"]]


def events(api: Kube, namespace: str, name: str) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in api.list(EVENTS, namespace)
        if e["involvedObject"].get("kind") == SERVICES_NIS.kind and e["involvedObject"]["name"] == name
    ]


def whole(api: Kube, namespace: str, name: str, replicas: int) -> list[Obj]:
    pods = serving_pods(api, namespace, name)
    return pods if len(pods) == replicas and all(is_ready(p) for p in pods) else []


def test_a_device_fault_quarantines_its_replica_and_a_replacement_starts_on_another_node(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    services.create("llama", SPEC)
    services.wait_ready("llama")
    assert condition(services.get("llama"), "Degraded")["reason"] == "Healthy"
    faulty, healthy = sorted(serving_pods(api, namespace, "llama"), key=lambda p: p["metadata"]["name"])
    name, node = faulty["metadata"]["name"], faulty["spec"]["nodeName"]

    # Its engine stops on an uncorrectable HBM error and says so in its last words.
    api.merge_patch(
        PODS, namespace, name, {"metadata": {"annotations": {FAIL_ANNOTATION: "true", FAIL_MESSAGE_ANNOTATION: HBM}}}
    )
    degraded = services.wait(
        "llama", lambda b: condition(b, "Degraded").get("status") == "True", "Degraded for the device fault"
    )
    fault = condition(degraded, "Degraded")
    assert fault["reason"] == "NeuronDeviceFault"
    assert fault["message"].startswith(f"pod {name} on node {node}: NRT_EXEC_HW_ERR_HBM_UE (1201)"), fault
    (held,) = quarantined(api, namespace, "llama")
    assert held["metadata"]["name"] == name
    assert held["metadata"]["labels"][LABEL_QUARANTINED] == "device"
    assert LABEL_SERVICE not in held["metadata"]["labels"], "still selected by its Service and Deployment"
    assert held["metadata"]["annotations"][ANNOTATION_FAULT].startswith("NRT_EXEC_HW_ERR_HBM_UE (1201)")
    assert [ref["kind"] for ref in held["metadata"]["ownerReferences"]] == [SERVICES_NIS.kind]

    # A replacement is surged while the faulty pod stays, on another node; then the faulty pod goes.
    pods = wait_for(lambda: whole(api, namespace, "llama", 2), what="a replacement Ready beside the healthy replica")
    (replacement,) = [p for p in pods if p["metadata"]["name"] != healthy["metadata"]["name"]]
    assert replacement["spec"]["nodeName"] != node, "the replacement landed on the faulty pod's node"
    wait_for(lambda: not quarantined(api, namespace, "llama"), what="the quarantined pod deleted")
    # Degraded reads the pods, Ready the Deployment's status, which its controllers update a moment later.
    services.wait(
        "llama",
        lambda b: condition(b, "Degraded").get("reason") == "Healthy" and condition(b, "Ready").get("status") == "True",
        "healed: Healthy and Ready",
    )
    told = events(api, namespace, "llama")
    assert ("Warning", "ReplicaQuarantined") in {(t, r) for t, r, _ in told}, told
    assert ("Warning", "NeuronDeviceFault") in {(t, r) for t, r, _ in told}, told
    assert ("Normal", "QuarantineReleased", f"quarantined pod {name} deleted") in told
    samples = wait_for(operator.metrics, lambda s: sample(s, f"{QUARANTINED}_total", fault="device") == 1)
    assert sample(samples, f"{QUARANTINED}_total", fault="node") == 0


@pytest.fixture
def faulty_node(kube: ApiClient) -> Iterator[list[str]]:
    """Nodes the test gives a Neuron fault condition to; healthy again afterwards (the cluster is shared)."""
    faulted: list[str] = []
    yield faulted
    for node in faulted:
        set_neuron_health(kube, node, faulty=False)


def set_neuron_health(kube: ApiClient, node: str, *, faulty: bool) -> None:
    """The Neuron node problem detector's condition on ``node`` (a strategic merge keeps the others)."""
    reason = "NeuronHasError_DMA_ERROR" if faulty else "NeuronHealthy"
    state = {"type": "NeuronHealth", "status": str(faulty), "reason": reason, "message": "DMA engine error on device 2"}
    CoreV1Api(kube).patch_node_status(node, {"status": {"conditions": [state]}})


def test_a_node_fault_moves_replicas_off_the_node_until_its_condition_clears(
    services: Services,
    operator: OperatorProcess,
    api: Kube,
    kube: ApiClient,
    namespace: str,
    wait_for: WaitFor,
    faulty_node: list[str],
) -> None:
    services.create("llama", SPEC)
    services.wait_ready("llama")
    node = serving_pods(api, namespace, "llama")[0]["spec"]["nodeName"]
    on_node = sorted(
        p["metadata"]["name"] for p in serving_pods(api, namespace, "llama") if p["spec"]["nodeName"] == node
    )

    faulty_node.append(node)
    set_neuron_health(kube, node, faulty=True)
    degraded = services.wait("llama", lambda b: condition(b, "Degraded").get("status") == "True", "Degraded")
    assert condition(degraded, "Degraded")["reason"] == "NeuronNodeFault"
    assert (
        f"on node {node}: NeuronHasError_DMA_ERROR: DMA engine error on device 2"
        in condition(degraded, "Degraded")["message"]
    )

    # Every replica on the node is replaced elsewhere; the quarantined pods stay while the condition holds.
    pods = wait_for(lambda: whole(api, namespace, "llama", 2), what="two Ready replicas off the faulty node")
    assert all(p["spec"]["nodeName"] != node for p in pods), [p["spec"]["nodeName"] for p in pods]
    avoided = services.wait(
        "llama", lambda b: condition(b, "Degraded").get("reason") == "FaultyNodeAvoided", "the node avoided"
    )
    assert condition(avoided, "Degraded")["status"] == "False"
    assert sorted(p["metadata"]["name"] for p in quarantined(api, namespace, "llama")) == on_node
    # New replicas keep off the node while it is faulty.
    services.patch_spec("llama", {"replicas": 4})
    pods = wait_for(lambda: whole(api, namespace, "llama", 4), what="four Ready replicas")
    assert all(p["spec"]["nodeName"] != node for p in pods), [p["spec"]["nodeName"] for p in pods]

    # The condition clears: the quarantined pods go, and the service is healthy.
    set_neuron_health(kube, node, faulty=False)
    wait_for(lambda: not quarantined(api, namespace, "llama"), what="the quarantined pods deleted")
    services.wait("llama", lambda b: condition(b, "Degraded").get("reason") == "Healthy", "healthy")
    services.wait_ready("llama", generation=2)
