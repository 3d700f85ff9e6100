"""Serving on the simulated device: throughput, TTFT and inter-token latency by request rate.

llama-3.1-8b on a trn2.48xlarge (tensor parallelism 8, max_num_seqs 64,
max_model_len 8192, the default buckets) serves the chat workload: prompt lengths
from ``WORKLOADS["chat"]``, output lengths lognormal around 250 tokens, Poisson
arrivals at each request rate (an open loop: requests arrive whether or not the
engine keeps up). The scheduling is the real vLLM scheduler's, step times come
from the simulated device's cost model on a virtual clock, so a run takes seconds.

First the saturation throughput: every request arriving at once, for each
scheduler. The request rates are then fractions of the baseline's saturation
(``LOADS``, 25% to 110%): below 100% the design keeps up and the latencies are
steady-state; at 100% and 110% its queue grows for as long as the run lasts.

Goodput is the requests per second that meet the SLO: a request counts when its
first token came within ``TTFT_SLO_S`` (500 ms) and its own inter-token latency p99
is within ``ITL_SLO_S`` (50 ms), over the run's duration (per request, as vLLM's
serving benchmark counts goodput).

Five schedulers run side by side: the design's as written (``REFERENCE_SCHEDULER``,
the baseline); neuronfleet's defaults without the prefill cap while decoding
(``max_prefill_tokens_while_decoding: null``), alone and with packed prefills
(``max_prefills_per_step``); and the defaults (with the cap), alone and with packed
prefills. Each figure is the median over ``SEEDS`` (different prompts, outputs and
arrival times). The synchronous scheduler class runs (the
virtual clock models one step at a time).

Run: ``make bench-serving`` (or ``.venv/bin/python bench/serving.py``).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

from neuronfleet.engine.config import REFERENCE_SCHEDULER, EngineConfig, SchedulerOptions
from neuronfleet.engine.hardware import get_instance_type
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler
from neuronfleet.engine.offline.scenarios import ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Arrival, Timeline, percentile, serve_arrivals
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.model_shapes import get_shape
from neuronfleet.engine.tuning.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results" / "serving.json"
NUM_REQUESTS = 500
MAX_MODEL_LEN = 8192
#: Offered load as a fraction of the baseline's saturation throughput.
LOADS = [0.25, 0.5, 0.75, 0.9, 1.0, 1.1]
SEEDS = [0, 1, 2]
BLOCK_SIZE = 32
MEMORY_UTILIZATION = 0.9
#: Prompts one prefill step may pack (the pack rule, not this count, limits packs here: 64 measured the same).
PACKED_PREFILLS = 8
#: Neuronfleet's defaults before the prefill cap while decoding: what the cap alone adds.
UNCAPPED = SchedulerOptions(max_prefill_tokens_while_decoding=None)
SCHEDULERS = {
    "reference": REFERENCE_SCHEDULER,
    "uncapped": UNCAPPED,
    "uncapped-packing": UNCAPPED.model_copy(update={"max_prefills_per_step": PACKED_PREFILLS}),
    "neuronfleet": SchedulerOptions(),
    "packing": SchedulerOptions(max_prefills_per_step=PACKED_PREFILLS),
}
#: The SLO a request must meet to count in the goodput.
TTFT_SLO_S = 0.5
ITL_SLO_S = 0.05
METRICS = ["goodput_rps", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"]


def cost_model() -> CostModel:
    """llama-3.1-8b over 8 logical NeuronCores of a trn2.48xlarge."""
    return CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=8)


def engine_config(scheduler: SchedulerOptions) -> EngineConfig:
    """The serving configuration, with the default buckets."""
    return EngineConfig(
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        tensor_parallel_size=8,
        scheduler=scheduler,
    )


def arrivals(rate: float | None, seed: int) -> list[Arrival]:
    """Chat requests with Poisson arrivals at ``rate`` per second (``None``: all at once).

    The same seed gives the same prompts and outputs at every rate.
    """
    # vLLM rejects a prompt of max_model_len tokens (no room for a reply): the longest it serves is one less.
    prompts = WORKLOADS["chat"].sample(NUM_REQUESTS, seed=seed, max_model_len=MAX_MODEL_LEN - 1)
    outputs, gaps = random.Random(1000 + seed), random.Random(2000 + seed)
    at = 0.0
    result = []
    for i, prompt in enumerate(prompts):
        at += 0.0 if rate is None else gaps.expovariate(rate)
        max_tokens = max(1, min(2048, round(outputs.lognormvariate(5.5, 0.8))))
        result.append(Arrival(at, ScenarioRequest(f"chat-{i}", prompt_len=prompt, max_tokens=max_tokens)))
    return result


def mean_output_tokens(seed: int) -> float:
    """Mean reply length of a seed's requests."""
    return statistics.mean(arrival.request.max_tokens for arrival in arrivals(None, seed))


def measure_once(scheduler: SchedulerOptions, rate: float | None, seed: int) -> dict[str, float]:
    """Throughput and latency percentiles of one run."""
    cost = cost_model()
    engine_cfg = engine_config(scheduler)
    block_bytes = cost.shape.kv_bytes_per_token(cost.dtype_bytes) * BLOCK_SIZE
    engine = OfflineEngine(
        build_scheduler(
            engine_cfg, num_kv_blocks=cost.kv_cache_bytes(MEMORY_UTILIZATION) // block_bytes, async_scheduling=False
        )
    )
    timeline = Timeline(cost, engine_cfg.effective_num_seqs_buckets)
    chosen = arrivals(rate, seed)
    serve_arrivals(engine, timeline, chosen)
    # A preempted request recomputes its prompt, which the timeline would stamp as new tokens.
    assert not [step for step in engine.steps if step.preempted], "a request was preempted"
    req_ids = [arrival.request.req_id for arrival in chosen]
    ttfts = [timeline.ttft(req_id) for req_id in req_ids]
    gaps = timeline.inter_token_latencies(req_ids)
    output_tokens = sum(len(progress.output_tokens) for progress in engine.progress.values())
    duration = timeline.clock - chosen[0].at
    good = [req_id for req_id in req_ids if meets_slo(timeline, req_id)]
    return {
        "goodput_rps": len(good) / duration,
        "output_tokens_per_s": output_tokens / duration,
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3,
        "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "itl_p50_ms": percentile(gaps, 50) * 1e3,
        "itl_p99_ms": percentile(gaps, 99) * 1e3,
    }


def meets_slo(timeline: Timeline, req_id: str) -> bool:
    """Whether a request met the SLO: first token within ``TTFT_SLO_S``, its own ITL p99 within ``ITL_SLO_S``."""
    if timeline.ttft(req_id) > TTFT_SLO_S:
        return False
    gaps = timeline.inter_token_latencies([req_id])
    return not gaps or percentile(gaps, 99) <= ITL_SLO_S


def measure(name: str, rate: float | None, load: float | None) -> dict[str, Any]:
    """Medians over the seeds of one scheduler at one rate (``None``: all at once)."""
    runs = [measure_once(SCHEDULERS[name], rate, seed) for seed in SEEDS]
    return {
        "scheduler": name,
        "load": load,
        "rate": rate,
        **{metric: statistics.median(run[metric] for run in runs) for metric in METRICS},
    }


def ratio(row: dict[str, Any], base: dict[str, Any], metric: str) -> str:
    """``row``'s figure over the baseline's, or ``-`` where the baseline is 0."""
    return f"{row[metric] / base[metric]:.2f}" if base[metric] else "-"


def main() -> None:
    """Print the table and write it as JSON."""
    saturation = {name: measure(name, None, None) for name in SCHEDULERS}
    # Requests per second the baseline sustains: its token throughput over the mean reply.
    capacity = saturation["reference"]["output_tokens_per_s"] / statistics.median(map(mean_output_tokens, SEEDS))
    rows = [*saturation.values()]
    rows += [measure(name, load * capacity, load) for load in LOADS for name in SCHEDULERS]
    print(
        f"chat workload, {NUM_REQUESTS} requests per run, llama-3.1-8b on trn2.48xlarge TP 8 (virtual clock; "
        f"medians over {len(SEEDS)} seeds; ratios to the reference scheduler at the same load). Saturation: all "
        f"requests at once; then Poisson arrivals at fractions of the reference's {capacity:.1f} req/s."
    )
    slo = f"TTFT <= {TTFT_SLO_S * 1e3:.0f} ms and their own ITL p99 <= {ITL_SLO_S * 1e3:.0f} ms"
    print(f"goodput: requests/s with {slo}")
    print(
        f"{'load':>11} {'scheduler':>16} {'goodput':>8} {'tokens/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} {'ITL p99':>8} {'goodput vs ref':>14} {'TTFT p99 vs ref':>15} {'ITL p99 vs ref':>14}"
    )
    reference = {row["load"]: row for row in rows if row["scheduler"] == "reference"}
    for row in rows:
        base = reference[row["load"]]
        load = "saturation" if row["load"] is None else f"{row['load']:.0%} {row['rate']:.1f}/s"
        print(
            f"{load:>11} {row['scheduler']:>16} {row['goodput_rps']:>6.1f}/s {row['output_tokens_per_s']:>9.0f} "
            f"{row['ttft_p50_ms']:>7.0f}ms {row['ttft_p99_ms']:>7.0f}ms {row['itl_p50_ms']:>6.1f}ms "
            f"{row['itl_p99_ms']:>6.1f}ms {ratio(row, base, 'goodput_rps'):>14} "
            f"{ratio(row, base, 'ttft_p99_ms'):>15} {ratio(row, base, 'itl_p99_ms'):>14}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
