"""Neuron instance types: devices per node and logical NeuronCores per device.

Tensor parallelism is counted in logical NeuronCores. On Trn2 the default
logical-NeuronCore setting (LNC=2) pairs the 8 physical cores of a device into
4 logical ones; Trn1 and Inf2 devices have 2 NeuronCores each. Pods request
whole devices (``aws.amazon.com/neuron``), as the Neuron device plugin hands
them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronfleet.engine.identity import NeuronTarget

#: The extended resource the Neuron device plugin advertises, one per device.
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neuron"
#: The taint EKS Neuron node groups carry; serving pods tolerate it, compile pods do not.
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
#: The well-known node label serving pods select on.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


@dataclass(frozen=True)
class InstanceType:
    """One Neuron instance size."""

    name: str
    target: NeuronTarget
    devices: int
    cores_per_device: int
    chip: str

    @property
    def cores(self) -> int:
        """Logical NeuronCores on one node: the most tensor parallelism one replica can use."""
        return self.devices * self.cores_per_device

    def devices_for(self, tensor_parallel_size: int) -> int:
        """The fewest devices that hold ``tensor_parallel_size`` logical NeuronCores."""
        return -(-tensor_parallel_size // self.cores_per_device)


def _family(target: NeuronTarget, chip: str, cores_per_device: int, sizes: dict[str, int]) -> list[InstanceType]:
    return [InstanceType(name, target, devices, cores_per_device, chip) for name, devices in sizes.items()]


#: Known sizes, from the AWS instance type pages (Trn2 with the default LNC=2).
INSTANCE_TYPES: dict[str, InstanceType] = {
    instance.name: instance
    for instance in [
        *_family("trn2", "Trainium2", 4, {"trn2.3xlarge": 1, "trn2.48xlarge": 16, "trn2u.48xlarge": 16}),
        *_family("trn1", "Trainium", 2, {"trn1.2xlarge": 1, "trn1.32xlarge": 16, "trn1n.32xlarge": 16}),
        *_family(
            "inf2", "Inferentia2", 2, {"inf2.xlarge": 1, "inf2.8xlarge": 1, "inf2.24xlarge": 6, "inf2.48xlarge": 12}
        ),
    ]
}
