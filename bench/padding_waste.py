"""Padding waste of the default prefill buckets against the recommended ones, per workload.

For each named workload (fixed seed, 20,000 prompts) this chunks the prompts as
chunked prefill does, then compares, at the same bucket count K, the power-of-two
buckets (the defaults; for a K smaller than theirs, the K largest of them), the
recommender's buckets (the exact optimum on the 128-token granularity) and the
theoretical optimum (any bucket sizes, granularity 1): the share of padded prefill
compute spent on padding, and the ratio of recommended to power-of-two. Chat is
measured at the defaults' count and at 5 buckets. It also finds the fewest buckets
whose optimum wastes no more than the defaults (fewer compiled graphs for the same
waste), and times the solver (median of repeats). Prints one table; writes the
figures as JSON to bench/results/padding_waste.json.

Run: ``make bench-padding`` (or ``.venv/bin/python bench/padding_waste.py``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from provenance import commit
from tables import print_table

from neuronfleet.contract.buckets import effective_max_num_batched_tokens, get_default_num_batched_tokens_buckets
from neuronfleet.engine.tuning.recommend import (
    Histogram,
    bucket_set,
    chunk_histogram,
    optimal_buckets,
    padding_waste,
    prompt_histogram,
    recommend,
)
from neuronfleet.engine.tuning.workloads import WORKLOADS

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


def measure(name: str, samples: int, seed: int, repeats: int, count: int | None = None) -> dict[str, Any]:
    """The figures for one workload at its own engine limits, with ``count`` buckets (default: the defaults')."""
    workload = WORKLOADS[name]
    limit = effective_max_num_batched_tokens(workload.max_num_batched_tokens, workload.max_model_len)
    prompts = prompt_histogram(workload.sample(samples, seed))
    chunks = chunk_histogram(prompts, workload.max_num_batched_tokens, workload.max_model_len)
    powers = get_default_num_batched_tokens_buckets(limit)
    count = len(powers) if count is None else count
    # The same number of compiled graphs on every side.
    power_of_two = bucket_set(chunks, powers[-count:])
    result = recommend(chunks, count, limit)
    optimal = result.recommended
    theoretical = bucket_set(chunks, optimal_buckets(chunks, count, limit, granularity=1))
    # A user picking powers of two by hand could do better than the K largest: the best such subset.
    subsets = ([*smaller, limit] for smaller in itertools.combinations(powers[:-1], count - 1))
    best_powers = min((bucket_set(chunks, subset) for subset in subsets), key=lambda s: s.padding_waste)
    return {
        "workload": name,
        "prompts": samples,
        "seed": seed,
        "max_num_batched_tokens": workload.max_num_batched_tokens,
        "max_model_len": workload.max_model_len,
        "chunks": result.chunks,
        "count": count,
        "default_buckets": power_of_two.buckets,
        "default_waste": power_of_two.padding_waste,
        "recommended_buckets": optimal.buckets,
        "recommended_waste": optimal.padding_waste,
        "best_power_of_two_buckets": best_powers.buckets,
        "best_power_of_two_waste": best_powers.padding_waste,
        "theoretical_buckets": theoretical.buckets,
        "theoretical_waste": theoretical.padding_waste,
        "ratio": optimal.padding_waste / power_of_two.padding_waste,
        "fewest_buckets_matching_default": fewest_buckets_matching(chunks, limit, power_of_two.padding_waste),
        "candidates": result.useful_sizes,
        "solve_ms_median": median_solve_ms(chunks, count, limit, repeats),
    }


def main() -> None:
    """Measure every workload, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000, help="prompts per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="solver timings per workload (median reported)")
    args = parser.parse_args()

    measured = [("chat", None), ("chat", 5), ("summarization", None), ("code", None)]
    rows = [measure(name, args.samples, args.seed, args.repeats, count) for name, count in measured]
    columns = ["workload", "limits", "K", "power of two", "best 2^k", "recommended", "optimum", "ratio", "K to match"]
    printed = [
        [
            row["workload"],
            f"{row['max_num_batched_tokens']}/{row['max_model_len']}",
            str(row["count"]),
            f"{row['default_waste']:.2%}",
            f"{row['best_power_of_two_waste']:.2%}",
            f"{row['recommended_waste']:.2%}",
            f"{row['theoretical_waste']:.2%}",
            f"{row['ratio']:.2f}",
            str(row["fewest_buckets_matching_default"]),
        ]
        for row in rows
    ]
    print_table("padding waste of the prefill buckets", columns, printed)
    print(f"{args.samples} prompts per workload, seed {args.seed}; limits are max_num_batched_tokens/max_model_len.")
    print("waste: share of padded prefill tokens that are padding; power of two: the defaults, or their K largest;")
    print("best 2^k: the best K powers of two ending on the maximum;")
    print("recommended: the exact optimum on the 128-token granularity; optimum: any sizes (granularity 1);")
    print("ratio: recommended / power of two; K to match: fewest recommended buckets wasting no more.")
    for row in rows:
        print(
            f"  {row['workload']} K={row['count']}: power of two {row['default_buckets']},"
            f" recommended {row['recommended_buckets']}"
            f" (solve {row['solve_ms_median']:.1f} ms median over {row['candidates']} candidates)"
        )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    ran_on = commit()
    document = {"commit": ran_on, "python": platform.python_version(), "machine": platform.machine(), "results": rows}
    RESULTS.write_text(json.dumps(document, indent=2) + "\n")
    print(f"commit {ran_on}; wrote {RESULTS}")


if __name__ == "__main__":
    main()
