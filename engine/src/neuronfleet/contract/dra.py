"""The Neuron DRA driver's names: what its ResourceSlices publish, and what a claim may ask of it.

Dynamic Resource Allocation (``resource.k8s.io/v1``) hands out Neuron devices through AWS's driver
``neuron.aws.com``: each device of a node is published with attributes, among them the NeuronLink group
of 4, 8 or 16 devices it belongs to, and a claim sets the logical-NeuronCore setting of its devices
in an opaque config. The operator writes claims from these names and the rig publishes fake nodes'
devices with them, so both stay in step. Source: the Neuron documentation's "Neuron DRA driver" page
(deploy/eks/dra.rst, "Attributes Reference") and its example claims (deploy/files/specs/).
"""

from __future__ import annotations

from neuronfleet.contract.hardware import InstanceType

#: The driver's name in ResourceSlices and opaque configs, and the DeviceClass the Neuron Helm chart installs.
DRIVER = "neuron.aws.com"
DEVICE_CLASS = "neuron.aws.com"
#: The opaque config a claim sets the logical-NeuronCore setting with.
CONFIG_API_VERSION = "neuron.aws.com/v1"
CONFIG_KIND = "NeuronConfig"
#: What a container is handed with its devices, read by the Neuron runtime: the logical NeuronCores it may reserve
#: (ranges over the node, "0-3,8-11") and the logical-NeuronCore setting they are counted at. The driver sets both
#: for a claim (the rig's plugin through CDI, ``tools/dra``); with the device plugin the operator sets the setting.
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
#: Device attributes in the driver's domain (``device.attributes['neuron.aws.com'].<name>`` in CEL).
DEVICE_ID = "deviceId"
INSTANCE_TYPE = "instanceType"
RESOURCE_TYPE = "resourceType"
#: ``resourceType`` of one Neuron device (``neuron_node`` stands for a whole UltraServer node).
NEURON_DEVICE = "neuron_device"


def connected_group_attribute(size: int) -> str:
    """The attribute naming a device's NeuronLink group of ``size`` devices (EFA-enabled instances)."""
    return f"resource.aws.com/devicegroup{size}_id"


def connected_group(instance: InstanceType, devices: int) -> int | None:
    """The smallest NeuronLink group of ``instance`` that holds ``devices`` devices; ``None`` where one device
    needs none, or the instance names no groups (a claim's devices then share only its node)."""
    if devices < 2:
        return None
    return next((size for size in instance.connected_groups if size >= devices), None)
