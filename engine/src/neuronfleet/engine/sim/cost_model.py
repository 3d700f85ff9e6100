"""How long a Neuron device takes for one compiled step: the simulated device's clock.

A prefill step is bound by compute on the *padded* tokens (the compiled graph
computes every position of its bucket), plus each sequence's attention over its
own context when several are packed into one bucket; a decode step by reading the weights and
the real requests' KV cache from HBM. Both pay a fixed per-step overhead. The
hardware figures are public (``neuronfleet.engine.hardware`` names their
sources); the efficiencies and the overhead are assumptions, marked as such.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from neuronfleet.engine.hardware import InstanceType
from neuronfleet.engine.sim.model_shapes import ModelShape

#: Assumed share of peak BF16 throughput a prefill graph reaches (approximation).
COMPUTE_EFFICIENCY = 0.5
#: Assumed share of peak HBM bandwidth a decode graph reaches (approximation).
BANDWIDTH_EFFICIENCY = 0.7
#: Assumed fixed cost of one step: host launch, collectives, sampling (approximation).
STEP_OVERHEAD_S = 0.001


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
        return self.instance.chip.bf16_tflops * 1e12 * self._core_share

    @property
    def hbm_bandwidth(self) -> float:
        """HBM bytes per second of the replica's cores."""
        return self.instance.chip.hbm_bandwidth * self._core_share

    @property
    def hbm_bytes(self) -> int:
        """HBM capacity of the replica's cores."""
        return int(self.instance.chip.hbm_bytes * self._core_share)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights the replica holds and reads every step."""
        return self.shape.num_parameters * self.dtype_bytes

    def kv_cache_bytes(self, memory_utilization: float) -> int:
        """HBM left for the KV cache: the usable share of capacity less the weights (never negative)."""
        return max(0, int(self.hbm_bytes * memory_utilization) - self.weight_bytes)

    def prefill_seconds(self, padded_tokens: int, context_tokens: int) -> float:
        """One prefill chunk of ``padded_tokens`` (its bucket) after ``context_tokens`` already in the KV cache."""
        return self.packed_prefill_seconds([(padded_tokens, context_tokens)])

    def packed_prefill_seconds(self, sequences: Sequence[tuple[int, int]]) -> float:
        """One prefill step running several sequences' chunks in one bucket.

        ``sequences`` holds each sequence's ``(padded_tokens, context_tokens)``: its share of
        the bucket (its real tokens; the last sequence also carries the step's padding) and
        the tokens it already has in the KV cache. The dense layers compute every position
        of the bucket once; attention is each sequence's own, over its own context and
        chunk, never across sequences (a ragged prefill graph, as chunked-prefill graphs
        are: docs/engine.md). One sequence costs what ``prefill_seconds`` says.
        """
        shape = self.shape
        bucket = sum(padded for padded, _ in sequences)
        dense = 2 * shape.num_parameters * bucket
        attention_width = shape.num_attention_heads * shape.head_dim
        attention = sum(
            4 * shape.num_hidden_layers * attention_width * padded * (context + padded) for padded, context in sequences
        )
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
