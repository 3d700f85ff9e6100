"""How long a Neuron device takes for one compiled step: the simulated device's clock.

A prefill step is bound by compute on the *padded* tokens (the compiled graph
computes every position of its bucket); a decode step by reading the weights and
the real requests' KV cache from HBM. Both pay a fixed per-step overhead. The
hardware figures are public (sources in ``INSTANCE_TYPES`` and docs/engine.md);
the efficiencies and the overhead are assumptions, marked as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from neuronfleet.engine.sim.model_shapes import ModelShape

Family = Literal["trn2", "inf2"]

GIB = 1024**3
TRN2_ARCH = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/trn2-arch.html"
TRAINIUM2 = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/about-neuron/arch/neuron-hardware/trainium2.html"
INF2_ARCH = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-hardware/inf2-arch.html"

#: Assumed share of peak BF16 throughput a prefill graph reaches (approximation).
COMPUTE_EFFICIENCY = 0.5
#: Assumed share of peak HBM bandwidth a decode graph reaches (approximation).
BANDWIDTH_EFFICIENCY = 0.7
#: Assumed fixed cost of one step: host launch, collectives, sampling (approximation).
STEP_OVERHEAD_S = 0.001


@dataclass(frozen=True)
class InstanceType:
    """An EC2 Neuron instance type, per Neuron device (chip)."""

    name: str
    family: Family
    devices: int
    #: Logical NeuronCores per device: the unit ``tensor_parallel_size`` counts. Trn2
    #: runs with LNC=2 by default (two of its eight physical NeuronCore-v3 per logical core).
    cores_per_device: int
    #: Dense BF16 TFLOPS per device.
    bf16_tflops_per_device: float
    hbm_bytes_per_device: int
    #: HBM bandwidth per device, bytes per second.
    hbm_bandwidth_per_device: float
    source: str

    @property
    def cores(self) -> int:
        """Logical NeuronCores in the instance."""
        return self.devices * self.cores_per_device


INSTANCE_TYPES: dict[str, InstanceType] = {
    instance.name: instance
    for instance in (
        # 16 Trainium2 chips: 667 BF16 TFLOPS, 96 GiB HBM at 2.9 TB/s each (10.7 PFLOPS, 1.5 TiB, 46.4 TB/s).
        InstanceType("trn2.48xlarge", "trn2", 16, 4, 667.0, 96 * GIB, 2.9e12, f"{TRN2_ARCH}; {TRAINIUM2}"),
        # Inferentia2: 2 NeuronCore-v2, 190 BF16 TFLOPS, 32 GiB HBM at 820 GiB/s per chip.
        InstanceType("inf2.xlarge", "inf2", 1, 2, 190.0, 32 * GIB, 820.0 * GIB, INF2_ARCH),
        InstanceType("inf2.8xlarge", "inf2", 1, 2, 190.0, 32 * GIB, 820.0 * GIB, INF2_ARCH),
        InstanceType("inf2.24xlarge", "inf2", 6, 2, 190.0, 32 * GIB, 820.0 * GIB, INF2_ARCH),
        InstanceType("inf2.48xlarge", "inf2", 12, 2, 190.0, 32 * GIB, 820.0 * GIB, INF2_ARCH),
    )
}

#: The instance type the simulated device stands for when none is named.
DEFAULT_INSTANCE_TYPE = "trn2.48xlarge"


def get_instance_type(name: str) -> InstanceType:
    """The named instance type; a ``ValueError`` naming the known ones otherwise."""
    instance = INSTANCE_TYPES.get(name)
    if instance is None:
        raise ValueError(f"unknown instance type {name!r}; known: {', '.join(INSTANCE_TYPES)}")
    return instance


@dataclass(frozen=True)
class CostModel:
    """Step times of one model replica sharded over ``tensor_parallel_size`` logical NeuronCores."""

    instance: InstanceType
    shape: ModelShape
    tensor_parallel_size: int
    dtype_bytes: int = 2
    step_overhead_s: float = STEP_OVERHEAD_S

    def __post_init__(self) -> None:
        if not 1 <= self.tensor_parallel_size <= self.instance.cores:
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} does not fit {self.instance.name} "
                f"({self.instance.cores} NeuronCores)"
            )

    @property
    def _core_share(self) -> float:
        return self.tensor_parallel_size / self.instance.cores_per_device

    @property
    def peak_flops(self) -> float:
        """Dense BF16 FLOP/s of the replica's cores."""
        return self.instance.bf16_tflops_per_device * 1e12 * self._core_share

    @property
    def hbm_bandwidth(self) -> float:
        """HBM bytes per second of the replica's cores."""
        return self.instance.hbm_bandwidth_per_device * self._core_share

    @property
    def hbm_bytes(self) -> int:
        """HBM capacity of the replica's cores."""
        return int(self.instance.hbm_bytes_per_device * self._core_share)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights the replica holds and reads every step."""
        return self.shape.num_parameters * self.dtype_bytes

    def kv_cache_bytes(self, memory_utilization: float) -> int:
        """HBM left for the KV cache: the usable share of capacity less the weights (never negative)."""
        return max(0, int(self.hbm_bytes * memory_utilization) - self.weight_bytes)

    def prefill_seconds(self, padded_tokens: int, context_tokens: int) -> float:
        """One prefill chunk of ``padded_tokens`` (its bucket) after ``context_tokens`` already in the KV cache."""
        shape = self.shape
        dense = 2 * shape.num_parameters * padded_tokens
        attention_width = shape.num_attention_heads * shape.head_dim
        attention = 4 * shape.num_hidden_layers * attention_width * padded_tokens * (context_tokens + padded_tokens)
        compute = (dense + attention) / (self.peak_flops * COMPUTE_EFFICIENCY)
        # A short chunk still streams every weight once.
        memory = self.weight_bytes / (self.hbm_bandwidth * BANDWIDTH_EFFICIENCY)
        return self.step_overhead_s + max(compute, memory)

    def decode_seconds(self, padded_batch: int, context_tokens: int) -> float:
        """One decode step of a batch padded to ``padded_batch`` whose real requests hold ``context_tokens``."""
        read = self.weight_bytes + self.shape.kv_bytes_per_token(self.dtype_bytes) * context_tokens
        memory = read / (self.hbm_bandwidth * BANDWIDTH_EFFICIENCY)
        compute = 2 * self.shape.num_parameters * padded_batch / (self.peak_flops * COMPUTE_EFFICIENCY)
        return self.step_overhead_s + max(memory, compute)

    def compile_seconds(self, bucket_size: int) -> float:
        """Simulated time to compile one bucket's graph.

        Not a prediction: real compiles take minutes. Scaled down to keep a
        simulated compile short, it only grows with depth and bucket size.
        """
        return 0.05 + 0.001 * self.shape.num_hidden_layers * math.sqrt(bucket_size / 128)
