"""The prefill cap while decoding (``max_prefill_tokens_while_decoding``) on the real vLLM scheduler."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings, target
from hypothesis import strategies as st

from neuronfleet.contract.buckets import get_bucket_for_count
from neuronfleet.contract.config import REFERENCE_SCHEDULER, EngineConfig, SchedulerOptions
from neuronfleet.engine.offline.driver import OfflineEngine, StepRecord, run_scenario
from neuronfleet.engine.offline.scenarios import SCENARIOS, Scenario, ScenarioRequest
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.packing import buckets_while_decoding

pytestmark = pytest.mark.vllm_matrix

CAPPED = SchedulerOptions(max_prefill_tokens_while_decoding=256)
ENGINE = EngineConfig(
    max_num_seqs=8,
    max_num_batched_tokens=1024,
    max_model_len=2048,
    block_size=16,
    num_batched_tokens_buckets=[128, 256, 512, 1024],
    scheduler=CAPPED,
)


def scenario(*requests: ScenarioRequest, options: SchedulerOptions = CAPPED) -> Scenario:
    engine = ENGINE.model_copy(update={"scheduler": options})
    return Scenario("prefill-cap", "test", engine, num_kv_blocks=2048, requests=requests)


def prefill_steps(engine: OfflineEngine) -> list[list[tuple[str, int, int]]]:
    """(request, actual, padded) of every prefill step's requests, step by step."""
    return [
        [(item.req_id, item.num_tokens, item.num_tokens_padded) for item in step.scheduled]
        for step in engine.steps
        if step.is_prefill
    ]


def test_the_cap_is_derived_by_default_and_off_in_the_design() -> None:
    assert SchedulerOptions().max_prefill_tokens_while_decoding == "auto"
    assert REFERENCE_SCHEDULER.max_prefill_tokens_while_decoding is None


def test_a_scheduler_given_auto_with_no_step_times_to_derive_it_from_runs_without_a_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Two prompts of 1000 tokens while one decodes: no cap, so each runs in the 1024-token bucket.
    requests = (
        ScenarioRequest("decoding", prompt_len=100, max_tokens=50),
        ScenarioRequest("long", prompt_len=1000, max_tokens=2, arrival_step=3),
    )
    engine = run_scenario(scenario(*requests, options=SchedulerOptions()), async_scheduling=False)
    assert ("long", 1000, 1024) in [item for step in prefill_steps(engine) for item in step]
    assert "max_prefill_tokens_while_decoding is auto but no step times were known" in caplog.text


@pytest.mark.parametrize(
    ("cap", "expected"),
    [(None, [128, 256, 512, 1024]), (1024, [128, 256, 512, 1024]), (1000, [128, 256, 512]), (64, [128])],
)
def test_the_cap_keeps_the_buckets_within_it_and_at_least_the_smallest(cap: int | None, expected: list[int]) -> None:
    assert buckets_while_decoding([128, 256, 512, 1024], cap) == expected


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_long_prompt_is_chunked_to_the_cap_while_decodes_run_and_no_longer_once_they_end(
    async_scheduling: bool,
) -> None:
    decoding = ScenarioRequest("d", prompt_len=50, max_tokens=4)
    long = ScenarioRequest("long", prompt_len=1500, max_tokens=2, arrival_step=2)
    engine = run_scenario(scenario(decoding, long), async_scheduling=async_scheduling)
    steps = [step for step in prefill_steps(engine) if step[0][0] == "long"]
    capped = [step for step, record in zip(steps, long_prefills(engine), strict=True) if record.num_hidden_decodes]
    # While "d" decodes, every chunk of the long prompt runs in the 256 bucket.
    assert capped
    assert all(padded <= 256 for ((_, _, padded),) in capped)
    # Once "d" has finished, the rest runs in full-size chunks (at most the largest bucket).
    assert len(steps) > len(capped)
    assert steps[len(capped)][0][1] > 256
    assert sum(actual for ((_, actual, _),) in steps) == 1500


def long_prefills(engine: OfflineEngine) -> list[StepRecord]:
    return [step for step in engine.steps if step.is_prefill and step.scheduled[0].req_id == "long"]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_without_running_decodes_the_cap_never_applies(async_scheduling: bool) -> None:
    alone = scenario(ScenarioRequest("long", prompt_len=1500, max_tokens=2))
    engine = run_scenario(alone, async_scheduling=async_scheduling)
    assert prefill_steps(engine) == [[("long", 1024, 1024)], [("long", 476, 512)]]


def test_a_pack_while_decodes_run_stays_within_the_cap() -> None:
    packing = CAPPED.model_copy(update={"max_prefills_per_step": 4})
    requests = (
        ScenarioRequest("d", prompt_len=50, max_tokens=20),
        ScenarioRequest("s0", prompt_len=200, max_tokens=2, arrival_step=2),
        ScenarioRequest("s1", prompt_len=300, max_tokens=2, arrival_step=2),
    )

    def packs(options: SchedulerOptions) -> list[list[tuple[str, int, int]]]:
        engine = run_scenario(scenario(*requests, options=options), async_scheduling=False)
        return [step for step in prefill_steps(engine) if step[0][0] != "d"]

    # Without the cap the two share a 512 step, the bucket 300 needs alone.
    assert packs(packing.model_copy(update={"max_prefill_tokens_while_decoding": None})) == [
        [("s0", 200, 200), ("s1", 300, 312)]
    ]
    # With it, 200 runs alone in 256, and 300 is chunked to 256.
    assert packs(packing) == [[("s0", 200, 256)], [("s1", 256, 256)], [("s1", 44, 128)]]


def with_cap(design: Scenario, cap: int) -> Scenario:
    options = design.engine.scheduler.model_copy(update={"max_prefill_tokens_while_decoding": cap})
    return dataclasses.replace(design, engine=design.engine.model_copy(update={"scheduler": options}))


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_a_cap_at_the_largest_bucket_decides_as_the_design(name: str, async_scheduling: bool) -> None:
    design = SCENARIOS[name]
    capped = with_cap(design, design.engine.effective_num_batched_tokens_buckets[-1])

    def decisions(scenario: Scenario) -> list[tuple[str, tuple[tuple[str, int, int], ...]]]:
        engine = run_scenario(scenario, async_scheduling=async_scheduling)
        return [
            (step.state.name, tuple((i.req_id, i.num_tokens, i.num_tokens_padded) for i in step.scheduled))
            for step in engine.steps
        ]

    assert decisions(capped) == decisions(design)


# Random workloads: the guarantees hold at every step -------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> Scenario:
    block_size = draw(st.sampled_from([8, 16, 32]))
    max_model_len = draw(st.sampled_from([512, 1024, 2048]))
    max_num_batched_tokens = draw(st.sampled_from([256, 512, 1024]))
    limit = min(max_num_batched_tokens, max_model_len)
    inner = draw(st.lists(st.integers(min_value=1, max_value=limit - 1), max_size=4, unique=True))
    options = SchedulerOptions(
        max_prefill_tokens_while_decoding=draw(st.integers(min_value=1, max_value=limit)),
        max_prefills_per_step=draw(st.sampled_from([1, 1, 4])),
        constant_cost_admission=draw(st.booleans()),
        max_consecutive_prefill_steps=draw(st.sampled_from([None, 1, 2])),
        kv_admission=draw(st.sampled_from(["max_model_len", "request_bound"])),
    )
    engine = EngineConfig(
        max_num_seqs=draw(st.integers(min_value=1, max_value=8)),
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        block_size=block_size,
        num_batched_tokens_buckets=[*sorted(inner), limit],
        scheduler=options,
    )
    blocks_per_request = -(-max_model_len // block_size)
    num_kv_blocks = draw(st.integers(min_value=blocks_per_request + 1, max_value=blocks_per_request * 6))
    requests = []
    for i in range(draw(st.integers(min_value=1, max_value=10))):
        # Long prompts (chunked) beside short ones that decode while they prefill.
        prompt_len = draw(
            st.integers(min_value=1, max_value=max_model_len - 1) | st.integers(min_value=1, max_value=limit // 2)
        )
        longest = max_model_len - prompt_len
        max_tokens = draw(st.integers(min_value=1, max_value=min(16, longest)) | st.just(longest))
        arrival = draw(st.integers(min_value=0, max_value=12))
        requests.append(ScenarioRequest(f"r{i}", prompt_len, max_tokens, arrival_step=arrival))
    return Scenario("random", "hypothesis", engine, num_kv_blocks, tuple(requests))


#: Prefill steps capped in the example being run (hypothesis is steered towards them).
capped_steps: list[int] = [0]


def step_checker(workload: Scenario) -> Callable[[OfflineEngine, StepRecord | None, int], None]:
    prompt_lens = {request.req_id: request.prompt_len for request in workload.requests}

    def check_step(engine: OfflineEngine, record: StepRecord | None, in_flight_before: int) -> None:
        scheduler = engine.scheduler
        queued = [r.request_id for r in scheduler.running]
        queued += [r.request_id for r in vllm_compat.waiting_requests(scheduler)]
        assert not [req_id for req_id, n in Counter(queued).items() if n > 1], "a request is queued twice"
        # Every admitted request has KV for its whole bound: the running requests fit together.
        if scheduler.options.kv_admission == "max_model_len":
            assert len(scheduler.running) <= scheduler._max_kv_concurrent
        else:
            bounds = (min(scheduler.max_model_len, r.num_prompt_tokens + r.max_tokens) for r in scheduler.running)
            assert sum(-(-bound // scheduler.block_size) for bound in bounds) <= scheduler._usable_kv_blocks
        if record is None or not record.scheduled:
            return
        assert not record.preempted, f"preempted: {record.preempted}"
        prefills = [item for item in record.scheduled if item.is_prefill]
        if not prefills:
            return
        assert len(prefills) == len(record.scheduled), f"prefill mixed with decodes: {record}"
        buckets = scheduler.num_batched_tokens_buckets
        actual = sum(item.num_tokens for item in prefills)
        padded = sum(item.num_tokens_padded for item in prefills)
        assert padded == get_bucket_for_count(actual, buckets)
        cap_bucket = buckets_while_decoding(buckets, scheduler.prefill_cap)[-1]
        if record.num_hidden_decodes:
            # Decodes wait behind this step: it runs in a bucket within the cap.
            assert padded <= cap_bucket, record
            capped_steps[0] += 1
        elif len(prefills) == 1:
            # No decode waits: the chunk is as long as the design makes it.
            (item,) = prefills
            assert item.num_tokens == min(prompt_lens[item.req_id] - item.computed_before, buckets[-1]), record

    return check_step


# 60 fresh workloads a run (each CI run draws new ones), at a third of a second each, on both vLLM series.
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(), async_scheduling=st.booleans())
def test_random_workloads_keep_every_guarantee_with_the_cap(workload: Scenario, async_scheduling: bool) -> None:
    capped_steps[0] = 0
    engine = run_scenario(
        workload, async_scheduling=async_scheduling, after_step=step_checker(workload), max_iterations=20_000
    )
    for request in workload.requests:
        progress = engine.progress[request.req_id]
        assert progress.finished, request.req_id
        assert len(progress.output_tokens) == request.max_tokens, request.req_id
    target(float(capped_steps[0]), label="capped prefill steps")
