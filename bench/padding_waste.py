"""Padding waste of the default prefill buckets against the recommended ones, per workload.

For each named workload (fixed seed, 20,000 prompts) this chunks the prompts as
chunked prefill does, then compares the power-of-two default buckets with the
exact optimum of the same size: the share of padded prefill compute spent on
padding, and the ratio of the two. It also finds the fewest buckets whose optimum
wastes no more than the defaults (fewer compiled graphs for the same waste), and
times the solver (median of repeats). Prints one table; writes the figures as JSON
to bench/results/padding_waste.json.

Run: ``make bench-padding`` (or ``.venv/bin/python bench/padding_waste.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from neuronfleet.engine.buckets import effective_max_num_batched_tokens, get_default_num_batched_tokens_buckets
from neuronfleet.engine.recommend import (
    Histogram,
    chunk_histogram,
    optimal_buckets,
    padding_waste,
    prompt_histogram,
    recommend,
)
from neuronfleet.engine.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results" / "padding_waste.json"


def fewest_buckets_matching(chunks: Histogram, effective_max: int, target: float) -> int:
    """The smallest bucket count whose optimum wastes no more than ``target``."""
    count = 1
    while padding_waste(chunks, optimal_buckets(chunks, count, effective_max)) > target:
        count += 1
    return count


def median_solve_ms(chunks: Histogram, count: int, effective_max: int, repeats: int) -> float:
    """Median wall time of one exact solve, in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        optimal_buckets(chunks, count, effective_max)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(name: str, samples: int, seed: int, repeats: int) -> dict[str, Any]:
    """The figures for one workload at its own engine limits."""
    workload = WORKLOADS[name]
    limit = effective_max_num_batched_tokens(workload.max_num_batched_tokens, workload.max_model_len)
    prompts = prompt_histogram(workload.sample(samples, seed))
    chunks = chunk_histogram(prompts, workload.max_num_batched_tokens, workload.max_model_len)
    # Recommend as many buckets as the defaults have: the same number of compiled graphs.
    result = recommend(chunks, len(get_default_num_batched_tokens_buckets(limit)), limit)
    default, optimal = result.default, result.recommended
    return {
        "workload": name,
        "prompts": samples,
        "seed": seed,
        "max_num_batched_tokens": workload.max_num_batched_tokens,
        "max_model_len": workload.max_model_len,
        "chunks": result.chunks,
        "count": default.count,
        "default_buckets": default.buckets,
        "default_waste": default.padding_waste,
        "recommended_buckets": optimal.buckets,
        "recommended_waste": optimal.padding_waste,
        "ratio": optimal.padding_waste / default.padding_waste,
        "fewest_buckets_matching_default": fewest_buckets_matching(chunks, limit, default.padding_waste),
        "candidates": result.useful_sizes,
        "solve_ms_median": median_solve_ms(chunks, default.count, limit, repeats),
    }


def main() -> None:
    """Measure every workload, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000, help="prompts per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="solver timings per workload (median reported)")
    args = parser.parse_args()

    rows = [measure(name, args.samples, args.seed, args.repeats) for name in ("chat", "summarization", "code")]
    header = (
        f"{'workload':<14}{'limits':>12}{'K':>4}{'default waste':>15}{'recommended':>13}{'ratio':>7}{'K to match':>12}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        limits = f"{row['max_num_batched_tokens']}/{row['max_model_len']}"
        print(
            f"{row['workload']:<14}{limits:>12}{row['count']:>4}{row['default_waste']:>15.2%}"
            f"{row['recommended_waste']:>13.2%}{row['ratio']:>7.2f}{row['fewest_buckets_matching_default']:>12}"
        )
    print()
    print(f"{args.samples} prompts per workload, seed {args.seed}; limits are max_num_batched_tokens/max_model_len.")
    print("waste: share of padded prefill compute spent on padding; ratio: recommended / default at the same K;")
    print("K to match: fewest recommended buckets that waste no more than the defaults.")
    for row in rows:
        print(
            f"  {row['workload']}: recommended {row['recommended_buckets']}"
            f" (solve {row['solve_ms_median']:.1f} ms median over {row['candidates']} candidates)"
        )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    document = {"python": platform.python_version(), "machine": platform.machine(), "results": rows}
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
