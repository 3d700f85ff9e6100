"""How long a Neuron device takes for one compiled step: the simulated device's clock.

A compiled graph costs what its shape costs, not what its inputs hold. A prefill step computes
every position of its bucket: the dense layers on the padded tokens and causal attention over the
context before them. A decode step reads the weights and, for every row of its padded batch, the KV
cache of its *compiled* context (``max_model_len``, or the decode context bucket that holds the
batch's longest sequence), however few tokens are there. Both pay fixed costs per layer and a host
dispatch. The peak figures are the hardware catalogue's; how much of them each chip reaches is
fitted on Neuron's published latencies (:mod:`neuronfleet.engine.sim.calibration`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from neuronfleet.contract.hardware import InstanceType
from neuronfleet.contract.model_shapes import ModelShape
from neuronfleet.engine.sim.calibration import Calibration, calibration_for

#: Share of peak HBM bandwidth a prefill step reaches streaming the weights (bounds a short chunk).
PREFILL_WEIGHT_READ_EFFICIENCY = 0.8


@dataclass(frozen=True)
class PrefillWork:
    """A prefill step's work at the replica's peak: seconds of dense and of attention compute, weight streaming."""

    dense_s: float
    attention_s: float
    weights_s: float


@dataclass(frozen=True)
class DecodeWork:
    """A decode step's work at the replica's peak: seconds of weight and KV reads, and of compute."""

    weights_s: float
    kv_s: float
    compute_s: float


@dataclass(frozen=True)
class CostModel:
    """Step times of one model replica sharded over ``tensor_parallel_size`` logical NeuronCores."""

    instance: InstanceType
    shape: ModelShape
    tensor_parallel_size: int
    dtype_bytes: int = 2
    #: The chip's fitted constants (``calibration_for``); the benchmarks pass others to test their sensitivity.
    calibration: Calibration = field(default=None)  # type: ignore[assignment]
    #: Physical NeuronCores per logical core (LNC; ``None``: the chip's default). At LNC=1 a Trainium2 logical
    #: core is one physical core, half of one at LNC=2: the same tensor parallelism holds half the device.
    logical_neuron_cores: int | None = None

    def __post_init__(self) -> None:
        cores = self.instance.cores_at(self.logical_neuron_cores)
        if not 1 <= self.tensor_parallel_size <= cores:
            raise ValueError(
                f"tensor_parallel_size {self.tensor_parallel_size} does not fit {self.instance.name} "
                f"({cores} NeuronCores)"
            )
        if self.calibration is None:
            object.__setattr__(self, "calibration", calibration_for(self.instance.chip.name))

    @property
    def _core_share(self) -> float:
        return self.tensor_parallel_size / self.instance.chip.logical_cores(self.logical_neuron_cores)

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
        """Bytes of weights the replica holds."""
        return self.shape.num_parameters * self.dtype_bytes

    @property
    def streamed_weight_bytes(self) -> int:
        """Bytes of weights one step reads: every layer and the output head (the embedding table only by row)."""
        shape = self.shape
        return (shape.num_hidden_layers * shape.layer_parameters + shape.vocab_size * shape.hidden_size) * (
            self.dtype_bytes
        )

    def _heads_held(self, heads: int) -> int:
        # Each core holds a whole number of heads: replicated where there are fewer heads than cores (a KV
        # head on tensor_parallel_size / heads cores), padded where they do not divide evenly.
        return self.tensor_parallel_size * math.ceil(heads / self.tensor_parallel_size)

    @property
    def kv_heads_held(self) -> int:
        """KV heads the replica's cores hold in all, replicas included."""
        return self._heads_held(self.shape.num_key_value_heads)

    def kv_bytes_per_token(self) -> int:
        """HBM one token's keys and values take on the replica, every replicated KV head counted."""
        shape = self.shape
        return 2 * shape.num_hidden_layers * self.kv_heads_held * shape.head_dim * self.dtype_bytes

    def kv_cache_bytes(self, memory_utilization: float) -> int:
        """HBM left for the KV cache: the usable share of capacity less the weights (never negative)."""
        return max(0, int(self.hbm_bytes * memory_utilization) - self.weight_bytes)

    def simulated_kv_cache_bytes(
        self, memory_utilization: float, *, block_size: int, max_num_seqs: int, max_model_len: int
    ) -> int:
        """What the simulated device offers vLLM for the KV cache: :meth:`kv_cache_bytes`, capped at twice what
        ``max_num_seqs`` full-length requests need (and vLLM's null block).

        The block pool lives in host memory there, so a tiny model on a large device would otherwise make millions
        of blocks; more than the scheduler can ever admit changes nothing but prefix-cache retention.
        """
        blocks_per_request = -(-max_model_len // block_size)
        cap_blocks = 2 * (max_num_seqs * blocks_per_request + 1)
        return min(self.kv_cache_bytes(memory_utilization), cap_blocks * self.kv_bytes_per_token() * block_size)

    def prefill_work(self, sequences: Sequence[tuple[int, int]]) -> PrefillWork:
        """The work of one prefill step over ``sequences``, each ``(padded_tokens, context_tokens)``.

        The bucket is the padded tokens together. Its dense layers compute every position once, and the
        output head each sequence's last. Attention is charged as one causal sequence of the whole bucket
        after every sequence's context: what a compiled graph that masks, rather than skips, the tiles
        between packed sequences computes, so a pack never costs less than its largest member alone.
        """
        shape = self.shape
        bucket = sum(padded for padded, _ in sequences)
        context = sum(context for _, context in sequences)
        dense = 2 * (shape.num_hidden_layers * shape.layer_parameters * bucket) + 2 * (
            shape.hidden_size * shape.vocab_size * len(sequences)
        )
        query_width = self._heads_held(shape.num_attention_heads) * shape.head_dim
        attention = 4 * shape.num_hidden_layers * query_width * bucket * (context + bucket / 2)
        return PrefillWork(
            dense_s=dense / self.peak_flops,
            attention_s=attention / self.peak_flops,
            weights_s=self.streamed_weight_bytes / self.hbm_bandwidth,
        )

    def decode_work(self, padded_batch: int, compiled_context: int) -> DecodeWork:
        """The work of one decode step: every row of ``padded_batch`` reads ``compiled_context`` tokens of KV."""
        shape = self.shape
        query_width = self._heads_held(shape.num_attention_heads) * shape.head_dim
        compute = padded_batch * (
            2 * (shape.num_hidden_layers * shape.layer_parameters + shape.hidden_size * shape.vocab_size)
            + 4 * shape.num_hidden_layers * query_width * compiled_context
        )
        return DecodeWork(
            weights_s=self.streamed_weight_bytes / self.hbm_bandwidth,
            kv_s=padded_batch * compiled_context * self.kv_bytes_per_token() / self.hbm_bandwidth,
            compute_s=compute / self.peak_flops,
        )

    def _fixed_seconds(self, per_layer_s: float) -> float:
        return self.calibration.host_dispatch_s + self.shape.num_hidden_layers * per_layer_s

    def prefill_seconds(self, padded_tokens: int, context_tokens: int) -> float:
        """One prefill chunk of ``padded_tokens`` (its bucket) after ``context_tokens`` already in the KV cache."""
        return self.packed_prefill_seconds([(padded_tokens, context_tokens)])

    def packed_prefill_seconds(self, sequences: Sequence[tuple[int, int]]) -> float:
        """One prefill step running several sequences' chunks in one bucket (``prefill_work``)."""
        return self.prefill_step_seconds(self.prefill_work(sequences))

    def prefill_step_seconds(self, work: PrefillWork) -> float:
        """The time of a prefill step doing ``work``: fixed costs, then compute or weight streaming."""
        c = self.calibration
        compute = work.dense_s / c.dense_efficiency + work.attention_s / c.attention_efficiency
        # A short chunk still streams every weight once.
        return self._fixed_seconds(c.prefill_layer_s) + max(compute, work.weights_s / PREFILL_WEIGHT_READ_EFFICIENCY)

    def decode_seconds(self, padded_batch: int, compiled_context: int) -> float:
        """One decode step of a batch padded to ``padded_batch``, each row reading ``compiled_context`` of KV."""
        c = self.calibration
        work = self.decode_work(padded_batch, compiled_context)
        reads = work.weights_s / c.weight_read_efficiency + work.kv_s / c.kv_read_efficiency
        return self._fixed_seconds(c.decode_layer_s) + max(reads, work.compute_s / c.dense_efficiency)

    def prefill_tokens_per_s(self, prefill_buckets: Sequence[int]) -> float:
        """The replica's best prefill rate over its compiled prefill graphs, from the step each runs at warm-up
        (:meth:`warmup_seconds`): what the token-aware autoscaling signal divides its prefill backlog by."""
        return max(bucket / self.prefill_seconds(bucket, 0) for bucket in prefill_buckets)

    def lora_parameters(self, rank: int) -> int:
        """Parameters of a rank-``rank`` adapter on every projection of every layer (A and B of each)."""
        shape = self.shape
        query_width = shape.num_attention_heads * shape.head_dim
        kv_width = shape.num_key_value_heads * shape.head_dim
        hidden, inner = shape.hidden_size, shape.intermediate_size
        # q, k, v, o, then gate, up and down: each adds rank * (its input + its output width).
        widths = 2 * (hidden + query_width) + 2 * (hidden + kv_width) + 3 * (hidden + inner)
        return shape.num_hidden_layers * rank * widths

    def lora_seconds(self, adapters: Sequence[tuple[int, int]]) -> float:
        """What LoRA adapters add to a step: each ``(rank, tokens)`` reads its weights once and multiplies its
        tokens through them, so the cost grows with the rank."""
        c = self.calibration
        seconds = 0.0
        for rank, tokens in adapters:
            parameters = self.lora_parameters(rank)
            reads = parameters * self.dtype_bytes / self.hbm_bandwidth / c.weight_read_efficiency
            compute = 2 * parameters * tokens / self.peak_flops / c.dense_efficiency
            seconds += max(reads, compute)
        return seconds

    def compile_seconds(self, bucket_size: int) -> float:
        """Simulated time to compile one bucket's graph.

        Not a prediction: real compiles take minutes. Scaled down to keep a
        simulated compile short, it only grows with depth and bucket size.
        """
        return 0.05 + 0.001 * self.shape.num_hidden_layers * math.sqrt(bucket_size / 128)

    def warmup_seconds(
        self, prefill_buckets: Sequence[int], decode_buckets: Sequence[int], decode_contexts: Sequence[int]
    ) -> float:
        """A replica's warm-up before it serves: one step of every compiled graph (a prefill per token bucket, a
        decode per batch bucket and compiled context)."""
        prefills = sum(self.prefill_seconds(bucket, 0) for bucket in prefill_buckets)
        decodes = sum(self.decode_seconds(batch, context) for batch in decode_buckets for context in decode_contexts)
        return prefills + decodes
