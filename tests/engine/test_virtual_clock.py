"""The virtual clock and the open-loop driver, on the real vLLM scheduler."""

from __future__ import annotations

import pytest

from neuronfleet.contract.buckets import get_bucket_for_count
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler
from neuronfleet.engine.offline.scenarios import ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Arrival, Timeline, percentile, serve_arrivals
from neuronfleet.engine.sim.cost_model import CostModel

ENGINE = EngineConfig(
    max_num_seqs=4,
    max_num_batched_tokens=512,
    max_model_len=1024,
    block_size=16,
    num_batched_tokens_buckets=[128, 256, 512],
)


def run(arrivals: list[Arrival]) -> tuple[OfflineEngine, Timeline, CostModel]:
    cost = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=8)
    engine = OfflineEngine(build_scheduler(ENGINE, num_kv_blocks=256, async_scheduling=False))
    timeline = Timeline(cost, ENGINE)
    serve_arrivals(engine, timeline, arrivals)
    return engine, timeline, cost


def test_an_idle_engine_jumps_to_the_arrival_and_ttft_is_the_padded_prefill() -> None:
    engine, timeline, cost = run([Arrival(5.0, ScenarioRequest("late", prompt_len=100, max_tokens=3))])
    assert timeline.arrival["late"] == 5.0
    # 100 tokens run in the 128-token bucket: the first token lands one padded prefill later.
    assert timeline.ttft("late") == pytest.approx(cost.prefill_seconds(128, 0))
    assert len(timeline.token_times["late"]) == 3 == len(engine.progress["late"].output_tokens)
    # One request in the 1-sequence graph, reading the compiled context (max_model_len).
    decode = cost.decode_seconds(get_bucket_for_count(1, ENGINE.effective_num_seqs_buckets), ENGINE.max_model_len)
    assert timeline.token_times["late"][1] - timeline.token_times["late"][0] == pytest.approx(decode)


def test_a_request_arriving_mid_step_waits_for_the_step_but_its_ttft_counts_from_arrival() -> None:
    first = ScenarioRequest("first", prompt_len=500, max_tokens=4)
    second = ScenarioRequest("second", prompt_len=50, max_tokens=2)
    engine, timeline, cost = run([Arrival(0.0, first), Arrival(1e-6, second)])
    first_prefill = cost.prefill_seconds(512, 0)
    assert timeline.token_times["first"][0] == pytest.approx(first_prefill)
    # The second request is added once the first prefill ends, then prefills alone.
    assert timeline.ttft("second") == pytest.approx(first_prefill + cost.prefill_seconds(128, 0) - 1e-6)
    assert not engine.unfinished()


def test_every_arrival_finishes_in_arrival_order_of_first_tokens_when_spaced_out() -> None:
    arrivals = [Arrival(10.0 * i, ScenarioRequest(f"r{i}", prompt_len=64, max_tokens=5)) for i in range(4)]
    engine, timeline, _ = run(list(reversed(arrivals)))
    firsts = [timeline.token_times[f"r{i}"][0] for i in range(4)]
    assert firsts == sorted(firsts)
    assert all(10.0 * i < first < 10.0 * (i + 1) for i, first in enumerate(firsts))
    assert all(len(progress.output_tokens) == 5 for progress in engine.progress.values())


def test_percentile_interpolates() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0


def test_percentile_refuses_what_it_cannot_answer() -> None:
    for q in (0, 100, 99.5):
        with pytest.raises(ValueError, match="whole number from 1 to 99"):
            percentile([1.0, 2.0], q)


def test_gaps_during_a_long_prefill_are_the_ones_that_span_its_chunks() -> None:
    short = ScenarioRequest("short", prompt_len=64, max_tokens=60)
    # 1000 tokens over a 512-token budget: two chunks, with a decode step between them (the default bound).
    long = ScenarioRequest("long", prompt_len=1000, max_tokens=2)
    _, timeline, cost = run([Arrival(0.0, short), Arrival(0.05, long)])
    start, end = timeline.prefill_spans["long"]
    assert end - start > cost.prefill_seconds(512, 0) + cost.prefill_seconds(512, 512)
    during = timeline.inter_token_latencies(["short"], during=["long"])
    every = timeline.inter_token_latencies(["short"])
    assert len(every) == 59
    # One gap holds each chunk (and the decode after it); every other gap is a decode step alone.
    assert len(during) == 2
    assert all(gap > cost.prefill_seconds(512, 0) for gap in during)
    assert sorted(every)[-2:] == sorted(during)
    assert max(gap for gap in every if gap not in during) < cost.prefill_seconds(512, 0)


def test_a_batched_decode_step_reads_the_compiled_context_of_every_row_of_its_padded_batch() -> None:
    ids = ["r0", "r1", "r2"]
    _, timeline, cost = run([Arrival(0.0, ScenarioRequest(req_id, prompt_len=100, max_tokens=6)) for req_id in ids])
    # The first step in which all three decode together (padded to the 4-sequence bucket).
    together = min(set.intersection(*(set(timeline.token_times[req_id][1:]) for req_id in ids)))
    before = max(t for req_id in ids for t in timeline.token_times[req_id] if t < together)
    # However few tokens each holds, every row reads the compiled context: max_model_len.
    assert together - before == pytest.approx(cost.decode_seconds(4, ENGINE.max_model_len))
    assert 3 in timeline.decode_batch_sizes


def test_decode_context_buckets_read_the_smallest_context_holding_the_longest_sequence() -> None:
    engine = ENGINE.model_copy(update={"decode_context_length_buckets": [128, 256]})
    cost = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=8)
    offline = OfflineEngine(build_scheduler(engine, num_kv_blocks=256, async_scheduling=False))
    timeline = Timeline(cost, engine)
    # A 120-token prompt: its first decodes read 128 tokens of context, then 256 from position 128 on.
    serve_arrivals(offline, timeline, [Arrival(0.0, ScenarioRequest("r", prompt_len=120, max_tokens=20))])
    gaps = timeline.inter_token_latencies(["r"])
    assert gaps[0] == pytest.approx(cost.decode_seconds(1, 128))
    assert gaps[-1] == pytest.approx(cost.decode_seconds(1, 256))
    assert cost.decode_seconds(1, 256) < cost.decode_seconds(1, ENGINE.max_model_len)
