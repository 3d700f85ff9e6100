"""Concurrency and throughput on the chat workload: KV admission by max_model_len vs by each request's bound.

Each deployment of ``deployments.DEPLOYMENTS`` serves a 131,072-token context, with decode context
buckets (``CONTEXT_BUCKETS``) so that a decode step reads the context its requests reach rather than
131,072 tokens a row. The KV cache left beside the weights holds a few requests at full length (fewer
still where KV heads are replicated), so the reference admission (every request may grow to
max_model_len) caps concurrency there, while chat requests use a few hundred tokens each. 400 chat
requests (prompt lengths from the chat workload, output lengths lognormal around 250 tokens) arrive at
once. The scheduling is the real vLLM scheduler's, times come from the calibrated cost model on a
virtual clock. Reports the mean decode batch, output tokens per second and the mean TTFT as medians
[min-max] over ``SEEDS``, with ratios to the reference seed by seed; further rows add to request-bound
admission packed prefills (``max_prefills_per_step``), the prefill cap while decoding (``auto``), and
both.

Run: ``make bench-kv`` (or ``.venv/bin/python bench/kv_admission.py``).
"""

from __future__ import annotations

import json
import random
import statistics
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from deployments import DEPLOYMENTS, Deployment, num_kv_blocks, prefill_cap, scheduler_fields, scheduler_options
from provenance import commit, ratio_spread, show, spread
from tables import print_table

from neuronfleet.contract.config import AUTO, REFERENCE_SCHEDULER
from neuronfleet.engine.offline.driver import run_scenario
from neuronfleet.engine.offline.scenarios import Scenario, ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Timeline
from neuronfleet.engine.tuning.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results" / "kv_admission.json"
NUM_REQUESTS = 400
MAX_MODEL_LEN = 131072
CONTEXT_BUCKETS = [4096, 16384, 65536]
SEEDS = (0, 1, 2, 3, 4)
#: (kv_admission, max_prefills_per_step, max_prefill_tokens_while_decoding) of each row; the first is the reference.
VARIANTS: tuple[tuple[str, int, str | None], ...] = (
    ("max_model_len", 1, None),
    ("request_bound", 1, None),
    ("request_bound", 8, None),
    ("request_bound", 1, AUTO),
    ("request_bound", 8, AUTO),
)


def scenario(deployment: Deployment, variant: tuple[str, int, str | None], seed: int) -> Scenario:
    """The chat requests, all arriving at once, on the replica's KV cache."""
    admission, packed, cap = variant
    options = REFERENCE_SCHEDULER.model_copy(
        update={"kv_admission": admission, "max_prefills_per_step": packed, "max_prefill_tokens_while_decoding": cap}
    )
    cost = deployment.cost()
    engine = deployment.engine(
        options, cost, max_model_len=MAX_MODEL_LEN, decode_context_length_buckets=CONTEXT_BUCKETS
    )
    prompts = WORKLOADS["chat"].sample(NUM_REQUESTS, seed=seed, max_model_len=MAX_MODEL_LEN // 2)
    outputs = random.Random(1000 + seed)
    requests = tuple(
        ScenarioRequest(
            f"chat-{i}", prompt_len=p, max_tokens=max(1, min(2048, round(outputs.lognormvariate(5.5, 0.8))))
        )
        for i, p in enumerate(prompts)
    )
    return Scenario("kv-admission", "bench", engine, num_kv_blocks=num_kv_blocks(cost), requests=requests)


def measure(job: tuple[Deployment, tuple[str, int, str | None], int]) -> dict[str, float]:
    """Concurrency, throughput and TTFT of the chat requests."""
    deployment, variant, seed = job
    chosen = scenario(deployment, variant, seed)
    timeline = Timeline(deployment.cost(), chosen.engine)
    # Admitted by max_model_len, one request at a time on a small KV cache: a step for each of their ~100k tokens.
    engine = run_scenario(chosen, async_scheduling=False, after_step=timeline.after_step, max_iterations=1_000_000)
    assert not [step for step in engine.steps if step.preempted], "a request was preempted"
    output_tokens = sum(len(progress.output_tokens) for progress in engine.progress.values())
    return {
        "max_full_length_requests": float(engine.scheduler._max_kv_concurrent),
        "mean_decode_batch": statistics.mean(timeline.decode_batch_sizes),
        "output_tokens_per_s": output_tokens / timeline.clock,
        "mean_ttft_s": statistics.mean(timeline.ttft(r.req_id) for r in chosen.requests),
        "cap": float(prefill_cap(chosen.engine)),
    }


def label(variant: tuple[str, int, str | None], cap: int) -> str:
    """A row's admission and options, as the table names them."""
    admission, packed, wanted = variant
    return admission + scheduler_options(packed, wanted, cap)


def main() -> None:
    """Print the tables and write them as JSON."""
    jobs = [(deployment, variant, seed) for deployment in DEPLOYMENTS for variant in VARIANTS for seed in SEEDS]
    with Pool(2) as pool:
        results = iter(pool.map(measure, jobs, chunksize=1))
    ran_on = commit()
    print(
        f"chat, {NUM_REQUESTS} requests at once, max_model_len {MAX_MODEL_LEN}, decode context buckets "
        f"{CONTEXT_BUCKETS}; medians [min-max] over {len(SEEDS)} seeds, ratios to admission by max_model_len seed "
        f"by seed. Commit {ran_on}."
    )
    rows: list[dict[str, Any]] = []
    for deployment in DEPLOYMENTS:
        measured = {variant: [next(results) for _ in SEEDS] for variant in VARIANTS}
        reference = measured[VARIANTS[0]]
        full = int(reference[0]["max_full_length_requests"])
        printed: list[list[str]] = []
        for variant, figures in measured.items():
            row: dict[str, Any] = {
                "deployment": deployment.name,
                "kv_admission": variant[0],
                **scheduler_fields(variant[1], variant[2], int(figures[0]["cap"])),
                "max_full_length_requests": full,
                **{
                    key: spread([f[key] for f in figures])
                    for key in ("mean_decode_batch", "output_tokens_per_s", "mean_ttft_s")
                },
                "throughput_vs_reference": ratio_spread(figures, reference, "output_tokens_per_s"),
            }
            rows.append(row)
            printed.append(
                [
                    label(variant, int(figures[0]["cap"])),
                    show(row["mean_decode_batch"], "{:.1f}"),
                    show(row["output_tokens_per_s"], "{:.0f}"),
                    show(row["throughput_vs_reference"]),
                    show(row["mean_ttft_s"], "{:.1f}"),
                ]
            )
        print_table(
            f"{deployment.name}: the KV cache holds {full} full-length requests",
            ["kv_admission", "mean batch", "tokens/s", "vs ref", "mean TTFT s"],
            printed,
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"commit": ran_on, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
