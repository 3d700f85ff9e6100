"""Packed prefills (``max_prefills_per_step``) on the real vLLM scheduler, with the design kept when it is off."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from neuronfleet.contract.buckets import get_bucket_for_count
from neuronfleet.contract.config import REFERENCE_SCHEDULER, EngineConfig, SchedulerOptions
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.offline.driver import OfflineEngine, StepRecord, build_scheduler, run_scenario
from neuronfleet.engine.offline.scenarios import SCENARIOS, Scenario, ScenarioRequest, prompt_token_ids
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.padding import PrefillSequence, pad_packed_prefill, pad_prefill
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.device import Clock, ShapeNotCompiledError, SimulatedNeuronDevice

pytestmark = pytest.mark.vllm_matrix

PACKING = SchedulerOptions(max_prefills_per_step=4)
ENGINE = EngineConfig(
    max_num_seqs=8,
    max_num_batched_tokens=1024,
    max_model_len=2048,
    block_size=16,
    num_batched_tokens_buckets=[128, 256, 512, 1024],
    scheduler=PACKING,
)
COST = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=8)


def scenario(*prompts: int, engine: EngineConfig = ENGINE, num_kv_blocks: int = 2048, max_tokens: int = 3) -> Scenario:
    requests = tuple(ScenarioRequest(f"r{i}", prompt_len=n, max_tokens=max_tokens) for i, n in enumerate(prompts))
    return Scenario("packing", "test", engine, num_kv_blocks, requests)


def prefill_steps(engine: OfflineEngine) -> list[list[tuple[str, int, int]]]:
    """(request, actual, padded) of every prefill step's requests, step by step."""
    return [
        [(item.req_id, item.num_tokens, item.num_tokens_padded) for item in step.scheduled]
        for step in engine.steps
        if step.is_prefill
    ]


def assert_all_served(engine: OfflineEngine) -> None:
    for req_id, progress in engine.progress.items():
        assert progress.finished, req_id
        assert len(progress.output_tokens) == progress.max_tokens, req_id


def test_packing_is_off_by_default_and_the_design_runs_one_prefill_per_step() -> None:
    assert SchedulerOptions().max_prefills_per_step == REFERENCE_SCHEDULER.max_prefills_per_step == 1
    off = dataclasses.replace(scenario(50, 40, 20), engine=ENGINE.model_copy(update={"scheduler": SchedulerOptions()}))
    engine = run_scenario(off, async_scheduling=False)
    assert engine.scheduler.max_prefills_per_batch == 1
    assert prefill_steps(engine) == [[("r0", 50, 128)], [("r1", 40, 128)], [("r2", 20, 128)]]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_short_prompts_share_one_step_padded_once(async_scheduling: bool) -> None:
    engine = run_scenario(scenario(50, 40, 20), async_scheduling=async_scheduling)
    assert engine.scheduler.max_prefills_per_batch == 4
    # 110 tokens in the 128 bucket: each keeps its actual count, the last carries the padding.
    assert prefill_steps(engine) == [[("r0", 50, 50), ("r1", 40, 40), ("r2", 20, 38)]]
    assert engine.scheduler.total_padding_tokens == 18
    assert engine.scheduler.prefill_steps_by_bucket == {128: 1}
    assert_all_served(engine)


def test_a_pack_never_runs_in_a_larger_bucket_than_its_largest_member() -> None:
    # 300 alone is a 512 step; 150 joins it (450). 100 would make 550, a 1024 step: it waits.
    engine = run_scenario(scenario(300, 150, 100, 400), async_scheduling=False)
    steps = prefill_steps(engine)
    assert steps[0] == [("r0", 300, 300), ("r1", 150, 212)]
    # 100 then 400: the 512 bucket holds both, as 400 alone would need it.
    assert steps[1] == [("r2", 100, 100), ("r3", 400, 412)]
    assert_all_served(engine)


def test_a_long_prompt_runs_alone_and_is_chunked_as_in_the_design() -> None:
    engine = run_scenario(scenario(2000, 50, 50), async_scheduling=False)
    steps = prefill_steps(engine)
    assert steps[:2] == [[("r0", 1024, 1024)], [("r0", 976, 1024)]]
    assert steps[2] == [("r1", 50, 50), ("r2", 50, 78)]


def test_capacity_counts_the_prefills_packed_into_the_step() -> None:
    engine_cfg = ENGINE.model_copy(update={"max_num_seqs": 2, "num_seqs_buckets": None})
    engine = run_scenario(scenario(10, 10, 10, 10, engine=engine_cfg), async_scheduling=False)
    assert [len(step) for step in prefill_steps(engine)] == [2, 2]
    assert max(step.num_running for step in engine.steps) == 2


@pytest.mark.parametrize(("kv_admission", "packed"), [("max_model_len", 2), ("request_bound", 3)])
def test_kv_admission_counts_the_prefills_packed_into_the_step(kv_admission: str, packed: int) -> None:
    # 160 blocks of 16 tokens (159 usable) hold 2 requests at max_model_len 1024, and 3 bounded at
    # 30 + 600 tokens (40 blocks each): four short prompts would pack, KV admits fewer.
    engine_cfg = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        max_model_len=1024,
        block_size=16,
        scheduler=PACKING.model_copy(update={"kv_admission": kv_admission}),
    )
    chosen = scenario(30, 30, 30, 30, engine=engine_cfg, num_kv_blocks=160, max_tokens=600)
    engine = run_scenario(chosen, async_scheduling=False)
    assert len(prefill_steps(engine)[0]) == packed
    assert max(step.num_running for step in engine.steps) == packed
    assert engine.scheduler.num_kv_deferred_admissions > 0
    assert not [step for step in engine.steps if step.preempted]
    assert_all_served(engine)


def test_packed_layout_is_ragged_and_one_sequence_pads_as_the_design() -> None:
    blocks = [3, 4]
    single = pad_packed_prefill([PrefillSequence([7] * 5, 2, blocks)], 4, 8)
    design = pad_prefill([7] * 5, 2, blocks, 4, 8)
    assert (single.input_ids, single.positions, single.slot_mapping) == (
        design.input_ids,
        design.positions,
        design.slot_mapping,
    )
    assert single.logits_indices == [design.logits_index]
    packed = pad_packed_prefill([PrefillSequence([1, 2], 0, [5]), PrefillSequence([3, 4, 5], 4, [6, 7])], 4, 8)
    assert packed.input_ids == [1, 2, 3, 4, 5, 0, 0, 0]
    assert packed.positions == [0, 1, 4, 5, 6, 6, 6, 6]
    assert packed.slot_mapping == [20, 21, 28, 29, 30, 0, 0, 0]
    assert (packed.query_start, packed.logits_indices) == ([0, 2, 5], [1, 4])
    with pytest.raises(ValueError, match="smaller than the packed chunks"):
        pad_packed_prefill([PrefillSequence([1] * 5, 0, [1, 2])], 4, 4)


def test_a_packed_step_costs_its_bucket_as_one_sequence_over_every_context() -> None:
    assert COST.packed_prefill_seconds([(512, 1000)]) == COST.prefill_seconds(512, 1000)
    packed = COST.packed_prefill_seconds([(300, 0), (212, 0)])
    # The graph masks rather than skips the tiles between sequences: the bucket costs what one 512 prompt does,
    # so a pack saves steps (fixed costs), never compute.
    assert packed == pytest.approx(COST.prefill_seconds(512, 0), rel=1e-3)
    assert packed > COST.prefill_seconds(300, 0)
    # Longer contexts cost more attention.
    assert COST.packed_prefill_seconds([(300, 4000), (212, 0)]) > packed
    assert packed < COST.prefill_seconds(300, 0) + COST.prefill_seconds(212, 0)


def run_on_device(max_prefills_per_step: int) -> list[tuple[str, int, int, float]]:
    scheduler = build_scheduler(ENGINE, num_kv_blocks=2048, async_scheduling=False)
    device = SimulatedNeuronDevice(
        COST,
        block_size=ENGINE.block_size,
        prefill_buckets=ENGINE.effective_num_batched_tokens_buckets,
        decode_buckets=ENGINE.effective_num_seqs_buckets,
        decode_context_buckets=ENGINE.decode_context_buckets,
        clock=Clock("virtual"),
        max_prefills_per_step=max_prefills_per_step,
    )
    engine = OfflineEngine(scheduler)
    for request in scenario(50, 40, 20).requests:
        engine.add_request(request.req_id, prompt_token_ids(request), request.max_tokens)
    ran: list[tuple[str, int, int, float]] = []
    while scheduler.has_requests():
        output = scheduler.schedule()
        result = device.execute(output)
        scheduler.update_from_output(output, result.output)
        ran.append((result.kind, result.bucket, result.real, result.seconds))
    return ran


def test_the_simulated_device_runs_a_pack_as_one_graph_and_refuses_it_when_the_graph_takes_one() -> None:
    ran = run_on_device(4)
    assert ran[0] == ("prefill", 128, 110, COST.packed_prefill_seconds([(50, 0), (40, 0), (38, 0)]))
    assert [kind for kind, *_ in ran[1:] if kind != "empty"] == ["decode"] * 2
    with pytest.raises(ShapeNotCompiledError, match=r"3 prefills in one step; the prefill graph takes at most 1"):
        run_on_device(1)


# Random workloads: the guarantees hold at every step -------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> Scenario:
    block_size = draw(st.sampled_from([8, 16, 32]))
    max_model_len = draw(st.sampled_from([256, 512, 1024]))
    max_num_batched_tokens = draw(st.sampled_from([128, 256, 512, 1024]))
    max_num_seqs = draw(st.integers(min_value=1, max_value=8))
    limit = min(max_num_batched_tokens, max_model_len)
    inner = draw(st.lists(st.integers(min_value=1, max_value=limit - 1), max_size=4, unique=True))
    options = SchedulerOptions(
        max_prefills_per_step=draw(st.integers(min_value=2, max_value=8)),
        constant_cost_admission=draw(st.booleans()),
        max_consecutive_prefill_steps=draw(st.sampled_from([None, 1, 2])),
        kv_admission=draw(st.sampled_from(["max_model_len", "request_bound"])),
    )
    engine = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        block_size=block_size,
        num_batched_tokens_buckets=[*sorted(inner), limit],
        scheduler=options,
    )
    blocks_per_request = -(-max_model_len // block_size)
    num_kv_blocks = draw(
        st.integers(min_value=blocks_per_request + 1, max_value=blocks_per_request * 6)
        | st.integers(min_value=2, max_value=6).map(lambda n: n * blocks_per_request)
    )
    requests = []
    for i in range(draw(st.integers(min_value=1, max_value=12))):
        if draw(st.integers(min_value=0, max_value=3)) == 0:
            # Grows to max_model_len: the worst case KV admission must plan for.
            prompt_len = draw(st.integers(min_value=max(1, max_model_len - 40), max_value=max_model_len - 1))
            max_tokens = max_model_len - prompt_len
        else:
            # Mostly short prompts, so that several wait at once and pack; some may grow to
            # max_model_len, so that a pack of them can outgrow the KV cache.
            prompt_len = draw(st.integers(min_value=1, max_value=min(max_model_len - 2, limit // 2)))
            longest = max_model_len - prompt_len
            max_tokens = draw(st.integers(min_value=1, max_value=min(8, longest)) | st.just(longest))
        arrival = draw(st.integers(min_value=0, max_value=12))
        requests.append(ScenarioRequest(f"r{i}", prompt_len, max_tokens, arrival_step=arrival))
    return Scenario("random", "hypothesis", engine, num_kv_blocks, tuple(requests))


def kv_blocks_held_at_most(engine: OfflineEngine) -> int:
    """KV blocks the running requests may grow to: prompt plus every token they may generate."""
    scheduler = engine.scheduler
    return sum(
        -(-min(scheduler.max_model_len, r.num_prompt_tokens + r.max_tokens) // scheduler.block_size)
        for r in scheduler.running
    )


#: The largest pack seen in the example being run (hypothesis is steered towards packs).
largest_pack: list[int] = [0]


def check_step(engine: OfflineEngine, record: StepRecord | None, in_flight_before: int) -> None:
    scheduler = engine.scheduler
    queued = [r.request_id for r in scheduler.running] + [r.request_id for r in vllm_compat.waiting_requests(scheduler)]
    assert not [req_id for req_id, n in Counter(queued).items() if n > 1], "a request is queued twice"
    assert set(queued) == set(scheduler.requests), "a request was lost"
    # Every admitted request has KV for its whole bound: the running requests fit together.
    if scheduler.options.kv_admission == "max_model_len":
        assert len(scheduler.running) <= scheduler._max_kv_concurrent
    else:
        assert kv_blocks_held_at_most(engine) <= scheduler._usable_kv_blocks
    if record is None or not record.scheduled:
        return
    assert not record.preempted, f"preempted: {record.preempted}"
    buckets = scheduler.num_batched_tokens_buckets
    prefills = [item for item in record.scheduled if item.is_prefill]
    if not prefills:
        assert all(item.num_tokens == item.num_tokens_padded == 1 for item in record.scheduled)
        return
    # Decodes are never mixed in; the pack is padded once, to a compiled bucket no larger than the largest.
    assert len(prefills) == len(record.scheduled), f"prefill mixed with decodes: {record}"
    assert len(prefills) <= scheduler.max_prefills_per_batch
    actual = sum(item.num_tokens for item in prefills)
    padded = sum(item.num_tokens_padded for item in prefills)
    assert padded == get_bucket_for_count(actual, buckets) <= buckets[-1]
    assert [item.num_tokens_padded for item in prefills[:-1]] == [item.num_tokens for item in prefills[:-1]]
    largest_pack[0] = max(largest_pack[0], len(prefills))
    if len(prefills) > 1:
        # Only whole prompts pack; a chunk of a long one runs alone.
        assert all(item.computed_before == 0 for item in prefills)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(), async_scheduling=st.booleans())
def test_random_workloads_keep_every_guarantee_with_packing(workload: Scenario, async_scheduling: bool) -> None:
    largest_pack[0] = 0
    engine = run_scenario(workload, async_scheduling=async_scheduling, after_step=check_step, max_iterations=20_000)
    for request in workload.requests:
        progress = engine.progress[request.req_id]
        assert progress.finished, request.req_id
        assert len(progress.output_tokens) == request.max_tokens, request.req_id
    target(float(largest_pack[0]), label="largest pack")


def decisions(engine: OfflineEngine) -> list[tuple[str, tuple[tuple[str, int, int], ...]]]:
    return [
        (step.state.name, tuple((i.req_id, i.num_tokens, i.num_tokens_padded) for i in step.scheduled))
        for step in engine.steps
    ]


def with_packing(design: Scenario) -> Scenario:
    options = design.engine.scheduler.model_copy(update={"max_prefills_per_step": 8})
    return dataclasses.replace(design, engine=design.engine.model_copy(update={"scheduler": options}))


@pytest.mark.parametrize("name", [name for name in SCENARIOS if name != "decode-hidden"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_where_no_two_prompts_share_a_bucket_packing_decides_as_the_design(name: str, async_scheduling: bool) -> None:
    design = SCENARIOS[name]
    packed = run_scenario(with_packing(design), async_scheduling=async_scheduling)
    assert decisions(packed) == decisions(run_scenario(design, async_scheduling=async_scheduling))


def test_the_designs_decode_hidden_scenario_packs_its_two_short_prompts_and_nothing_else() -> None:
    engine = run_scenario(with_packing(SCENARIOS["decode-hidden"]), async_scheduling=False)
    steps = prefill_steps(engine)
    # 100 and 300 tokens arrive together: one 512 step, the bucket 300 needs alone.
    assert steps[0] == [("req_0", 100, 100), ("req_1", 300, 412)]
    # The long prompt still runs alone, in the design's chunks, decodes hidden.
    assert steps[1:] == [[("req_2", 2048, 2048)], [("req_2", 2048, 2048)], [("req_2", 904, 1024)]]
    assert_all_served(engine)
