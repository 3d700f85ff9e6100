"""Goodput by request rate on the calibrated simulated device: the design's scheduler against neuronfleet's defaults.

Three deployments (Llama 3.1 8B at TP 8 and 70B at TP 64 on a trn2.48xlarge, 70B at TP 24 on an
inf2.48xlarge; ``max_model_len`` 8192, the default buckets) serve two workloads: chat (prompts from
``WORKLOADS["chat"]``, median 300 tokens) and code completion (``WORKLOADS["code"]``, median 900),
outputs lognormal around 250 tokens, Poisson arrivals (an open loop). The scheduling is the real vLLM
scheduler's; step times come from the calibrated cost model (docs/engine.md, "Calibration") on a
virtual clock.

Each deployment's capacity is the design's steady-state completion rate with every request queued
at once (completions per second between the 10th and the 70th percentile of finish times, while the
engine is full); the request rates are fractions of it (``LOADS``). Goodput counts the requests
whose first token came within the deployment's TTFT SLO and whose own inter-token latency p99 is
within its ITL SLO, over the run. The shortest stall any scheduler imposes on a full decode batch is
the smallest prefill bucket's step plus a decode step of the largest batch: where that exceeds the
ITL SLO, no scheduler can meet it and the table says so instead of giving a ratio.

Three schedulers: the design's (``REFERENCE_SCHEDULER``), neuronfleet's defaults (the prefill cap while
decoding ``auto``, derived here from the cost model as ``serve`` derives it), and the defaults without
the cap. Every figure is the median over ``SEEDS`` with its min-max; a ratio is taken seed by seed.
``--band`` runs the design and the defaults again with each fitted constant of the cost model moved
halved and doubled (``BAND``: Trainium2's leave-one-out errors reach +55%), at 25%, 75% and 100% load, two
seeds, 200 requests a run.

Run: ``make bench-serving`` (or ``.venv/bin/python bench/serving.py [--band]``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from deployments import DEPLOYMENTS, Deployment, num_kv_blocks, prefill_cap
from provenance import commit, show, spread
from tables import print_table

from neuronfleet.contract.config import REFERENCE_SCHEDULER, SchedulerOptions
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler
from neuronfleet.engine.offline.scenarios import ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Arrival, Timeline, percentile, serve_arrivals
from neuronfleet.engine.sim.calibration import FITTED_CONSTANTS, Calibration
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results" / "serving.json"
BAND_RESULTS = Path(__file__).resolve().parent / "results" / "serving_band.json"
NUM_REQUESTS = 300
MAX_MODEL_LEN = 8192
#: Offered load as a fraction of the design's capacity.
LOADS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1)
SEEDS = (0, 1, 2, 3, 4)
SCHEDULERS = {
    "design": REFERENCE_SCHEDULER,
    "defaults": SchedulerOptions(),
    "defaults, no cap": SchedulerOptions(max_prefill_tokens_while_decoding=None),
}
#: The sensitivity band: each fitted constant times these, at these loads and seeds, for these schedulers.
BAND = (0.5, 2.0)
BAND_LOADS = (0.25, 0.75, 1.0)
BAND_SEEDS = (0, 1)
BAND_REQUESTS = 200
BAND_SCHEDULERS = ("design", "defaults")


def shortest_stall_s(deployment: Deployment, cost: CostModel) -> float:
    """The smallest prefill bucket's step and one decode step of the largest batch: no scheduler stalls less."""
    engine = deployment.engine(REFERENCE_SCHEDULER, cost)
    smallest = engine.effective_num_batched_tokens_buckets[0]
    return cost.prefill_seconds(smallest, 0) + cost.decode_seconds(engine.max_num_seqs, engine.max_model_len)


@dataclass(frozen=True)
class Run:
    """One simulated run: a deployment, a workload, a scheduler, a rate (None: all at once), a seed."""

    deployment: Deployment
    workload: str
    scheduler: str
    rate: float | None
    seed: int
    calibration: Calibration | None = None
    num_requests: int = NUM_REQUESTS


def arrivals(workload: str, rate: float | None, seed: int, count: int = NUM_REQUESTS) -> list[Arrival]:
    """Requests with Poisson arrivals at ``rate`` per second (None: all at once); a seed fixes prompts and outputs."""
    # vLLM refuses a prompt of max_model_len tokens (no room for a reply): the longest it serves is one less.
    prompts = WORKLOADS[workload].sample(count, seed=seed, max_model_len=MAX_MODEL_LEN - 1)
    outputs, gaps = random.Random(1000 + seed), random.Random(2000 + seed)
    at, result = 0.0, []
    for i, prompt in enumerate(prompts):
        at += 0.0 if rate is None else gaps.expovariate(rate)
        max_tokens = max(1, min(2048, round(outputs.lognormvariate(5.5, 0.8))))
        result.append(Arrival(at, ScenarioRequest(f"{workload}-{i}", prompt_len=prompt, max_tokens=max_tokens)))
    return result


def simulate(run: Run) -> dict[str, float]:
    """Goodput, throughput and latency percentiles of one run (capacity too when all requests come at once)."""
    deployment = run.deployment
    cost = deployment.cost(run.calibration)
    engine_config = deployment.engine(SCHEDULERS[run.scheduler], cost)
    engine = OfflineEngine(build_scheduler(engine_config, num_kv_blocks=num_kv_blocks(cost), async_scheduling=False))
    timeline = Timeline(cost, engine_config)
    chosen = arrivals(run.workload, run.rate, run.seed, run.num_requests)
    serve_arrivals(engine, timeline, chosen)
    # A preempted request recomputes its prompt, which the timeline would stamp as new tokens.
    assert not [step for step in engine.steps if step.preempted], "a request was preempted"
    req_ids = [arrival.request.req_id for arrival in chosen]
    ttfts = [timeline.ttft(req_id) for req_id in req_ids]
    duration = timeline.clock - chosen[0].at
    good = [
        req_id
        for req_id, ttft in zip(req_ids, ttfts, strict=True)
        if ttft <= deployment.ttft_slo_s and own_itl_p99(timeline, req_id) <= deployment.itl_slo_s
    ]
    finished = sorted(timeline.token_times[req_id][-1] for req_id in req_ids)
    low, high = finished[len(finished) // 10], finished[len(finished) * 7 // 10]
    return {
        "goodput_rps": len(good) / duration,
        "output_tokens_per_s": sum(len(p.output_tokens) for p in engine.progress.values()) / duration,
        "ttft_p50_ms": percentile(ttfts, 50) * 1e3,
        "ttft_p99_ms": percentile(ttfts, 99) * 1e3,
        "itl_p99_ms": percentile(timeline.inter_token_latencies(req_ids), 99) * 1e3,
        "completions_per_s": (len(finished) * 7 // 10 - len(finished) // 10) / (high - low),
        "prefill_cap": float(prefill_cap(engine_config)),
    }


def own_itl_p99(timeline: Timeline, req_id: str) -> float:
    """A request's own inter-token latency p99 (0 for a one-token reply)."""
    gaps = timeline.inter_token_latencies([req_id])
    return percentile(gaps, 99) if gaps else 0.0


def run_all(runs: Sequence[Run], processes: int) -> list[dict[str, float]]:
    """Every run, side by side on ``processes`` processes, in order."""
    with Pool(processes) as pool:
        return pool.map(simulate, runs, chunksize=1)


def capacity(
    deployment: Deployment,
    workload: str,
    seeds: Iterable[int],
    calibration: Calibration | None,
    processes: int,
    num_requests: int = NUM_REQUESTS,
) -> float:
    """The design's steady-state completions per second with every request queued at once (median over seeds)."""
    runs = [Run(deployment, workload, "design", None, seed, calibration, num_requests) for seed in seeds]
    return statistics.median(result["completions_per_s"] for result in run_all(runs, processes))


def measure(
    deployment: Deployment,
    workload: str,
    schedulers: Sequence[str],
    loads: Sequence[float],
    seeds: Sequence[int],
    calibration: Calibration | None,
    processes: int,
    num_requests: int = NUM_REQUESTS,
) -> list[dict[str, Any]]:
    """Per load and scheduler: each figure's spread over seeds, and goodput against the design's seed by seed."""
    rps = capacity(deployment, workload, seeds, calibration, processes, num_requests)
    runs = [
        Run(deployment, workload, name, load * rps, seed, calibration, num_requests)
        for load in loads
        for name in schedulers
        for seed in seeds
    ]
    results = iter(run_all(runs, processes))
    rows = []
    for load in loads:
        by_scheduler = {name: [next(results) for _ in seeds] for name in schedulers}
        design = by_scheduler["design"]
        for name, figures in by_scheduler.items():
            row: dict[str, Any] = {
                "deployment": deployment.name,
                "workload": workload,
                "scheduler": name,
                "load": load,
                "rate": load * rps,
                "prefill_cap": int(figures[0]["prefill_cap"]) or None,
            }
            for metric in ("goodput_rps", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p99_ms"):
                row[metric] = spread([f[metric] for f in figures])
            pairs = [(ours["goodput_rps"], theirs["goodput_rps"]) for ours, theirs in zip(figures, design, strict=True)]
            if all(theirs > 0 for _, theirs in pairs):
                row["goodput_vs_design"] = spread([ours / theirs for ours, theirs in pairs])
            elif row["goodput_rps"]["median"] > 0 and (base := statistics.median(t for _, t in pairs)) > 0:
                # The design served no request within the SLO in some seed: the ratio of the medians.
                row["goodput_vs_design_of_medians"] = row["goodput_rps"]["median"] / base
            rows.append(row)
    return rows


def reachable(deployment: Deployment, calibration: Calibration | None = None) -> bool:
    """Whether any scheduler can meet the ITL SLO on a full batch (docstring above)."""
    return shortest_stall_s(deployment, deployment.cost(calibration)) <= deployment.itl_slo_s


def print_rows(deployment: Deployment, rows: list[dict[str, Any]]) -> None:
    """One deployment's table."""
    slo = f"TTFT <= {deployment.ttft_slo_s:g} s, own ITL p99 <= {deployment.itl_slo_s * 1e3:.0f} ms"
    stall = shortest_stall_s(deployment, deployment.cost()) * 1e3
    title = f"{deployment.name}: goodput with {slo}; shortest stall {stall:.0f} ms"
    if not reachable(deployment):
        title += "\nno scheduler can meet the ITL SLO: the shortest stall exceeds it (no ratios)"
    printed = []
    for row in rows:
        ratio = ratio_shown(row) if reachable(deployment) else "-"
        printed.append(
            [
                row["workload"],
                f"{row['load']:.0%} {row['rate']:.2f}/s",
                row["scheduler"],
                str(row["prefill_cap"] or "-"),
                show(row["goodput_rps"]),
                ratio,
                show(row["ttft_p99_ms"], "{:.0f}"),
                show(row["itl_p99_ms"], "{:.0f}"),
            ]
        )
    columns = ["workload", "load", "scheduler", "cap", "goodput req/s", "vs design", "TTFT p99 ms", "ITL p99 ms"]
    print_table(title, columns, printed)


def ratio_shown(row: dict[str, Any]) -> str:
    """A row's goodput against the design's: seed by seed, or of the medians where the design served none in
    some seed; "-" where the design's median is none."""
    if "goodput_vs_design" in row:
        return show(row["goodput_vs_design"])
    if "goodput_vs_design_of_medians" in row:
        return f"{row['goodput_vs_design_of_medians']:.2f} (medians)"
    return "-"


def band(processes: int) -> list[dict[str, Any]]:
    """The defaults against the design with each fitted constant of every deployment's chip moved by ``BAND``."""
    rows = []
    for deployment in DEPLOYMENTS:
        fitted = deployment.cost().calibration
        for constant in FITTED_CONSTANTS:
            for factor in BAND:
                calibration = fitted.scaled(constant, factor)
                for workload in ("chat", "code"):
                    measured = measure(
                        deployment,
                        workload,
                        BAND_SCHEDULERS,
                        BAND_LOADS,
                        BAND_SEEDS,
                        calibration,
                        processes,
                        BAND_REQUESTS,
                    )
                    for row in measured:
                        if row["scheduler"] == "defaults" and reachable(deployment, calibration):
                            rows.append({**row, "constant": constant, "factor": factor})
                            print(
                                f"{deployment.name:>26} {constant:>24} x{factor:<4} {workload:>5} "
                                f"{row['load']:>4.0%}: defaults/design {ratio_shown(row)}",
                                flush=True,
                            )
    return rows


def main() -> None:
    """Print the tables and write them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--band", action="store_true", help="run the sensitivity band instead of the main table")
    parser.add_argument("--processes", type=int, default=2, help="runs side by side")
    args = parser.parse_args()
    ran_on = commit()
    if args.band:
        banded = band(args.processes)
        BAND_RESULTS.parent.mkdir(parents=True, exist_ok=True)
        BAND_RESULTS.write_text(json.dumps({"commit": ran_on, "band": BAND, "rows": banded}, indent=2))
        print(f"commit {ran_on}; wrote {BAND_RESULTS}")
        return
    print(
        f"{NUM_REQUESTS} requests a run, medians [min-max] over {len(SEEDS)} seeds, calibrated cost model on a "
        f"virtual clock; ratios to the design's scheduler at the same load, seed by seed. Commit {ran_on}."
    )
    rows: list[dict[str, Any]] = []
    for deployment in DEPLOYMENTS:
        measured = [
            row
            for workload in ("chat", "code")
            for row in measure(deployment, workload, list(SCHEDULERS), LOADS, SEEDS, None, args.processes)
        ]
        print_rows(deployment, measured)
        rows += measured
    deployments = [{**asdict(d), "reachable": reachable(d)} for d in DEPLOYMENTS]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"commit": ran_on, "deployments": deployments, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
