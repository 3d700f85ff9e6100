"""What one ``schedule()`` call costs: vLLM's base scheduler against the Neuron scheduler.

64 requests decode while N more wait (max_num_seqs is 64, so none of them can be
admitted: every step is the same decode step). The bench times ``schedule()``
alone, for vLLM's ``Scheduler``, the reference ``NeuronScheduler`` (which moves
the whole waiting queue through its holdback queue every step) and the
``NeuronScheduler`` with ``constant_cost_admission``. The three take turns for
several runs (in a rotating order, so machine noise falls on all alike); each run's
figure is its median step time, and the bench reports the median over runs, their
range, and the ratio to vLLM's base scheduler measured in the same run.

Run: ``make bench-scheduler`` (or ``.venv/bin/python bench/scheduler_cost.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from provenance import commit
from tables import print_table
from vllm.sampling_params import SamplingParams

from neuronfleet.contract.config import REFERENCE_SCHEDULER, EngineConfig, SchedulerOptions
from neuronfleet.engine.offline.driver import build_vllm_config, construct_scheduler, stand_in_device_output
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.neuron import NeuronScheduler

RESULTS = Path(__file__).resolve().parent / "results" / "scheduler_cost.json"
RUNNING = 64
PROMPT_LEN = 16
MAX_MODEL_LEN = 4096
BLOCK_SIZE = 16

#: Every running request's prompt length, for the stand-in device.
PROMPT_LENS = {f"run-{i}": PROMPT_LEN for i in range(RUNNING)}
#: The configuration the others are compared with.
BASELINE = "vllm Scheduler"
CONFIGS: dict[str, tuple[type[vllm_compat.Scheduler], SchedulerOptions]] = {
    "vllm Scheduler": (vllm_compat.Scheduler, REFERENCE_SCHEDULER),
    "NeuronScheduler (reference)": (NeuronScheduler, REFERENCE_SCHEDULER),
    "NeuronScheduler (constant-cost)": (
        NeuronScheduler,
        REFERENCE_SCHEDULER.model_copy(update={"constant_cost_admission": True}),
    ),
}


def build(cls: type[vllm_compat.Scheduler], options: SchedulerOptions) -> vllm_compat.Scheduler:
    """A scheduler of ``cls`` with room for 64 requests at max_model_len."""
    engine = EngineConfig(
        max_num_seqs=RUNNING,
        max_num_batched_tokens=MAX_MODEL_LEN,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        scheduler=options,
    )
    vllm_config = build_vllm_config(engine, async_scheduling=False, enable_prefix_caching=False)
    # Room for every running request at max_model_len, plus the null block.
    num_kv_blocks = RUNNING * MAX_MODEL_LEN // BLOCK_SIZE + 1
    return construct_scheduler(cls, vllm_config, num_kv_blocks=num_kv_blocks)


def add(scheduler: vllm_compat.Scheduler, req_id: str) -> None:
    """Queue a short prompt that decodes for longer than the bench runs."""
    request = vllm_compat.Request(
        req_id,
        [1 + len(req_id)] * PROMPT_LEN,
        SamplingParams(max_tokens=MAX_MODEL_LEN - PROMPT_LEN, ignore_eos=True),
        None,
    )
    scheduler.add_request(request)


def step(scheduler: vllm_compat.Scheduler, prompt_lens: dict[str, int]) -> float:
    """One timed ``schedule()``, then the stand-in device's output fed back (not timed)."""
    start = time.perf_counter()
    output = scheduler.schedule()
    elapsed = time.perf_counter() - start
    scheduler.update_from_output(output, stand_in_device_output(output, prompt_lens))
    return elapsed


def prepared(cls: type[vllm_compat.Scheduler], options: SchedulerOptions, waiting: int) -> vllm_compat.Scheduler:
    """A scheduler with 64 requests decoding and ``waiting`` more queued behind them."""
    scheduler = build(cls, options)
    for req_id in PROMPT_LENS:
        add(scheduler, req_id)
    # Bring all 64 into decode: the Neuron scheduler prefills them one per step.
    while len(scheduler.running) < RUNNING or any(r.num_computed_tokens < PROMPT_LEN for r in scheduler.running):
        step(scheduler, PROMPT_LENS)
    for i in range(waiting):
        add(scheduler, f"wait-{i}")
    return scheduler


def measure(waiting: int, steps: int, runs: int) -> dict[str, list[float]]:
    """Per configuration, the median ``schedule()`` time of each run, in microseconds.

    The configurations take turns, in a rotating order, so a noisy stretch of the machine
    falls on all of them alike.
    """
    schedulers = {name: prepared(cls, options, waiting) for name, (cls, options) in CONFIGS.items()}
    names = list(schedulers)
    per_run: dict[str, list[float]] = {name: [] for name in names}
    for run in range(runs):
        for name in names[run % len(names) :] + names[: run % len(names)]:
            times = [step(schedulers[name], PROMPT_LENS) for _ in range(steps)]
            per_run[name].append(statistics.median(times) * 1e6)
    for name, scheduler in schedulers.items():
        assert len(scheduler.running) == RUNNING, f"{name} admitted a waiting request: the shape changed"
    return per_run


def main() -> None:
    """Print the table and write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, nargs="+", default=[0, 1_000, 10_000, 100_000])
    parser.add_argument("--steps", type=int, default=50, help="schedule() calls per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per configuration")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    printed: list[list[str]] = []
    for waiting in args.waiting:
        per_run = measure(waiting, args.steps, args.runs)
        base_us = statistics.median(per_run[BASELINE])
        for name, runs in per_run.items():
            micros = statistics.median(runs)
            rows.append(
                {
                    "waiting": waiting,
                    "scheduler": name,
                    "us_per_step": micros,
                    "us_per_step_runs": runs,
                    "ratio_to_vllm": micros / base_us,
                }
            )
            spread = f"{min(runs):.0f}-{max(runs):.0f}"
            printed.append([f"{waiting:,} waiting, {name}", f"{micros:.1f}", spread, f"{micros / base_us:.2f}"])
    print_table(
        f"schedule() cost, {RUNNING} running decodes; median of {args.runs} interleaved runs x {args.steps} steps",
        ["scheduler", "us/step", "runs min-max", "vs vllm"],
        printed,
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    ran_on = commit()
    RESULTS.write_text(json.dumps({"commit": ran_on, "running": RUNNING, "rows": rows}, indent=2))
    print(f"commit {ran_on}; wrote {RESULTS}")


if __name__ == "__main__":
    main()
