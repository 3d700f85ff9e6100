"""The scheduler options of issue 9, each against the reference behaviour, on the real scheduler."""

from __future__ import annotations

import dataclasses

import pytest

from neuronfleet.contract.config import REFERENCE_SCHEDULER, SchedulerOptions
from neuronfleet.engine.offline.driver import OfflineEngine, run_scenario
from neuronfleet.engine.offline.scenarios import SCENARIOS, Scenario

pytestmark = pytest.mark.vllm_matrix


def with_options(scenario: Scenario, options: SchedulerOptions) -> Scenario:
    engine = scenario.engine.model_copy(update={"scheduler": options})
    return dataclasses.replace(scenario, engine=engine)


def decisions(engine: OfflineEngine) -> list[tuple[str, tuple[tuple[str, int, int], ...]]]:
    return [
        (step.state.name, tuple((i.req_id, i.num_tokens, i.num_tokens_padded) for i in step.scheduled))
        for step in engine.steps
    ]


@pytest.mark.parametrize("name", list(SCENARIOS))
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_constant_cost_admission_decides_exactly_like_the_reference(name: str, async_scheduling: bool) -> None:
    reference = run_scenario(SCENARIOS[name], async_scheduling=async_scheduling)
    constant = run_scenario(
        with_options(SCENARIOS[name], REFERENCE_SCHEDULER.model_copy(update={"constant_cost_admission": True})),
        async_scheduling=async_scheduling,
    )
    assert decisions(constant) == decisions(reference)


def longest_decode_wait(engine: OfflineEngine) -> int:
    """The most consecutive prefill steps taken while decodes were hidden."""
    longest = current = 0
    for step in engine.steps:
        if step.is_prefill and step.num_hidden_decodes:
            current += 1
            longest = max(longest, current)
        elif step.scheduled:
            current = 0
    return longest


@pytest.mark.parametrize("bound", [1, 2])
def test_decode_stalls_are_bounded(bound: int) -> None:
    scenario = SCENARIOS["decode-hidden"]
    reference = run_scenario(scenario, async_scheduling=False)
    bounded = run_scenario(
        with_options(scenario, REFERENCE_SCHEDULER.model_copy(update={"max_consecutive_prefill_steps": bound})),
        async_scheduling=False,
    )
    assert longest_decode_wait(reference) == 3  # the 5000-token prompt's three chunks
    assert longest_decode_wait(bounded) == bound
    # The prompt still runs in the same chunks and buckets, one prefill per step.
    chunks = [(i.num_tokens, i.num_tokens_padded) for s in bounded.steps for i in s.scheduled if i.req_id == "req_2"]
    assert chunks[:3] == [(2048, 2048), (2048, 2048), (904, 1024)]
    assert all(len(p.output_tokens) == p.max_tokens for p in bounded.progress.values())


def test_request_bound_admits_what_the_requests_can_really_use() -> None:
    scenario = SCENARIOS["kv-deadlock"]
    reference = run_scenario(scenario, async_scheduling=False)
    request_bound = run_scenario(
        with_options(scenario, REFERENCE_SCHEDULER.model_copy(update={"kv_admission": "request_bound"})),
        async_scheduling=False,
    )
    # 160 blocks hold 2 requests at max_model_len 1024, but 4 requests of 106 tokens need 7 blocks each.
    assert max(step.num_running for step in reference.steps) == 2
    assert max(step.num_running for step in request_bound.steps) == 4
    assert len(request_bound.steps) < len(reference.steps)
    assert not [step for step in request_bound.steps if step.preempted]
