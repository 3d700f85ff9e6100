"""Fake nodes shaped like the EC2 instances the operator schedules onto, managed by KWOK."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: KWOK manages only nodes carrying this annotation (``--manage-nodes-with-annotation-selector``).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"

#: Extended resources the Neuron device plugin advertises.
NEURON_DEVICE = "aws.amazon.com/neuron"
NEURON_CORE = "aws.amazon.com/neuroncore"

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
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

    @property
    def is_neuron(self) -> bool:
        """Whether the instance carries Neuron devices (and so the Neuron taint)."""
        return self.neuron_devices > 0


# trn2: 16 Trainium2 devices of 8 physical cores, exposed as 4 logical cores each at the default LNC=2.
TRN2_48XLARGE = InstanceShape("trn2.48xlarge", cpu=192, memory_gib=2048, neuron_devices=16, neuron_cores=64)
# inf2: Inferentia2 devices of 2 NeuronCores each.
INF2_XLARGE = InstanceShape("inf2.xlarge", cpu=4, memory_gib=16, neuron_devices=1, neuron_cores=2)
INF2_48XLARGE = InstanceShape("inf2.48xlarge", cpu=192, memory_gib=768, neuron_devices=12, neuron_cores=24)
# Compile Jobs and the operator run on plain CPU nodes.
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
        resources[NEURON_DEVICE] = str(shape.neuron_devices)
        resources[NEURON_CORE] = str(shape.neuron_cores)
        # Keeps pods that do not ask for Neuron devices off these (expensive) nodes, as on EKS.
        taints.append({"key": NEURON_DEVICE, "effect": "NoSchedule"})
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
