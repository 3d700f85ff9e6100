"""The Neuron hardware catalogue: every instance type neuronfleet runs on, defined once.

The CRD's ``instanceType`` enum and its CEL maps, the operator's device counts,
the simulated device's cost model, the fake cluster's node shapes and the
compile target of an instance type all read this table. It depends on the
standard library alone, so the operator imports it without vLLM.

Tensor parallelism counts logical NeuronCores. At the default logical-NeuronCore
setting (LNC=2) a Trainium2 device pairs its 8 physical NeuronCore-v3 into 4
logical cores, and a Trainium3 device its 8 NeuronCore-v4; Trainium and Inferentia2
devices have 2 NeuronCore-v2 each, one logical core each (LNC=1, their only setting).
A Trainium2 or Trainium3 workload may set LNC=1 instead: 8 logical cores a device, each
half as strong. Pods get whole devices, from the Neuron device plugin or its DRA driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: Neuron compiler targets: the instance family a graph is compiled for.
NeuronTarget = Literal["trn1", "trn2", "trn3", "inf2"]

#: Every instance type the catalogue holds, in its order: the CRD's enum. A static type, so the
#: names are written twice: mypy checks each entry below against it, a test that none is missing.
InstanceTypeName = Literal[
    "trn2.3xlarge",
    "trn2.48xlarge",
    "trn2u.48xlarge",
    "trn3.48xlarge",
    "trn1.2xlarge",
    "trn1.32xlarge",
    "trn1n.32xlarge",
    "inf2.xlarge",
    "inf2.8xlarge",
    "inf2.24xlarge",
    "inf2.48xlarge",
]
#: The instance type a service runs on, and the simulated device stands for, when none is named.
DEFAULT_INSTANCE_TYPE: InstanceTypeName = "trn2.48xlarge"

#: The extended resources the Neuron device plugin advertises: devices, and logical NeuronCores.
NEURON_DEVICE_RESOURCE = "aws.amazon.com/neuron"
NEURON_CORE_RESOURCE = "aws.amazon.com/neuroncore"
#: The taint EKS Neuron node groups carry; serving pods tolerate it, compile pods do not.
NEURON_TAINT_KEY = "aws.amazon.com/neuron"
#: The well-known node label serving pods select on.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"

GIB = 1024**3

_NEURON_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest"
_NEURON_HARDWARE = f"{_NEURON_DOCS}/general/arch/neuron-hardware"
_TRN2_ARCH = f"{_NEURON_HARDWARE}/trn2-arch.html"
_TRAINIUM2_ARCH = f"{_NEURON_DOCS}/about-neuron/arch/neuron-hardware/trainium2.html"
_TRN2_INSTANCES = "https://aws.amazon.com/ec2/instance-types/trn2/"
_TRAINIUM3_ARCH = f"{_NEURON_DOCS}/about-neuron/arch/neuron-hardware/trainium3.html"
_TRN3_ARCH = f"{_NEURON_DOCS}/about-neuron/arch/neuron-hardware/trn3-arch.html"
_TRN1_ARCH = f"{_NEURON_HARDWARE}/trn1-arch.html"
_TRAINIUM_ARCH = f"{_NEURON_HARDWARE}/trainium.html"
_INF2_ARCH = f"{_NEURON_HARDWARE}/inf2-arch.html"


@dataclass(frozen=True)
class Chip:
    """One kind of Neuron device: the figures of each device of an instance."""

    name: str
    target: NeuronTarget
    #: Physical NeuronCores per device.
    physical_cores: int
    #: Peak dense BF16 TFLOPS.
    bf16_tflops: float
    hbm_bytes: int
    #: HBM bandwidth, bytes per second.
    hbm_bandwidth: float
    source: str
    #: The logical-NeuronCore settings (physical cores per logical core) the chip takes; the first is its default.
    lnc_settings: tuple[int, ...] = (1,)

    @property
    def default_lnc(self) -> int:
        """The logical-NeuronCore setting the Neuron runtime uses unless a workload sets one."""
        return self.lnc_settings[0]

    @property
    def cores(self) -> int:
        """Logical NeuronCores per device at the default setting: the unit ``tensor_parallel_size`` counts."""
        return self.logical_cores(None)

    def logical_cores(self, lnc: int | None) -> int:
        """Logical NeuronCores per device at setting ``lnc`` (``None``: the default)."""
        return self.physical_cores // (self.default_lnc if lnc is None else lnc)


# Eight NeuronCore-v3 (4 logical at LNC=2): 667 dense BF16 TFLOPS, 96 GiB of HBM at 2.9 TB/s.
TRAINIUM2 = Chip("Trainium2", "trn2", 8, 667.0, 96 * GIB, 2.9e12, f"{_TRN2_ARCH}; {_TRAINIUM2_ARCH}", (2, 1))
# Eight NeuronCore-v4 (4 logical at LNC=2, the default): 671 dense BF16 TFLOPS, 144 GiB of HBM at 4.9 TB/s.
# The bandwidth is the Trainium3 and Trn3 architecture pages' (a Gen1 UltraServer's 313.6 TB/s over its 64
# devices); the NKI Trainium3 architecture guide says 4.7 TB/s.
TRAINIUM3 = Chip("Trainium3", "trn3", 8, 671.0, 144 * GIB, 4.9e12, f"{_TRAINIUM3_ARCH}; {_TRN3_ARCH}", (2, 1))
# Two NeuronCore-v2: 190 BF16 TFLOPS, 32 GiB of HBM at 820 GiB/s.
TRAINIUM = Chip("Trainium", "trn1", 2, 190.0, 32 * GIB, 820.0 * GIB, _TRAINIUM_ARCH)
# Two NeuronCore-v2: 190 BF16 TFLOPS, 32 GiB of HBM at 820 GiB/s (the same figures as Trainium).
INFERENTIA2 = Chip("Inferentia2", "inf2", 2, 190.0, 32 * GIB, 820.0 * GIB, _INF2_ARCH)


@dataclass(frozen=True)
class InstanceType:
    """One EC2 Neuron instance size: its devices, and the host around them."""

    name: InstanceTypeName
    chip: Chip
    devices: int
    vcpus: int
    memory_gib: int
    source: str
    #: Sizes of the NeuronLink-connected device groups the Neuron DRA driver names (``neuronfleet.contract.dra``).
    connected_groups: tuple[int, ...] = ()

    @property
    def target(self) -> NeuronTarget:
        """The compile target of the instance's family."""
        return self.chip.target

    @property
    def cores_per_device(self) -> int:
        """Logical NeuronCores per device."""
        return self.chip.cores

    @property
    def cores(self) -> int:
        """Logical NeuronCores on one node at the default setting: the most tensor parallelism one replica can use."""
        return self.devices * self.chip.cores

    def cores_at(self, lnc: int | None) -> int:
        """Logical NeuronCores on one node at logical-NeuronCore setting ``lnc`` (``None``: the default)."""
        return self.devices * self.chip.logical_cores(lnc)

    def devices_for(self, tensor_parallel_size: int, lnc: int | None = None) -> int:
        """The fewest devices that hold ``tensor_parallel_size`` logical NeuronCores at setting ``lnc``."""
        return -(-tensor_parallel_size // self.chip.logical_cores(lnc))


#: A 16-device node's NeuronLink groups: 4, 8 and all 16 devices (the Neuron DRA driver's ``devicegroup<N>_id``).
_GROUPS_OF_16 = (4, 8, 16)

INSTANCE_TYPES: dict[str, InstanceType] = {
    instance.name: instance
    for instance in (
        # One Trainium2, 12 vCPUs, 128 GiB (the AWS Trn2 page; the Neuron docs list only the 48xlarge).
        InstanceType("trn2.3xlarge", TRAINIUM2, 1, 12, 128, _TRN2_INSTANCES),
        # 16 Trainium2, 192 vCPUs, 2,048 GiB (10.7 PFLOPS, 1,536 GiB of HBM, 46.4 TB/s in all);
        # trn2u.48xlarge is the same node, four of them make a Trn2 UltraServer.
        InstanceType("trn2.48xlarge", TRAINIUM2, 16, 192, 2048, _TRN2_ARCH, _GROUPS_OF_16),
        InstanceType("trn2u.48xlarge", TRAINIUM2, 16, 192, 2048, _TRN2_ARCH, _GROUPS_OF_16),
        # One server of a Trn3 Gen1 UltraServer: 16 Trainium3, 192 vCPUs, 2,048 GiB (the UltraServer's 64
        # devices, 768 vCPUs and 8,192 GiB over its 4 servers). The name is the Neuron Helm chart's
        # (neuronInstances, chart 1.10.0), not yet in a customer-facing table; the chart also names trn3n.48xlarge,
        # trn3en.24xlarge and trn3s-es.48xlarge, and Gen2 UltraServers hold 4 devices a server, whose size no
        # source ties to a name yet.
        InstanceType("trn3.48xlarge", TRAINIUM3, 16, 192, 2048, _TRN3_ARCH, _GROUPS_OF_16),
        # 1 Trainium, 8 vCPUs, 32 GiB; 16 Trainium, 128 vCPUs, 512 GiB (3,040 TFLOPS, 512 GiB of HBM).
        InstanceType("trn1.2xlarge", TRAINIUM, 1, 8, 32, _TRN1_ARCH),
        InstanceType("trn1.32xlarge", TRAINIUM, 16, 128, 512, _TRN1_ARCH, _GROUPS_OF_16),
        InstanceType("trn1n.32xlarge", TRAINIUM, 16, 128, 512, _TRN1_ARCH, _GROUPS_OF_16),
        # 1, 1, 6 and 12 Inferentia2 (the 48xlarge: 2,280 TFLOPS, 384 GiB of HBM).
        InstanceType("inf2.xlarge", INFERENTIA2, 1, 4, 16, _INF2_ARCH),
        InstanceType("inf2.8xlarge", INFERENTIA2, 1, 32, 128, _INF2_ARCH),
        InstanceType("inf2.24xlarge", INFERENTIA2, 6, 96, 384, _INF2_ARCH),
        InstanceType("inf2.48xlarge", INFERENTIA2, 12, 192, 768, _INF2_ARCH),
    )
}


def get_instance_type(name: str) -> InstanceType:
    """The named instance type; a ``ValueError`` naming the known ones otherwise."""
    instance = INSTANCE_TYPES.get(name)
    if instance is None:
        raise ValueError(f"unknown instance type {name!r}; known: {', '.join(INSTANCE_TYPES)}")
    return instance


def chip_of(target: NeuronTarget) -> Chip:
    """The device a target's instance types carry (one chip per family)."""
    return next(i.chip for i in INSTANCE_TYPES.values() if i.target == target)


def largest_instance_type(target: NeuronTarget) -> InstanceType:
    """The target's instance type with the most devices (the first listed among equals)."""
    return max((i for i in INSTANCE_TYPES.values() if i.target == target), key=lambda i: i.devices)
