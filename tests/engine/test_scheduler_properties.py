"""Random workloads on the real vLLM scheduler: the Neuron invariants hold at every step."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neuronfleet.contract.config import REFERENCE_SCHEDULER, EngineConfig, SchedulerOptions
from neuronfleet.engine.offline.driver import OfflineEngine, StepRecord, run_scenario
from neuronfleet.engine.offline.scenarios import Scenario, ScenarioRequest
from neuronfleet.engine.scheduler import vllm_compat

pytestmark = pytest.mark.vllm_matrix

OPTION_SETS = {
    "reference": REFERENCE_SCHEDULER,
    "constant-cost": REFERENCE_SCHEDULER.model_copy(update={"constant_cost_admission": True}),
    "bounded-stalls": REFERENCE_SCHEDULER.model_copy(update={"max_consecutive_prefill_steps": 2}),
    "request-bound": REFERENCE_SCHEDULER.model_copy(update={"kv_admission": "request_bound"}),
    "defaults": SchedulerOptions(),
    "all": SchedulerOptions(
        constant_cost_admission=True, max_consecutive_prefill_steps=1, kv_admission="request_bound"
    ),
}


@st.composite
def scenarios(draw: st.DrawFn, options: SchedulerOptions) -> Scenario:
    block_size = draw(st.sampled_from([8, 16, 32]))
    max_model_len = draw(st.sampled_from([256, 512, 1024, 2048]))
    max_num_batched_tokens = draw(st.sampled_from([128, 256, 512, 1024, 4096]))
    max_num_seqs = draw(st.integers(min_value=1, max_value=8))
    limit = min(max_num_batched_tokens, max_model_len)
    inner = draw(st.lists(st.integers(min_value=1, max_value=limit - 1), max_size=4, unique=True))
    engine = EngineConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        block_size=block_size,
        num_batched_tokens_buckets=[*sorted(inner), limit],
        num_seqs_buckets=draw(st.sampled_from([None, [max_num_seqs]])),
        scheduler=options,
    )
    blocks_per_request = -(-max_model_len // block_size)
    # vLLM refuses to start unless one full-length request fits (block 0 is reserved);
    # from there to more than max_num_seqs of them. Exact multiples too: they expose
    # an off-by-one in the KV admission bound.
    num_kv_blocks = draw(
        st.integers(min_value=blocks_per_request + 1, max_value=blocks_per_request * 10)
        | st.integers(min_value=2, max_value=10).map(lambda n: n * blocks_per_request)
    )
    requests = []
    for i in range(draw(st.integers(min_value=1, max_value=10))):
        if draw(st.booleans()):
            # Grows to max_model_len: the worst case KV admission must plan for.
            prompt_len = draw(st.integers(min_value=max(1, max_model_len - 40), max_value=max_model_len - 1))
            max_tokens = max_model_len - prompt_len
        else:
            prompt_len = draw(st.integers(min_value=1, max_value=max_model_len - 2))
            max_tokens = draw(st.integers(min_value=1, max_value=min(12, max_model_len - prompt_len)))
        arrival = draw(st.integers(min_value=0, max_value=30))
        requests.append(ScenarioRequest(f"r{i}", prompt_len, max_tokens, arrival_step=arrival))
    return Scenario("random", "hypothesis", engine, num_kv_blocks, tuple(requests))


def check_queues(engine: OfflineEngine) -> None:
    """Every unfinished request sits in exactly one queue; the holdback queue is drained."""
    scheduler = engine.scheduler
    assert not scheduler.holdback_queue
    queued = [r.request_id for r in scheduler.running]
    queued += [r.request_id for r in vllm_compat.waiting_requests(scheduler)]
    assert not [req_id for req_id, n in Counter(queued).items() if n > 1], "a request is queued twice"
    assert set(queued) == set(scheduler.requests), "a request was lost"


def check_step(engine: OfflineEngine, record: StepRecord | None, in_flight_before: int) -> None:
    check_queues(engine)
    if record is None:
        return
    buckets = engine.scheduler.num_batched_tokens_buckets
    prefill_items = [item for item in record.scheduled if item.is_prefill]
    if prefill_items:
        assert len(record.scheduled) == 1, f"prefill mixed with other work: {record}"
        (item,) = prefill_items
        assert item.num_tokens_padded in buckets
        assert item.num_tokens_padded >= item.num_tokens
    else:
        assert all(item.num_tokens == item.num_tokens_padded == 1 for item in record.scheduled)
    if not record.scheduled and record.num_waiting + record.num_running > 0:
        # With requests unfinished, only waiting on results in flight excuses an empty step.
        assert in_flight_before > 0, f"empty step with work to do: {record}"
    # Neuron cannot preempt: KV admission must make it unnecessary.
    assert not record.preempted, f"preempted: {record.preempted}"


@pytest.mark.parametrize("options", OPTION_SETS.values(), ids=OPTION_SETS.keys())
def test_random_workloads_keep_every_invariant(options: SchedulerOptions) -> None:
    seen: Counter[str] = Counter()
    run_random_workloads(options, seen)
    # The invariants were checked on every kind of step, on both schedulers, padded prefills included, and over
    # workloads of several requests each (every one finished with all its tokens): not on runs that did nothing.
    assert seen["examples"] >= 100, seen
    assert {"prefill steps", "padded prefill steps", "decode steps", "sync", "async"} <= set(+seen), seen
    assert seen["requests"] > seen["examples"], seen


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), async_scheduling=st.booleans())
def run_random_workloads(
    options: SchedulerOptions, seen: Counter[str], data: st.DataObject, async_scheduling: bool
) -> None:
    scenario = data.draw(scenarios(options))

    def checked(engine: OfflineEngine, record: StepRecord | None, in_flight_before: int) -> None:
        check_step(engine, record, in_flight_before)
        prefills = [] if record is None else [item for item in record.scheduled if item.is_prefill]
        if prefills:
            seen["prefill steps"] += 1
            seen["padded prefill steps"] += any(item.num_tokens_padded > item.num_tokens for item in prefills)
        elif record is not None and record.scheduled:
            seen["decode steps"] += 1

    engine = run_scenario(scenario, async_scheduling=async_scheduling, after_step=checked, max_iterations=20_000)
    seen["examples"] += 1
    seen["async" if async_scheduling else "sync"] += 1
    for request in scenario.requests:
        progress = engine.progress[request.req_id]
        assert progress.finished, request.req_id
        assert len(progress.output_tokens) == request.max_tokens, request.req_id
        seen["requests"] += 1
