"""Concurrency and throughput on the chat workload: KV admission by max_model_len vs by each request's bound.

llama-3.1-70b on a trn2.48xlarge (tensor parallelism 32) serving a 131,072-token
context: the KV cache left beside the weights holds a dozen requests at full
length, so the reference admission (every request may grow to max_model_len)
caps concurrency there, while chat requests use a few hundred tokens each. 400
chat requests (prompt lengths from the chat workload, output lengths lognormal
around 250 tokens, fixed seeds) arrive at once. The scheduling is the real vLLM
scheduler's, times come from the simulated device's cost model on a virtual
clock. Reports the mean decode batch, output tokens per second and the mean
TTFT, with ratios to the reference measured in the same run; further rows add to
request-bound admission packed prefills (``max_prefills_per_step``), the cap on a
prefill step while requests decode (``max_prefill_tokens_while_decoding``, the default
1,024), and both.

Run: ``make bench-kv`` (or ``.venv/bin/python bench/kv_admission.py``).
"""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path
from typing import Any

from neuronfleet.engine.config import REFERENCE_SCHEDULER, EngineConfig, KvAdmission, SchedulerOptions
from neuronfleet.engine.hardware import get_instance_type
from neuronfleet.engine.offline.driver import run_scenario
from neuronfleet.engine.offline.scenarios import Scenario, ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Timeline
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.model_shapes import get_shape
from neuronfleet.engine.tuning.workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results" / "kv_admission.json"
NUM_REQUESTS = 400
MAX_MODEL_LEN = 131072
BLOCK_SIZE = 32
TENSOR_PARALLEL = 32
MEMORY_UTILIZATION = 0.9
#: Packed prefills, measured with request-bound admission: packing must not lose what it gained.
PACKED_PREFILLS = 8
#: ``max_prefill_tokens_while_decoding``, the default.
PREFILL_CAP = SchedulerOptions().max_prefill_tokens_while_decoding


def cost_model() -> CostModel:
    """llama-3.1-70b over 32 logical NeuronCores of a trn2.48xlarge."""
    return CostModel(
        get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-70b"), tensor_parallel_size=TENSOR_PARALLEL
    )


def num_kv_blocks(cost: CostModel) -> int:
    """KV blocks the replica's HBM holds beside the weights."""
    block_bytes = cost.shape.kv_bytes_per_token(cost.dtype_bytes) * BLOCK_SIZE
    return cost.kv_cache_bytes(MEMORY_UTILIZATION) // block_bytes


def scenario(kv_admission: KvAdmission, blocks: int, packed: int = 1, cap: int | None = None) -> Scenario:
    """The chat requests, all arriving at once, on a KV cache of ``blocks`` blocks.

    ``packed``: ``max_prefills_per_step``; ``cap``: ``max_prefill_tokens_while_decoding``.
    """
    engine = EngineConfig(
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK_SIZE,
        tensor_parallel_size=TENSOR_PARALLEL,
        scheduler=REFERENCE_SCHEDULER.model_copy(
            update={
                "kv_admission": kv_admission,
                "max_prefills_per_step": packed,
                "max_prefill_tokens_while_decoding": cap,
            }
        ),
    )
    prompts = WORKLOADS["chat"].sample(NUM_REQUESTS, seed=0, max_model_len=MAX_MODEL_LEN // 2)
    outputs = random.Random(1)
    requests = tuple(
        ScenarioRequest(
            f"chat-{i}", prompt_len=prompt, max_tokens=max(1, min(2048, round(outputs.lognormvariate(5.5, 0.8))))
        )
        for i, prompt in enumerate(prompts)
    )
    return Scenario("kv-admission", "bench", engine, num_kv_blocks=blocks, requests=requests)


def measure(kv_admission: KvAdmission, packed: int = 1, cap: int | None = None) -> dict[str, Any]:
    """Concurrency, throughput and TTFT of the chat requests under ``kv_admission``."""
    cost = cost_model()
    chosen = scenario(kv_admission, num_kv_blocks(cost), packed, cap)
    timeline = Timeline(cost, chosen.engine.effective_num_seqs_buckets)
    engine = run_scenario(chosen, async_scheduling=False, after_step=timeline.after_step)
    assert not [step for step in engine.steps if step.preempted], "a request was preempted"
    output_tokens = sum(len(progress.output_tokens) for progress in engine.progress.values())
    return {
        "kv_admission": kv_admission,
        "max_prefills_per_step": packed,
        "max_prefill_tokens_while_decoding": cap,
        "num_kv_blocks": chosen.num_kv_blocks,
        "max_full_length_requests": engine.scheduler._max_kv_concurrent,
        "mean_decode_batch": statistics.mean(timeline.decode_batch_sizes),
        "max_running": max(step.num_running for step in engine.steps),
        "output_tokens_per_s": output_tokens / timeline.clock,
        "mean_ttft_s": statistics.mean(timeline.ttft(r.req_id) for r in chosen.requests),
        "makespan_s": timeline.clock,
    }


def main() -> None:
    """Print the table and write it as JSON."""
    rows = [
        measure("max_model_len"),
        measure("request_bound"),
        measure("request_bound", PACKED_PREFILLS),
        measure("request_bound", cap=PREFILL_CAP),
        measure("request_bound", PACKED_PREFILLS, PREFILL_CAP),
    ]
    reference = rows[0]
    print(
        f"chat workload, {NUM_REQUESTS} requests, llama-3.1-70b on trn2.48xlarge TP {TENSOR_PARALLEL}, "
        f"max_model_len {MAX_MODEL_LEN}: {reference['num_kv_blocks']} KV blocks hold "
        f"{reference['max_full_length_requests']} full-length requests"
    )
    print(
        f"{'kv_admission':>34} {'mean batch':>10} {'max running':>11} {'tokens/s':>10} {'vs ref':>7} "
        f"{'mean TTFT s':>11}"
    )
    for row in rows:
        packed = row["max_prefills_per_step"]
        label = row["kv_admission"] + (f", {packed} packed" if packed > 1 else "")
        if row["max_prefill_tokens_while_decoding"] is not None:
            label += f", cap {row['max_prefill_tokens_while_decoding']}"
        print(
            f"{label:>34} {row['mean_decode_batch']:>10.1f} {row['max_running']:>11} "
            f"{row['output_tokens_per_s']:>10.0f} "
            f"{row['output_tokens_per_s'] / reference['output_tokens_per_s']:>7.2f} "
            f"{row['mean_ttft_s']:>11.2f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
