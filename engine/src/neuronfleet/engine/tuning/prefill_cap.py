"""The prefill cap while decoding, derived from a deployment's step times.

While requests decode, every prefill step is a stall in their token streams: a decoding request's token gap
becomes that prefill step plus a decode step. On Neuron a prefill step pays fixed costs (collectives and
kernels in every layer) before its compute, so the smallest bucket's step is a stall no scheduler avoids.
``max_prefill_tokens_while_decoding: auto`` is the largest compiled bucket whose prefill step, beside one decode
step of the largest batch, fits an ITL target: the user's ``itl_target_ms``, else ``DEFAULT_STALL_MARGIN`` times
the shortest stall (the smallest bucket's prefill beside that decode step), so that a prefill while decoding
stretches a token gap at most a quarter beyond what no scheduler can avoid. None fits: no cap (chunking cannot
meet the target and only adds steps).

The default is a bound on the stall itself, not on a ratio of prefill steps: where fixed costs are high (a
long per-layer cost, a slow decode step), the shortest stall is long already and only a cap close to the
smallest bucket keeps the next one near it. ``bench/serving.py --band`` holds it against the design's scheduler
with every fitted constant of the cost model halved and doubled.
"""

from __future__ import annotations

from typing import Protocol

from neuronfleet.contract.config import AUTO, EngineConfig

#: Without an ITL target: a stall while decoding is at most this many times the shortest one.
DEFAULT_STALL_MARGIN = 1.25


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
    decode = steps.decode_seconds(engine.effective_num_seqs_buckets[-1], engine.max_model_len)
    stall = {bucket: steps.prefill_seconds(bucket, 0) + decode for bucket in buckets}
    target_ms = engine.scheduler.itl_target_ms
    target_s = DEFAULT_STALL_MARGIN * stall[buckets[0]] if target_ms is None else target_ms / 1e3
    fitting = [bucket for bucket in buckets if stall[bucket] <= target_s]
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
