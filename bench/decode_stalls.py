"""Inter-token latency of running requests while long prompts prefill, with and without a stall bound.

Eight requests decode while three 32,000-token prompts arrive. The reference
scheduler hides the decodes for every 8,192-token chunk of each prompt, so their
inter-token latency spikes for the whole prompt; ``max_consecutive_prefill_steps``
inserts a decode step after that many chunks. Further rows, all with a bound of 1, pack
prefills (``max_prefills_per_step``) and cap a prefill step while requests decode
(``max_prefill_tokens_while_decoding``, the default 1,024), with and without packing:
neither must make the stalls worse. Times come from the simulated
device's cost model (trn2.48xlarge, llama-3.1-8b, tensor parallelism 8) on a
virtual clock; the scheduling is the real vLLM scheduler's. Reports, over the
decoding requests' inter-token gaps that overlap a long prompt's prefill, ITL
p50/p99 and the longest stall; the long prompts' mean TTFT; and ratios to the
reference measured in the same run.

Run: ``make bench-stalls`` (or ``.venv/bin/python bench/decode_stalls.py``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from neuronfleet.engine.config import REFERENCE_SCHEDULER, EngineConfig, SchedulerOptions
from neuronfleet.engine.hardware import get_instance_type
from neuronfleet.engine.offline.driver import run_scenario
from neuronfleet.engine.offline.scenarios import Scenario, ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Timeline, percentile
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.model_shapes import get_shape

RESULTS = Path(__file__).resolve().parent / "results" / "decode_stalls.json"
BOUNDS: list[int | None] = [None, 3, 2, 1]
#: Packed prefills, measured with the default stall bound of 1: packing must not make the stalls worse.
PACKED_PREFILLS = 8
#: ``max_prefill_tokens_while_decoding``, the default.
PREFILL_CAP = SchedulerOptions().max_prefill_tokens_while_decoding


def scenario(bound: int | None, packed: int = 1, cap: int | None = None) -> Scenario:
    """Eight decoding requests and three 32k-token prompts arriving while they decode.

    ``packed``: ``max_prefills_per_step``; ``cap``: ``max_prefill_tokens_while_decoding``.
    """
    engine = EngineConfig(
        max_num_seqs=16,
        max_num_batched_tokens=8192,
        max_model_len=65536,
        block_size=32,
        tensor_parallel_size=8,
        scheduler=REFERENCE_SCHEDULER.model_copy(
            update={
                "max_consecutive_prefill_steps": bound,
                "max_prefills_per_step": packed,
                "max_prefill_tokens_while_decoding": cap,
            }
        ),
    )
    decoding = [ScenarioRequest(f"chat-{i}", prompt_len=512, max_tokens=400) for i in range(8)]
    long_prompts = [
        ScenarioRequest(f"long-{i}", prompt_len=32000, max_tokens=16, arrival_step=20 + 60 * i) for i in range(3)
    ]
    return Scenario(
        "decode-stalls", "bench", engine, num_kv_blocks=65536 * 12 // 32, requests=(*decoding, *long_prompts)
    )


def measure(bound: int | None, packed: int = 1, cap: int | None = None) -> dict[str, Any]:
    """Inter-token latencies of the decoding requests and TTFT of the long prompts, under ``bound``."""
    chosen = scenario(bound, packed, cap)
    cost = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=8)
    timeline = Timeline(cost, chosen.engine.effective_num_seqs_buckets)
    run_scenario(chosen, async_scheduling=False, after_step=timeline.after_step)
    decoding = [r.req_id for r in chosen.requests if r.req_id.startswith("chat-")]
    long_prompts = [r.req_id for r in chosen.requests if r.req_id.startswith("long-")]
    gaps = timeline.inter_token_latencies(decoding, during=long_prompts)
    ttfts = [timeline.ttft(req_id) for req_id in long_prompts]
    return {
        "bound": bound,
        "max_prefills_per_step": packed,
        "max_prefill_tokens_while_decoding": cap,
        "itl_p50_ms": percentile(gaps, 50) * 1e3,
        "itl_p99_ms": percentile(gaps, 99) * 1e3,
        "max_stall_ms": max(gaps) * 1e3,
        "long_prompt_ttft_s": statistics.mean(ttfts),
    }


def main() -> None:
    """Print the table and write it as JSON."""
    rows = [
        *(measure(bound) for bound in BOUNDS),
        measure(1, PACKED_PREFILLS),
        measure(1, cap=PREFILL_CAP),
        measure(1, PACKED_PREFILLS, PREFILL_CAP),
    ]
    reference = rows[0]
    print("inter-token latency of decoding requests during 32k-token prefills (virtual clock, trn2, 8B, TP 8)")
    print(
        f"{'max_consecutive_prefill_steps':>40} {'ITL p50 ms':>10} {'ITL p99 ms':>10} {'max stall ms':>12} "
        f"{'p99 vs ref':>10} {'32k TTFT s':>10} {'TTFT vs ref':>11}"
    )
    for row in rows:
        label = "unbounded (reference)" if row["bound"] is None else str(row["bound"])
        if row["max_prefills_per_step"] > 1:
            label += f", {row['max_prefills_per_step']} packed"
        if row["max_prefill_tokens_while_decoding"] is not None:
            label += f", cap {row['max_prefill_tokens_while_decoding']}"
        print(
            f"{label:>40} {row['itl_p50_ms']:>10.1f} {row['itl_p99_ms']:>10.1f} {row['max_stall_ms']:>12.1f} "
            f"{row['itl_p99_ms'] / reference['itl_p99_ms']:>10.2f} {row['long_prompt_ttft_s']:>10.3f} "
            f"{row['long_prompt_ttft_s'] / reference['long_prompt_ttft_s']:>11.3f}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
