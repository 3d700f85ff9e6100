"""Fake nodes shaped like the EC2 instances the operator schedules onto, managed by KWOK."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from neuronfleet.contract.hardware import (
    INSTANCE_TYPE_LABEL,
    NEURON_CORE_RESOURCE,
    NEURON_DEVICE_RESOURCE,
    NEURON_TAINT_KEY,
    get_instance_type,
)

#: KWOK manages only nodes carrying this annotation (``--manage-nodes-with-annotation-selector``).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"

ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
#: The pool a fake node belongs to, so tests can select a pool without naming instance types.
POOL_LABEL = "neuronfleet.io/pool"

REGION = "us-east-2"
#: Node InternalIPs (pods get theirs from KWOK's pod CIDR).
NODE_NETWORK = ipaddress.ip_network("10.240.0.0/16")


@dataclass(frozen=True)
class InstanceShape:
    """What one instance type offers the scheduler."""

    instance_type: str
    cpu: int
    memory_gib: int
    neuron_devices: int = 0
    neuron_cores: int = 0
    max_pods: int = 110

    @classmethod
    def neuron(cls, instance_type: str) -> InstanceShape:
        """A Neuron instance type's shape: host and devices as the hardware catalogue has them."""
        instance = get_instance_type(instance_type)
        return cls(instance_type, instance.vcpus, instance.memory_gib, instance.devices, instance.cores)

    @property
    def is_neuron(self) -> bool:
        """Whether the instance carries Neuron devices (and so the Neuron taint)."""
        return self.neuron_devices > 0


TRN2_48XLARGE = InstanceShape.neuron("trn2.48xlarge")
INF2_48XLARGE = InstanceShape.neuron("inf2.48xlarge")
# Compile Jobs and the operator run on plain CPU nodes: 32 vCPUs, 128 GiB
# (https://aws.amazon.com/ec2/instance-types/m7i/).
M7I_8XLARGE = InstanceShape("m7i.8xlarge", cpu=32, memory_gib=128)


@dataclass(frozen=True)
class NodePool:
    """``count`` identical nodes named ``<name>-<i>``, spread over ``zones`` in turn."""

    name: str
    shape: InstanceShape
    count: int
    zones: tuple[str, ...] = (f"{REGION}a", f"{REGION}b")

    def nodes(self, first_host: int = 1) -> list[dict[str, Any]]:
        """The pool's Node manifests, with InternalIPs counted up from host ``first_host`` of the node network."""
        return [
            node_manifest(f"{self.name}-{i}", self, self.zones[i % len(self.zones)], str(NODE_NETWORK[first_host + i]))
            for i in range(self.count)
        ]


def fleet_nodes(fleet: Iterable[NodePool]) -> list[dict[str, Any]]:
    """The Node manifests of every pool, each with its own InternalIP."""
    nodes: list[dict[str, Any]] = []
    for pool in fleet:
        nodes += pool.nodes(first_host=len(nodes) + 1)
    return nodes


#: The fleet a local cluster starts with.
DEFAULT_FLEET = (
    NodePool("trn2", TRN2_48XLARGE, count=2),
    NodePool("inf2", INF2_48XLARGE, count=1),
    NodePool("cpu", M7I_8XLARGE, count=2),
)


def node_manifest(name: str, pool: NodePool, zone: str, address: str) -> dict[str, Any]:
    """A Node as a real cluster would show it (labels, taint, capacity), marked for KWOK to run."""
    shape = pool.shape
    resources = {
        "cpu": str(shape.cpu),
        "memory": f"{shape.memory_gib}Gi",
        "pods": str(shape.max_pods),
        "ephemeral-storage": "500Gi",
    }
    taints: list[dict[str, str]] = []
    if shape.is_neuron:
        resources[NEURON_DEVICE_RESOURCE] = str(shape.neuron_devices)
        resources[NEURON_CORE_RESOURCE] = str(shape.neuron_cores)
        # Keeps pods that do not ask for Neuron devices off these (expensive) nodes, as on EKS.
        taints.append({"key": NEURON_TAINT_KEY, "effect": "NoSchedule"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                INSTANCE_TYPE_LABEL: shape.instance_type,
                ZONE_LABEL: zone,
                REGION_LABEL: REGION,
                POOL_LABEL: pool.name,
                "type": "kwok",
            },
        },
        "spec": {"taints": taints},
        # Created with the status KWOK keeps; its stages add the conditions a kubelet would.
        "status": {
            "capacity": resources,
            "allocatable": dict(resources),
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
        },
    }
