"""The design's examples, step by step, on the real vLLM scheduler (sync and async)."""

from __future__ import annotations

import pytest

from neuronfleet.engine.offline.driver import OfflineEngine, StepRecord, run_scenario
from neuronfleet.engine.offline.scenarios import SCENARIOS
from neuronfleet.engine.scheduler.neuron import NeuronAsyncScheduler, NeuronScheduler, SchedulerState

pytestmark = pytest.mark.vllm_matrix

both_classes = pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])


def prefills(engine: OfflineEngine) -> list[tuple[str, int, int, int]]:
    """(request, computed before, actual, padded) of every prefill step, in order."""
    return [
        (item.req_id, item.computed_before, item.num_tokens, item.num_tokens_padded)
        for step in engine.steps
        for item in step.scheduled
        if item.is_prefill
    ]


def non_empty(engine: OfflineEngine) -> list[StepRecord]:
    return [step for step in engine.steps if step.scheduled]


def assert_finished_with_all_tokens(engine: OfflineEngine) -> None:
    for req_id, progress in engine.progress.items():
        assert progress.finished, req_id
        assert len(progress.output_tokens) == progress.max_tokens, req_id


@both_classes
def test_scheduler_class_follows_async_flag(async_scheduling: bool) -> None:
    engine = run_scenario(SCENARIOS["prompt-200"], async_scheduling=async_scheduling)
    expected = NeuronAsyncScheduler if async_scheduling else NeuronScheduler
    assert type(engine.scheduler) is expected


@both_classes
def test_200_token_prompt_pads_to_256(async_scheduling: bool) -> None:
    engine = run_scenario(SCENARIOS["prompt-200"], async_scheduling=async_scheduling)
    assert prefills(engine) == [("req_0", 0, 200, 256)]
    steps = non_empty(engine)
    assert steps[0].state is SchedulerState.ACTIVE_PREFILL
    assert all(step.state is SchedulerState.ACTIVE_DECODE for step in steps[1:])
    # Decodes carry one token each and are not padded along the sequence.
    assert all(item.num_tokens == item.num_tokens_padded == 1 for step in steps[1:] for item in step.scheduled)
    assert engine.scheduler.total_padding_tokens == 56
    assert engine.steps[-1].state is SchedulerState.IDLE
    assert_finished_with_all_tokens(engine)


@both_classes
def test_5000_token_prompt_advances_by_actual_count(async_scheduling: bool) -> None:
    engine = run_scenario(SCENARIOS["prompt-5000"], async_scheduling=async_scheduling)
    assert prefills(engine) == [("req_0", 0, 5000, 8192)]
    first_decode = non_empty(engine)[1].scheduled[0]
    # num_computed_tokens moved by the actual 5000, so the request is now decoding.
    assert (first_decode.computed_before, first_decode.is_prefill) == (5000, False)
    assert engine.scheduler.total_padding_tokens == 3192
    assert_finished_with_all_tokens(engine)


@both_classes
def test_32000_token_prompt_runs_in_four_chunks(async_scheduling: bool) -> None:
    engine = run_scenario(SCENARIOS["prompt-32000"], async_scheduling=async_scheduling)
    assert prefills(engine) == [
        ("req_0", 0, 8192, 8192),
        ("req_0", 8192, 8192, 8192),
        ("req_0", 16384, 8192, 8192),
        ("req_0", 24576, 7424, 8192),
    ]
    states = [step.state for step in non_empty(engine)]
    assert states[:4] == [SchedulerState.ACTIVE_PREFILL] * 4
    assert states[4] is SchedulerState.ACTIVE_DECODE
    assert_finished_with_all_tokens(engine)


@both_classes
def test_prefix_cache_hit_pads_only_the_new_tokens(async_scheduling: bool) -> None:
    engine = run_scenario(SCENARIOS["prefix-cache"], async_scheduling=async_scheduling)
    assert ("req_0", 1000, 4000, 4096) in prefills(engine)
    assert_finished_with_all_tokens(engine)


@both_classes
def test_decodes_are_hidden_while_a_prompt_prefills(async_scheduling: bool) -> None:
    engine = run_scenario(SCENARIOS["decode-hidden"], async_scheduling=async_scheduling)
    long_prefill = [step for step in engine.steps if any(i.req_id == "req_2" and i.is_prefill for i in step.scheduled)]
    assert [step.scheduled[0].num_tokens_padded for step in long_prefill] == [2048, 2048, 1024]
    assert all(step.num_hidden_decodes == 2 and len(step.scheduled) == 1 for step in long_prefill)
    after = engine.steps[long_prefill[-1].index + 1]
    assert sorted(item.req_id for item in after.scheduled) == ["req_0", "req_1", "req_2"]
    assert_finished_with_all_tokens(engine)


@both_classes
def test_kv_admission_prevents_the_deadlock(async_scheduling: bool) -> None:
    scenario = SCENARIOS["kv-deadlock"]
    engine = run_scenario(scenario, async_scheduling=async_scheduling)
    assert engine.scheduler._max_kv_concurrent == 2
    assert max(step.num_running for step in engine.steps) == 2
    # The later prompts waited for KV space instead of hiding the decodes forever.
    assert engine.scheduler.num_kv_deferred_admissions > 0
    assert [req_id for req_id, *_ in prefills(engine)] == ["req_0", "req_1", "req_2", "req_3"]
    assert_finished_with_all_tokens(engine)
