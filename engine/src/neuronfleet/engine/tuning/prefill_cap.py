"""The prefill cap while decoding, derived from a deployment's step times.

While requests decode, every prefill step is a stall in their token streams. On Neuron a prefill
step pays fixed costs (collectives and kernels in every layer) before its compute, so the
smallest bucket's step is a stall no scheduler avoids, and chunking below a few times it buys
little: each chunk pays the fixed costs again. ``max_prefill_tokens_while_decoding: auto`` is the
largest compiled bucket whose prefill step, beside one decode step of the largest batch, fits the
ITL target (``itl_target_ms``); none fits, no cap (chunking cannot meet it and only adds steps).
Without a target, the largest bucket whose step costs at most ``KNEE`` times the smallest's.
"""

from __future__ import annotations

from typing import Protocol

from neuronfleet.contract.config import AUTO, EngineConfig

#: Without an ITL target: a prefill step while decoding costs at most this many times the smallest bucket's.
KNEE = 2.0


class StepTimes(Protocol):
    """Seconds a device takes for one compiled step (the simulated device's cost model)."""

    def prefill_seconds(self, padded_tokens: int, context_tokens: int) -> float:
        """One prefill chunk of ``padded_tokens`` after ``context_tokens``."""
        ...

    def decode_seconds(self, padded_batch: int, compiled_context: int) -> float:
        """One decode step of ``padded_batch`` rows, each reading ``compiled_context`` tokens of KV."""
        ...


def derive_prefill_cap(engine: EngineConfig, steps: StepTimes) -> int | None:
    """The cap ``auto`` stands for on ``engine``'s compiled buckets; None: no cap."""
    buckets = engine.effective_num_batched_tokens_buckets
    prefill = {bucket: steps.prefill_seconds(bucket, 0) for bucket in buckets}
    target_ms = engine.scheduler.itl_target_ms
    if target_ms is None:
        fitting = [bucket for bucket in buckets if prefill[bucket] <= KNEE * prefill[buckets[0]]]
    else:
        decode = steps.decode_seconds(engine.effective_num_seqs_buckets[-1], engine.max_model_len)
        fitting = [bucket for bucket in buckets if prefill[bucket] + decode <= target_ms / 1e3]
    if not fitting or fitting[-1] == buckets[-1]:
        return None
    return fitting[-1]


def resolve_prefill_cap(engine: EngineConfig, steps: StepTimes) -> EngineConfig:
    """``engine`` with ``max_prefill_tokens_while_decoding: auto`` replaced by the derived cap."""
    if engine.scheduler.max_prefill_tokens_while_decoding != AUTO:
        return engine
    scheduler = engine.scheduler.model_copy(
        update={"max_prefill_tokens_while_decoding": derive_prefill_cap(engine, steps)}
    )
    return engine.model_copy(update={"scheduler": scheduler})
