"""Latencies Neuron publishes, as the rows the simulated device's cost model is fitted on and checked against.

Every row is one published measurement: a model at a tensor parallelism on an instance type, one
prompt length, its p50 time to first token and time per output token. ``role`` says what the row
is for: ``reference`` rows are the seven the project's reference gathers (``docs/engine.md``,
"Calibration"); with the ``fit`` rows they fix the constants of
:mod:`neuronfleet.engine.sim.calibration`; ``holdout`` rows take no part in the fit and measure how
well the model predicts what it was not fitted on.

Each row also says what its device ran, since the published tables give only prompt and output
lengths: ``prefill_tokens`` is a prompt's compiled prefill size, ``prefill_prompts`` how many prompts
one prefill step encodes (Transformers NeuronX encodes a batch together, vLLM one prompt a step), and
``decode_context`` the KV cache context one decode step reads per sequence at the run's median output
token (the compiled context, not the tokens there).

Sources, in ``github.com/aws-neuron/aws-neuron-sdk``:

- ``TNX_INF2``, ``TNX_TRN1``: Transformers NeuronX 2.18 on inf2.48xlarge and trn1.32xlarge,
  prompts encoded in one step of the prompt's length, decodes in power-of-two context buckets from
  128 up to the compiled sequence length (Transformers NeuronX's token buckets).
- ``NXDI_70B``, ``NXDI_405B``: NxD Inference behind vLLM, measured end to end with LLMPerf at
  concurrency 1; the compiled buckets are the tutorials'.
- ``VLLM_NEURON_8B``: the vLLM Neuron plugin (SDK 2.32 or later), ``vllm bench serve`` at
  concurrency 2 with ``max_model_len`` 2048 and no decode context buckets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.sim.calibration import FITTED_CONSTANTS, HOST_DISPATCH_S, Calibration
from neuronfleet.engine.sim.cost_model import CostModel, PrefillWork

_BENCHMARKS = "about-neuron/benchmarks"
TNX_INF2 = f"{_BENCHMARKS}/inf2/latency_data_decoder.csv"
TNX_INF2_BATCH = f"{_BENCHMARKS}/inf2/throughput_data_decoder.csv"
TNX_TRN1 = f"{_BENCHMARKS}/trn1/latency_data_decoder.csv"
TNX_TRN1_BATCH = f"{_BENCHMARKS}/trn1/throughput_data_decoder.csv"
NXDI_70B = "libraries/nxd-inference/tutorials/llama70b_perf_comparison.csv"
NXDI_405B = "libraries/nxd-inference/tutorials/llama405b_perf_comparison.csv"
VLLM_NEURON_8B = "vllm-neuron/docs/tutorials/tutorial-eagle3-speculative-decoding-llama-3-1.md"

Role = Literal["reference", "fit", "holdout"]

#: The largest share of a peak figure a fit may give: a chip with few rows (Trainium2) otherwise reads its
#: weights faster than its HBM can. The published decode figures show 75 to 80% at the margin.
MAX_EFFICIENCY = 0.8


@dataclass(frozen=True)
class PublishedRow:
    """One published latency measurement and what its device ran."""

    id: str
    role: Role
    #: The model as published, and the shape (``model_shapes.SHAPES``) with its architecture.
    model: str
    shape: str
    instance_type: str
    tensor_parallel_size: int
    batch: int
    prompt_tokens: int
    output_tokens: int
    prefill_tokens: int
    prefill_prompts: int
    decode_context: int
    ttft_ms: float
    tpot_ms: float | None
    source: str


def _tnx(
    row: str,
    role: Role,
    model: str,
    shape: str,
    prompt: int,
    output: int,
    sequence_length: int,
    ttft_ms: float,
    tpot_ms: float,
    *,
    batch: int = 1,
) -> PublishedRow:
    """A Transformers NeuronX row: its instance, source and compiled shapes follow from its id."""
    family, table = row.split("-")[:2]
    instance, tensor_parallel_size = ("inf2.48xlarge", 24) if family == "inf2" else ("trn1.32xlarge", 32)
    sources = {
        ("inf2", "lat"): TNX_INF2,
        ("inf2", "thr"): TNX_INF2_BATCH,
        ("trn1", "lat"): TNX_TRN1,
        ("trn1", "thr"): TNX_TRN1_BATCH,
    }
    return PublishedRow(
        id=row,
        role=role,
        model=model,
        shape=shape,
        instance_type=instance,
        tensor_parallel_size=tensor_parallel_size,
        batch=batch,
        prompt_tokens=prompt,
        output_tokens=output,
        prefill_tokens=prompt,
        prefill_prompts=batch,
        decode_context=power_of_two_bucket(prompt + output // 2, sequence_length),
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        source=sources[family, table],
    )


def _served(
    row: str,
    model: str,
    shape: str,
    tensor_parallel_size: int,
    batch: int,
    lengths: tuple[int, int],
    compiled: tuple[int, int],
    latencies_ms: tuple[float, float],
    source: str,
) -> PublishedRow:
    """A trn2.48xlarge row measured through a server: (prompt, output) lengths, (prefill bucket, decode context)."""
    return PublishedRow(
        id=row,
        role="reference",
        model=model,
        shape=shape,
        instance_type="trn2.48xlarge",
        tensor_parallel_size=tensor_parallel_size,
        batch=batch,
        prompt_tokens=lengths[0],
        output_tokens=lengths[1],
        prefill_tokens=compiled[0],
        prefill_prompts=1,
        decode_context=compiled[1],
        ttft_ms=latencies_ms[0],
        tpot_ms=latencies_ms[1],
        source=source,
    )


def power_of_two_bucket(tokens: int, largest: int) -> int:
    """The smallest power of two from 128 that holds ``tokens``, at most ``largest``."""
    bucket = 128
    while bucket < tokens and bucket < largest:
        bucket *= 2
    return min(bucket, largest)


# Llama 3 70B and Llama 3.3 70B have Llama 3.1 70B's architecture; CodeLlama 13B has Llama 2 13B's (16 more
# vocabulary entries).
ROWS: tuple[PublishedRow, ...] = (
    # The reference's seven rows (A to G).
    _served("A", "Llama 3.3 70B", "llama-3.1-70b", 64, 1, (10000, 1500), (12288, 12800), (814.2, 19.6), NXDI_70B),
    _served("B", "Llama 3.1 405B", "llama-3.1-405b", 64, 1, (10000, 1785), (10240, 12800), (2442, 37.9), NXDI_405B),
    _served("C", "Llama 3.1 8B", "llama-3.1-8b", 8, 2, (512, 128), (512, 2048), (51.07, 10.52), VLLM_NEURON_8B),
    _tnx("inf2-lat-07", "reference", "Llama-3-70B", "llama-3.1-70b", 1024, 1024, 2048, 310.18, 33.14),
    _tnx("trn1-lat-04", "reference", "Llama-3-70B", "llama-3.1-70b", 2048, 2048, 4096, 547.0, 26.2),
    _tnx("inf2-lat-14", "reference", "Llama-2-13b", "llama-2-13b", 4096, 4096, 8192, 333.78, 10.17),
    _tnx("inf2-lat-15", "reference", "Llama-2-13b", "llama-2-13b", 8192, 8192, 16384, 994.18, 13.50),
    # Further rows the constants are fitted on.
    _tnx("inf2-lat-06", "fit", "Llama-3-70B", "llama-3.1-70b", 1024, 2048, 3072, 312.86, 33.81),
    _tnx("inf2-lat-08", "fit", "Llama-3-70B", "llama-3.1-70b", 128, 1024, 1152, 80.00, 32.47),
    _tnx("inf2-lat-10", "fit", "Llama-3-70B", "llama-3.1-70b", 128, 128, 256, 77.81, 32.20),
    _tnx("inf2-lat-13", "fit", "Llama-2-13b", "llama-2-13b", 128, 3968, 4096, 25.85, 9.17),
    _tnx("inf2-lat-17", "fit", "Llama-2-70b", "llama-2-70b", 256, 256, 512, 96.44, 33.13),
    _tnx("inf2-lat-18", "fit", "Llama-2-70b", "llama-2-70b", 128, 1024, 1152, 76.33, 33.15),
    _tnx("inf2-lat-19", "fit", "Llama-2-70b", "llama-2-70b", 1024, 1024, 2048, 277.02, 33.73),
    _tnx("inf2-lat-21", "fit", "Llama-2-70b", "llama-2-70b", 2048, 2048, 4096, 810.44, 34.90),
    _tnx("inf2-lat-22", "fit", "Mistral-7B-Instruct-v0.2", "mistral-7b", 128, 3968, 4096, 27.34, 6.86),
    _tnx("inf2-lat-25", "fit", "CodeLlama-13b-hf", "llama-2-13b", 128, 3968, 4096, 27.02, 9.12),
    _tnx("inf2-lat-27", "fit", "CodeLlama-13b-hf", "llama-2-13b", 8192, 8192, 16384, 989.50, 13.44),
    _tnx("trn1-lat-07", "fit", "Llama-2-7b", "llama-2-7b", 128, 8064, 8192, 13.32, 6.70),
    _tnx("trn1-lat-10", "fit", "Llama-2-70b", "llama-2-70b", 128, 128, 256, 53.91, 25.18),
    _tnx("trn1-lat-12", "fit", "Llama-2-70b", "llama-2-70b", 128, 1024, 1152, 57.75, 25.45),
    _tnx("trn1-lat-13", "fit", "Llama-2-70b", "llama-2-70b", 1024, 1024, 2048, 232.48, 26.04),
    _tnx("trn1-lat-15", "fit", "Llama-2-70b", "llama-2-70b", 2048, 2048, 4096, 690.96, 26.85),
    _tnx("trn1-thr-05", "fit", "Llama-3-70B", "llama-3.1-70b", 128, 1024, 1152, 129.86, 28.38, batch=4),
    # Held out: never fitted on.
    _tnx("inf2-lat-05", "holdout", "Llama-3-70B", "llama-3.1-70b", 2048, 2048, 4096, 745.49, 34.67),
    _tnx("inf2-lat-09", "holdout", "Llama-3-70B", "llama-3.1-70b", 256, 256, 512, 99.37, 32.48),
    _tnx("inf2-lat-11", "holdout", "Llama-2-7b", "llama-2-7b", 128, 3968, 4096, 27.64, 6.47),
    _tnx("inf2-lat-16", "holdout", "Llama-2-70b", "llama-2-70b", 128, 128, 256, 76.60, 32.90),
    _tnx("inf2-lat-20", "holdout", "Llama-2-70b", "llama-2-70b", 1024, 2048, 3072, 275.97, 34.82),
    _tnx("inf2-lat-26", "holdout", "CodeLlama-13b-hf", "llama-2-13b", 4096, 4096, 8192, 338.67, 10.15),
    _tnx("inf2-thr-11", "holdout", "Llama-2-7b", "llama-2-7b", 128, 3968, 4096, 77.36, 12.11, batch=8),
    _tnx("trn1-lat-05", "holdout", "Llama-3-70B", "llama-3.1-70b", 128, 1024, 1152, 53.20, 24.48),
    _tnx("trn1-lat-11", "holdout", "Llama-2-70b", "llama-2-70b", 256, 256, 512, 81.88, 25.27),
    _tnx("trn1-lat-14", "holdout", "Llama-2-70b", "llama-2-70b", 1024, 2048, 3072, 236.78, 26.62),
    _tnx("trn1-thr-10", "holdout", "Llama-2-70b", "llama-2-70b", 128, 128, 256, 156.85, 26.72, batch=4),
)


def cost_model(row: PublishedRow, calibration: Calibration | None = None) -> CostModel:
    """The cost model of the replica a row measured (its chip's constants unless ``calibration``)."""
    return CostModel(
        get_instance_type(row.instance_type),
        get_shape(row.shape),
        tensor_parallel_size=row.tensor_parallel_size,
        calibration=calibration,  # type: ignore[arg-type]
    )


def chip_of(row: PublishedRow) -> str:
    """The chip a row ran on."""
    return get_instance_type(row.instance_type).chip.name


def _prefill_terms(row: PublishedRow, cost: CostModel) -> PrefillWork:
    # Prompts encoded together: each one's own work, the weights streamed once.
    one = cost.prefill_work([(row.prefill_tokens, 0)])
    prompts = row.prefill_prompts
    return PrefillWork(one.dense_s * prompts, one.attention_s * prompts, one.weights_s)


def predict(row: PublishedRow, calibration: Calibration | None = None) -> tuple[float, float]:
    """The cost model's TTFT and TPOT for a row, in seconds: its prefill step, and its median decode step."""
    cost = cost_model(row, calibration)
    return cost.prefill_step_seconds(_prefill_terms(row, cost)), cost.decode_seconds(row.batch, row.decode_context)


def fit(chip: str, *, ratios_from: Calibration | None = None, leave_out: str | None = None) -> Calibration:
    """Fit a chip's constants on its ``reference`` and ``fit`` rows (but the row ``leave_out``, for a leave-one-out
    error): least squares on the relative error.

    Prefill: TTFT - host = layers x per-layer + dense / efficiency + attention / efficiency; decode:
    TPOT - host = layers x per-layer + weights / efficiency + KV / efficiency, each term at the
    replica's peak. With ``ratios_from`` (a chip with few rows), the ratios of attention to dense
    efficiency and of KV to weight read efficiency are that calibration's, and two constants are
    fitted for each step instead of three.
    """
    rows = [row for row in ROWS if row.role != "holdout" and chip_of(row) == chip and row.id != leave_out]
    if not rows:
        raise ValueError(f"no published rows to fit {chip} on")
    prefill_columns, prefill_targets, decode_columns, decode_targets = [], [], [], []
    for row in rows:
        cost = cost_model(row)
        layers = cost.shape.num_hidden_layers
        work = _prefill_terms(row, cost)
        ttft = row.ttft_ms / 1e3
        prefill_columns.append([layers / ttft, work.dense_s / ttft, work.attention_s / ttft])
        prefill_targets.append((ttft - HOST_DISPATCH_S) / ttft)
        if row.tpot_ms is not None:
            tpot = row.tpot_ms / 1e3
            reads = cost.decode_work(row.batch, row.decode_context)
            decode_columns.append([layers / tpot, reads.weights_s / tpot, reads.kv_s / tpot])
            decode_targets.append((tpot - HOST_DISPATCH_S) / tpot)
    prefill_ratio = decode_ratio = None
    if ratios_from is not None:
        prefill_ratio = ratios_from.dense_efficiency / ratios_from.attention_efficiency
        decode_ratio = ratios_from.weight_read_efficiency / ratios_from.kv_read_efficiency
    per_layer_p, inverse_dense, inverse_attention = _solve(prefill_columns, prefill_targets, prefill_ratio)
    per_layer_d, inverse_weights, inverse_kv = _solve(decode_columns, decode_targets, decode_ratio)
    calibration = Calibration(
        chip=chip,
        dense_efficiency=_round(1 / inverse_dense),
        attention_efficiency=_round(1 / inverse_attention),
        weight_read_efficiency=_round(1 / inverse_weights),
        kv_read_efficiency=_round(1 / inverse_kv),
        prefill_layer_s=_round(per_layer_p),
        decode_layer_s=_round(per_layer_d),
        fitted_on=tuple(row.id for row in rows),
    )
    unphysical = [
        name
        for name in FITTED_CONSTANTS
        if not (0 < getattr(calibration, name) <= (1 if name.endswith("efficiency") else math.inf))
    ]
    if unphysical:
        raise ValueError(f"the fit for {chip} is unphysical ({', '.join(unphysical)}): {calibration}")
    return calibration


def _solve(columns: list[list[float]], targets: list[float], ratio: float | None) -> tuple[float, float, float]:
    """Least squares for (per layer, 1 / first efficiency, 1 / second efficiency), the second tied by ``ratio``.

    An efficiency the rows would put above ``MAX_EFFICIENCY`` is held there and the rest fitted again.
    """
    matrix, wanted = np.array(columns), np.array(targets)
    if ratio is not None:
        # 1 / second = ratio / first: one column for both terms.
        matrix = np.column_stack([matrix[:, 0], matrix[:, 1] + ratio * matrix[:, 2]])
    solution = np.linalg.lstsq(matrix, wanted, rcond=None)[0]
    capped = [i for i in range(1, len(solution)) if solution[i] < 1 / MAX_EFFICIENCY]
    if capped:
        free = [i for i in range(len(solution)) if i not in capped]
        held = wanted - matrix[:, capped] @ np.full(len(capped), 1 / MAX_EFFICIENCY)
        solution[free] = np.linalg.lstsq(matrix[:, free], held, rcond=None)[0]
        solution[capped] = 1 / MAX_EFFICIENCY
    if ratio is not None:
        return float(solution[0]), float(solution[1]), float(solution[1] * ratio)
    return float(solution[0]), float(solution[1]), float(solution[2])


def _round(value: float) -> float:
    """Three significant digits: what the constants are written with."""
    return float(f"{value:.3g}")


#: Neuron's prefix-caching comparison: Llama 3.3 70B on trn2.48xlarge, TP 64, LNC 2, batch 4 (prompts encoded one
#: at a time), context buckets 512 to 8,192, prefix buckets 512 to 2,048, KV blocks of 32 tokens.
NXDI_70B_APC = "libraries/nxd-inference/tutorials/llama70b_apc_perf_comparison.csv"
#: The comparison's context (prefill) buckets.
APC_BUCKETS = (512, 1024, 2048, 4096, 8192)
APC_BLOCK_SIZE = 32


@dataclass(frozen=True)
class PrefixCachingRow:
    """One dataset of the prefix-caching comparison: TTFT p50 without and with caching, as published."""

    dataset: str
    #: The cache hit rate, as the tutorial states it.
    cache_hit: str
    ttft_without_ms: float
    ttft_with_ms: float
    #: The share of a prompt cached, where the stated hit rate gives one.
    hit_share: float
    #: The prompt length, where the dataset's name gives it (``dynamic sonnet 1k``); None where nothing does.
    prompt_tokens: int | None


PREFIX_CACHING_ROWS: tuple[PrefixCachingRow, ...] = (
    PrefixCachingRow("math.math", ">90%", 342.81, 107.8, 0.9, None),
    PrefixCachingRow("dynamic sonnet 1k", "~25%", 123.08, 102.15, 0.25, 1024),
    PrefixCachingRow("dynamic sonnet 2k", "~25%", 592.8, 377.2, 0.25, 2048),
    PrefixCachingRow("HumanEval", "none", 89.7, 91.8, 0.0, None),
)


def prefix_caching_cost() -> CostModel:
    """The comparison's replica, on Trainium2's fitted constants."""
    return CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-70b"), tensor_parallel_size=64)


def prefix_hit_seconds(cost: CostModel, prompt_tokens: int, cached_tokens: int) -> float:
    """The prefill of a prompt whose first ``cached_tokens`` are cached (whole KV blocks): only the new tokens, in
    the smallest context bucket that holds them, attention over the whole context."""
    new = prompt_tokens - cached_tokens
    bucket = next(size for size in APC_BUCKETS if size >= new)
    return cost.prefill_seconds(bucket, cached_tokens)


def cached_tokens(prompt_tokens: int, hit_share: float) -> int:
    """The tokens of a prompt a hit of ``hit_share`` serves from the cache: whole KV blocks only."""
    return int(prompt_tokens * hit_share) // APC_BLOCK_SIZE * APC_BLOCK_SIZE
