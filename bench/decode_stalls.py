"""Inter-token latency of running requests while long prompts prefill, with and without a stall bound.

Eight requests decode while three 32,000-token prompts arrive, on each deployment of
``deployments.DEPLOYMENTS`` (``max_model_len`` 65,536). The reference scheduler hides the decodes for
every 8,192-token chunk of each prompt, so their inter-token latency spikes for the whole prompt;
``max_consecutive_prefill_steps`` inserts a decode step after that many chunks. Further rows, all
with a bound of 1, pack prefills (``max_prefills_per_step``) and cap a prefill step while requests
decode (``max_prefill_tokens_while_decoding``, the default ``auto``, derived per deployment), with and
without packing: neither must make the stalls worse. Times come from the calibrated cost model on a
virtual clock; the scheduling is the real vLLM scheduler's. Reports, over the decoding requests'
inter-token gaps that overlap a long prompt's prefill, ITL p50/p99 and the longest stall, and the
long prompts' mean TTFT, as medians [min-max] over ``SEEDS`` (each seed draws the decoding requests'
prompts and the long prompts' arrival steps), with ratios to the reference measured in the same run.

Run: ``make bench-stalls`` (or ``.venv/bin/python bench/decode_stalls.py``).
"""

from __future__ import annotations

import json
import random
import statistics
from multiprocessing import Pool
from pathlib import Path
from typing import Any

from deployments import DEPLOYMENTS, Deployment, prefill_cap, scheduler_fields, scheduler_options
from provenance import commit, ratio_spread, show, spread
from tables import print_table

from neuronfleet.contract.config import AUTO, REFERENCE_SCHEDULER
from neuronfleet.engine.offline.driver import run_scenario
from neuronfleet.engine.offline.scenarios import Scenario, ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Timeline, percentile
from neuronfleet.engine.tuning.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results" / "decode_stalls.json"
SEEDS = (0, 1, 2, 3, 4)
MAX_MODEL_LEN = 65536
#: (max_consecutive_prefill_steps, max_prefills_per_step, max_prefill_tokens_while_decoding) of each row.
VARIANTS: tuple[tuple[int | None, int, int | str | None], ...] = (
    (None, 1, None),
    (3, 1, None),
    (2, 1, None),
    (1, 1, None),
    (1, 8, None),
    (1, 1, AUTO),
    (1, 8, AUTO),
)


def scenario(deployment: Deployment, variant: tuple[int | None, int, int | str | None], seed: int) -> Scenario:
    """Eight decoding requests and three 32k-token prompts arriving while they decode."""
    bound, packed, cap = variant
    options = REFERENCE_SCHEDULER.model_copy(
        update={
            "max_consecutive_prefill_steps": bound,
            "max_prefills_per_step": packed,
            "max_prefill_tokens_while_decoding": cap,
        }
    )
    engine = deployment.engine(options, deployment.cost(), max_num_seqs=16, max_model_len=MAX_MODEL_LEN)
    draw = random.Random(seed)
    prompts = WORKLOADS["chat"].sample(8, seed=seed, max_model_len=2048)
    decoding = [ScenarioRequest(f"chat-{i}", prompt_len=p, max_tokens=400) for i, p in enumerate(prompts)]
    long_prompts = [
        ScenarioRequest(f"long-{i}", prompt_len=32000, max_tokens=16, arrival_step=20 + 60 * i + draw.randrange(20))
        for i in range(3)
    ]
    return Scenario(
        "decode-stalls", "bench", engine, num_kv_blocks=MAX_MODEL_LEN * 12 // 32, requests=(*decoding, *long_prompts)
    )


def measure(job: tuple[Deployment, tuple[int | None, int, int | str | None], int]) -> dict[str, float]:
    """ITL of the decoding requests during the long prompts' prefills, and the long prompts' TTFT."""
    deployment, variant, seed = job
    chosen = scenario(deployment, variant, seed)
    timeline = Timeline(deployment.cost(), chosen.engine)
    run_scenario(chosen, async_scheduling=False, after_step=timeline.after_step)
    decoding = [r.req_id for r in chosen.requests if r.req_id.startswith("chat-")]
    long_prompts = [r.req_id for r in chosen.requests if r.req_id.startswith("long-")]
    gaps = timeline.inter_token_latencies(decoding, during=long_prompts)
    return {
        "itl_p50_ms": percentile(gaps, 50) * 1e3,
        "itl_p99_ms": percentile(gaps, 99) * 1e3,
        "max_stall_ms": max(gaps) * 1e3,
        "long_prompt_ttft_s": statistics.mean(timeline.ttft(req_id) for req_id in long_prompts),
        "cap": float(prefill_cap(chosen.engine)),
    }


def label(variant: tuple[int | None, int, int | str | None], cap: int) -> str:
    """A row's scheduler, as the table names it."""
    bound, packed, wanted = variant
    return ("unbounded (reference)" if bound is None else f"bound {bound}") + scheduler_options(packed, wanted, cap)


def main() -> None:
    """Print the tables and write them as JSON."""
    jobs = [(deployment, variant, seed) for deployment in DEPLOYMENTS for variant in VARIANTS for seed in SEEDS]
    with Pool(2) as pool:
        results = iter(pool.map(measure, jobs, chunksize=1))
    ran_on = commit()
    print(f"ITL of 8 decoding requests during three 32k-token prefills; medians [min-max] over {len(SEEDS)} seeds")
    print(f"(calibrated cost model, virtual clock); ratios to the reference seed by seed. Commit {ran_on}.")
    rows: list[dict[str, Any]] = []
    for deployment in DEPLOYMENTS:
        measured = {variant: [next(results) for _ in SEEDS] for variant in VARIANTS}
        reference = measured[VARIANTS[0]]
        printed: list[list[str]] = []
        for variant, figures in measured.items():
            row: dict[str, Any] = {
                "deployment": deployment.name,
                "bound": variant[0],
                **scheduler_fields(variant[1], variant[2], int(figures[0]["cap"])),
                **{
                    key: spread([f[key] for f in figures])
                    for key in ("itl_p50_ms", "itl_p99_ms", "max_stall_ms", "long_prompt_ttft_s")
                },
                "itl_p99_vs_reference": ratio_spread(figures, reference, "itl_p99_ms"),
                "ttft_vs_reference": ratio_spread(figures, reference, "long_prompt_ttft_s"),
            }
            rows.append(row)
            printed.append(
                [
                    label(variant, int(figures[0]["cap"])),
                    show(row["itl_p99_ms"], "{:.0f}"),
                    show(row["itl_p99_vs_reference"]),
                    show(row["max_stall_ms"], "{:.0f}"),
                    show(row["ttft_vs_reference"], "{:.3f}"),
                ]
            )
        columns = ["scheduler", "ITL p99 ms", "p99 vs ref", "max stall ms", "32k TTFT vs ref"]
        print_table(deployment.name, columns, printed)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"commit": ran_on, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
