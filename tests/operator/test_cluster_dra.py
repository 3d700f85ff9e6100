"""Neuron devices through DRA on a real control plane: fake trn2u nodes publish their devices as the Neuron DRA
driver does (ResourceSlices), the operator writes each replica's claim, and the real kube-scheduler and
controllers allocate, refuse and evict."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.services import Services, is_ready, serving_pods
from kubernetes.client import ApiClient

from neuronfleet.contract import dra
from neuronfleet.contract.hardware import NEURON_TAINT_KEY
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.controlplane import devices
from neuronfleet.devcluster.controlplane.fleet import InstanceShape, NodePool
from neuronfleet.devcluster.controlplane.status import condition
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator.cluster.kube import DEVICE_CLASSES, NOT_FOUND, PODS, ApiError, Kube, Resource
from neuronfleet.operator.policy.conditions import Reason

pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]

NODES_V1 = Resource("", "v1", "nodes", "Node")
SLICES = Resource("resource.k8s.io", "v1", "resourceslices", "ResourceSlice")
CLAIMS = Resource("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim")
TAINT_RULES = Resource("resource.k8s.io", "v1", "devicetaintrules", "DeviceTaintRule")

#: An instance type no other test's fleet has, so only these tests' replicas land on these nodes.
INSTANCE = "trn2u.48xlarge"
POOL = NodePool("dra", InstanceShape.neuron(INSTANCE), count=2)
#: Node addresses clear of the default fleet's.
FIRST_HOST = 100

SPEC = {
    "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
    "instanceType": INSTANCE,
    # 16 logical NeuronCores at LNC=2: four devices, one connected group of 4.
    "engine": {"max_num_seqs": 8, "tensor_parallel_size": 16},
    "compile": {"artifactStore": "s3://neuronfleet-test/neff", "resources": {"cpu": "1", "memory": "1Gi"}},
    "drain": {"preStopSeconds": 0, "drainTimeoutSeconds": 1},
}


def create(api: Kube, resource: Resource, body: Obj, namespace: str | None = None) -> Obj:
    return api.request("POST", resource.path(namespace), body=body)


def delete(api: Kube, resource: Resource, name: str, namespace: str | None = None) -> None:
    try:
        api.request("DELETE", resource.path(namespace, name))
    except ApiError as error:
        if error.status != NOT_FOUND:
            raise


@pytest.fixture(scope="module")
def dra_nodes(kube: ApiClient) -> Iterator[list[str]]:
    """Two trn2u nodes whose 16 devices each the Neuron DRA driver publishes, and its DeviceClass: an operator
    started after it (``auto``) hands out devices through DRA."""
    api = Kube(kube)
    nodes = POOL.nodes(first_host=FIRST_HOST)
    names = [node["metadata"]["name"] for node in nodes]
    create(api, DEVICE_CLASSES, devices.device_class())
    for node in nodes:
        create(api, NODES_V1, node)
        create(api, SLICES, devices.resource_slice(node["metadata"]["name"], INSTANCE))
    try:
        yield names
    finally:
        for name in names:
            delete(api, SLICES, f"{name}-{dra.DRIVER}")
            delete(api, NODES_V1, name)
        delete(api, DEVICE_CLASSES, dra.DEVICE_CLASS)


def allocated(api: Kube, namespace: str, pod: Obj) -> tuple[str, list[str]]:
    """The node and the devices of a serving pod's Neuron claim, as the scheduler allocated them."""
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim = api.request("GET", CLAIMS.path(namespace, status["resourceClaimName"]))
    results = claim["status"]["allocation"]["devices"]["results"]
    pools = {r["pool"] for r in results}
    assert len(pools) == 1
    assert {r["driver"] for r in results} == {dra.DRIVER}
    return pools.pop(), sorted(r["device"] for r in results)


def groups_of(node: str, held: list[str]) -> set[str]:
    """The connected groups of 4 that ``held`` devices of ``node`` belong to."""
    return {devices.group_id(node, 4, int(device.removeprefix("neurondevice"))) for device in held}


def placements(api: Kube, namespace: str, name: str) -> dict[str, tuple[str, list[str]]]:
    return {p["metadata"]["name"]: allocated(api, namespace, p) for p in serving_pods(api, namespace, name)}


def ready_pods(api: Kube, namespace: str, name: str, replicas: int) -> list[Obj]:
    pods = serving_pods(api, namespace, name)
    scheduled = [p for p in pods if is_ready(p) and p["status"].get("resourceClaimStatuses")]
    return scheduled if len(scheduled) == replicas == len(pods) else []


def test_replicas_claim_whole_connected_groups_wait_with_the_schedulers_reason_then_spill_to_a_freed_node(
    dra_nodes: list[str], api: Kube, operator: OperatorProcess, services: Services, namespace: str, wait_for: WaitFor
) -> None:
    first, second = dra_nodes
    # Devices 0, 4, 8 and 12 of the first node taken: 12 free devices there, but no free group of 4.
    create(api, CLAIMS, blocker_claim(namespace), namespace)
    create(api, PODS, blocker_pod(namespace, first), namespace)
    wait_for(
        lambda: api.get(PODS, namespace, "blocker") or {},
        lambda pod: bool(pod) and is_ready(pod),
        timeout=30,
        what="the blocker pod running",
    )

    services.create("llama", {**SPEC, "replicas": 4})
    services.wait_ready("llama", timeout=90)
    placed = placements(api, namespace, "llama")
    print(f"4 replicas: {placed}")
    # Every replica on the second node, each in one group of 4, no device twice.
    assert {node for node, _ in placed.values()} == {second}
    assert all(len(groups_of(second, held)) == 1 for _, held in placed.values())
    assert len({d for _, devs in placed.values() for d in devs}) == 16

    # A fifth replica has no group left: the service says why, in the scheduler's words.
    services.patch_spec("llama", {"replicas": 5})
    waiting = services.wait(
        "llama", lambda b: condition(b, "Ready").get("reason") == Reason.INSUFFICIENT_NEURON_CAPACITY, "unplaceable"
    )
    message = condition(waiting, "Ready")["message"]
    print(f"the fifth replica: {waiting['status']['phase']}: {message}")
    assert "cannot allocate all claims" in message

    # The first node freed: the fifth replica lands there, in one group.
    freed_at = time.monotonic()
    api.delete(PODS, namespace, "blocker")
    services.wait_ready("llama", generation=2, timeout=60)
    pods = wait_for(lambda: ready_pods(api, namespace, "llama", 5), timeout=30, what="five placed replicas")
    print(f"the fifth replica Ready {time.monotonic() - freed_at:.1f} s after the first node was freed")
    fifth = [allocated(api, namespace, p) for p in pods if allocated(api, namespace, p)[0] == first]
    assert len(fifth) == 1
    assert len(groups_of(first, fifth[0][1])) == 1


def test_a_device_tainted_no_execute_evicts_its_replica_and_the_replacement_avoids_it(
    dra_nodes: list[str], api: Kube, operator: OperatorProcess, services: Services, namespace: str, wait_for: WaitFor
) -> None:
    services.create("llama", {**SPEC, "replicas": 2})
    services.wait_ready("llama", timeout=90)
    pods = wait_for(lambda: ready_pods(api, namespace, "llama", 2), timeout=30, what="two placed replicas")
    victim, bystander = (p["metadata"]["name"] for p in pods)
    node, held = allocated(api, namespace, pods[0])
    tainted = held[0]

    rule = taint_rule(f"{namespace}-hbm", node, tainted)
    create(api, TAINT_RULES, rule)
    tainted_at = time.monotonic()
    try:
        wait_for(
            lambda: api.get(PODS, namespace, victim),
            lambda pod: pod is None or bool(pod["metadata"].get("deletionTimestamp")),
            timeout=30,
            what=f"{victim} evicted",
        )
        evicted_s = time.monotonic() - tainted_at
        replaced = wait_for(
            lambda: ready_pods(api, namespace, "llama", 2),
            # ready_pods gives [] until both are placed and ready: an empty list is not "replaced".
            lambda pods: bool(pods) and victim not in {p["metadata"]["name"] for p in pods},
            timeout=60,
            what="two placed replicas again, the evicted one replaced",
        )
        replaced_s = time.monotonic() - tainted_at
        now = [allocated(api, namespace, p) for p in replaced]
        print(f"tainted {node}/{tainted}: {victim} evicted in {evicted_s:.1f} s, replaced in {replaced_s:.1f} s: {now}")
        assert (node, tainted) not in {(where, device) for where, held in now for device in held}
        # Only the replica on the tainted device went.
        assert bystander in {p["metadata"]["name"] for p in replaced}
    finally:
        delete(api, TAINT_RULES, rule["metadata"]["name"])


def blocker_claim(namespace: str) -> Obj:
    expression = f"device.attributes['{dra.DRIVER}'].{dra.DEVICE_ID} % 4 == 0"
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "blocker", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "every-fourth",
                        "exactly": {
                            "deviceClassName": dra.DEVICE_CLASS,
                            "count": 4,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def blocker_pod(namespace: str, node: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "blocker", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "neuron", "resourceClaimName": "blocker"}],
            "containers": [{"name": "hold", "image": "hold", "resources": {"claims": [{"name": "neuron"}]}}],
        },
    }


def taint_rule(name: str, node: str, device: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": dra.DRIVER, "pool": node, "device": device},
            "taint": {"key": f"{dra.DRIVER}/hbm-uncorrectable", "value": "nc3", "effect": "NoExecute"},
        },
    }
