"""Fake Neuron nodes' devices as the Neuron DRA driver publishes them: a DeviceClass and a ResourceSlice a node.

What the kubelet plugin of ``neuron.aws.com`` would write for a node, so the real kube-scheduler allocates
claims against it, as Kubernetes' own scheduler benchmarks do for their fake nodes: one pool per node, one
device per Neuron device (``neurondevice<i>``), with the attributes the Neuron documentation lists (device id,
instance type, resource type, 4x4 topology position) and the NeuronLink groups of 4, 8 and 16 devices
(``resource.aws.com/devicegroup<N>_id``, an opaque id shared by the group's devices).
"""

from __future__ import annotations

import hashlib
from typing import Any

from neuronfleet.contract import dra
from neuronfleet.contract.hardware import get_instance_type

Obj = dict[str, Any]

#: A node's devices sit on a 4x4 torus (Trn1, Trn2): their row and column attributes.
TORUS_SIDE = 4


def device_class() -> Obj:
    """The DeviceClass the Neuron Helm chart installs with the driver."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": dra.DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{dra.DRIVER}'"}}]},
    }


def group_id(node: str, size: int, index: int) -> str:
    """The opaque id of the group of ``size`` devices that device ``index`` of ``node`` belongs to."""
    return hashlib.sha256(f"{node}/{size}/{index // size}".encode()).hexdigest()[:16]


def neuron_device(node: str, instance_type: str, index: int) -> Obj:
    """Device ``index`` of a node, with its attributes."""
    instance = get_instance_type(instance_type)
    attributes: Obj = {
        dra.DEVICE_ID: {"int": index},
        dra.INSTANCE_TYPE: {"string": instance_type},
        dra.RESOURCE_TYPE: {"string": dra.NEURON_DEVICE},
        "topology_x": {"int": index % TORUS_SIDE},
        "topology_y": {"int": index // TORUS_SIDE},
    }
    for size in instance.connected_groups:
        attributes[dra.connected_group_attribute(size)] = {"string": group_id(node, size, index)}
    return {"name": f"neurondevice{index}", "attributes": attributes}


def resource_slice(node: str, instance_type: str) -> Obj:
    """All of a node's Neuron devices, as one pool named after the node."""
    devices = [neuron_device(node, instance_type, i) for i in range(get_instance_type(instance_type).devices)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{dra.DRIVER}"},
        "spec": {
            "driver": dra.DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
