"""What one ``schedule()`` call costs: vLLM's base scheduler against the Neuron scheduler.

64 requests decode while N more wait (max_num_seqs is 64, so none of them can be
admitted: every step is the same decode step). The bench times ``schedule()``
alone, for vLLM's ``Scheduler``, the reference ``NeuronScheduler`` (which moves
the whole waiting queue through its holdback queue every step) and the
``NeuronScheduler`` with ``constant_cost_admission``. Per configuration it takes
the median step time of each of several runs, and reports the median of those,
with the ratio to vLLM's base scheduler measured in the same run.

Run: ``make bench-scheduler`` (or ``.venv/bin/python bench/scheduler_cost.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from vllm.sampling_params import SamplingParams

from neuronfleet.engine import vllm_compat
from neuronfleet.engine.config import REFERENCE_SCHEDULER, EngineConfig, SchedulerOptions
from neuronfleet.engine.offline import build_vllm_config, construct_scheduler, stand_in_device_output
from neuronfleet.engine.scheduler import NeuronScheduler

RESULTS = Path(__file__).resolve().parent / "results" / "scheduler_cost.json"
RUNNING = 64
PROMPT_LEN = 16
MAX_MODEL_LEN = 4096
BLOCK_SIZE = 16

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


def measure(cls: type[vllm_compat.Scheduler], options: SchedulerOptions, waiting: int, steps: int, runs: int) -> float:
    """Median over runs of the median ``schedule()`` time, in microseconds."""
    scheduler = build(cls, options)
    prompt_lens = {f"run-{i}": PROMPT_LEN for i in range(RUNNING)}
    for req_id in prompt_lens:
        add(scheduler, req_id)
    # Bring all 64 into decode: the Neuron scheduler prefills them one per step.
    while len(scheduler.running) < RUNNING or any(r.num_computed_tokens < PROMPT_LEN for r in scheduler.running):
        step(scheduler, prompt_lens)
    for i in range(waiting):
        add(scheduler, f"wait-{i}")
    per_run = []
    for _ in range(runs):
        times = [step(scheduler, prompt_lens) for _ in range(steps)]
        per_run.append(statistics.median(times))
    assert len(scheduler.running) == RUNNING, "a waiting request was admitted: the bench no longer measures one shape"
    return statistics.median(per_run) * 1e6


def main() -> None:
    """Print the table and write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, nargs="+", default=[0, 1_000, 10_000, 100_000])
    parser.add_argument("--steps", type=int, default=50, help="schedule() calls per run")
    parser.add_argument("--runs", type=int, default=5, help="runs per configuration")
    args = parser.parse_args()

    rows: list[dict[str, Any]] = []
    print(f"schedule() cost, {RUNNING} running decodes; median of {args.runs} runs x {args.steps} steps")
    print(f"{'waiting':>8}  {'scheduler':<32} {'us/step':>10} {'vs vllm':>8}")
    for waiting in args.waiting:
        base_us = None
        for name, (cls, options) in CONFIGS.items():
            micros = measure(cls, options, waiting, args.steps, args.runs)
            base_us = base_us or micros
            rows.append(
                {"waiting": waiting, "scheduler": name, "us_per_step": micros, "ratio_to_vllm": micros / base_us}
            )
            print(f"{waiting:>8}  {name:<32} {micros:>10.1f} {micros / base_us:>8.2f}", flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"running": RUNNING, "rows": rows}, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
