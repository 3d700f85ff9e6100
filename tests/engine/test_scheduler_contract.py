"""The design's method contract: its names and signatures, called and overridden as its users do."""

from __future__ import annotations

import pytest

from neuronfleet.contract.buckets import get_bucket_for_count, get_default_num_batched_tokens_buckets
from neuronfleet.contract.config import EngineConfig
from neuronfleet.engine.offline.driver import OfflineEngine, build_vllm_config, construct_scheduler
from neuronfleet.engine.scheduler import NeuronAsyncScheduler, NeuronScheduler, SchedulerState
from neuronfleet.engine.scheduler.vllm_compat import Request, SchedulerOutput

pytestmark = pytest.mark.vllm_matrix

SMALL = EngineConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024, block_size=16)


class DesignOverrides(NeuronScheduler):
    """A user's subclass: every design-named method overridden with the design's signature, counted."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.calls: list[str] = []
        super().__init__(*args, **kwargs)

    def can_schedule(self, request: Request) -> bool:
        self.calls.append("can_schedule")
        return super().can_schedule(request)

    def _call_base_schedule(self) -> SchedulerOutput:  # type: ignore[override]  # the design's signature
        self.calls.append("_call_base_schedule")
        return super()._call_base_schedule()

    def _apply_padding_and_log_stats(self, scheduler_output: SchedulerOutput) -> SchedulerOutput:
        self.calls.append("_apply_padding_and_log_stats")
        return super()._apply_padding_and_log_stats(scheduler_output)

    def _update_state(self, scheduler_output: SchedulerOutput) -> None:
        self.calls.append("_update_state")
        super()._update_state(scheduler_output)


class DesignOverridesAsync(DesignOverrides, NeuronAsyncScheduler):  # type: ignore[misc]  # the design's signature again
    """The same subclass of the async class."""


def build(cls: type[NeuronScheduler], *, async_scheduling: bool) -> NeuronScheduler:
    vllm_config = build_vllm_config(SMALL, async_scheduling=async_scheduling, enable_prefix_caching=False)
    return construct_scheduler(cls, vllm_config, num_kv_blocks=512)


def run(scheduler: NeuronScheduler) -> list[tuple[str, tuple[tuple[str, int, int], ...]]]:
    engine = OfflineEngine(scheduler)
    engine.add_request("a", [3] * 200, 3)
    engine.add_request("b", [4] * 600, 2)
    engine.run()
    return [
        (step.state.name, tuple((i.req_id, i.num_tokens, i.num_tokens_padded) for i in step.scheduled))
        for step in engine.steps
    ]


@pytest.mark.parametrize(
    ("cls", "overridden", "async_scheduling"),
    [(NeuronScheduler, DesignOverrides, False), (NeuronAsyncScheduler, DesignOverridesAsync, True)],
    ids=["sync", "async"],
)
def test_overrides_with_the_designs_signatures_are_called_and_decide_alike(
    cls: type[NeuronScheduler], overridden: type[DesignOverrides], async_scheduling: bool
) -> None:
    plain = run(build(cls, async_scheduling=async_scheduling))
    scheduler = build(overridden, async_scheduling=async_scheduling)
    assert isinstance(scheduler, DesignOverrides)
    assert run(scheduler) == plain
    steps = scheduler.calls.count("_call_base_schedule")
    assert steps == len(plain)
    assert scheduler.calls.count("_apply_padding_and_log_stats") == steps
    assert scheduler.calls.count("_update_state") == steps
    assert scheduler.calls.count("can_schedule") >= 2  # once per admission at least


def test_public_and_design_named_members_answer_with_the_designs_signatures() -> None:
    scheduler = build(NeuronScheduler, async_scheduling=False)
    engine = OfflineEngine(scheduler)
    assert scheduler.max_prefills_per_batch == 1
    assert scheduler.max_num_seqs == 4
    assert scheduler.num_batched_tokens_buckets == get_default_num_batched_tokens_buckets(512)
    assert scheduler.num_seqs_buckets == [1, 2, 4]
    assert not scheduler.holdback_queue
    assert scheduler._max_kv_concurrent == 7  # 511 usable blocks, 64 per full-length request
    assert scheduler._calculate_padded_count(200) == get_bucket_for_count(200, [128, 256, 512]) == 256
    assert scheduler._calculate_padded_count(0) == 0

    engine.add_request("a", [3] * 200, 2)
    (head,) = scheduler.waiting
    assert scheduler._is_prefill_request(head)
    assert scheduler.can_schedule(head)
    assert not scheduler.at_capacity
    assert not scheduler.has_prefill_in_running

    output = scheduler.schedule()
    assert output.num_scheduled_tokens == {"a": 200}
    assert scheduler.has_prefill_in_running is False  # the whole prompt ran in one chunk
    assert scheduler.state is SchedulerState.ACTIVE_PREFILL
    padding_before = scheduler.total_padding_tokens

    # Applied again to the same output, as a caller of the design's method would: same padded
    # sizes, padding counted again; the state machine reads the same output the same way.
    assert scheduler._apply_padding_and_log_stats(output) is output
    assert output.num_scheduled_tokens_padded == {"a": 256}  # type: ignore[attr-defined]
    assert scheduler.total_padding_tokens == padding_before + 56
    scheduler._update_state(output)
    assert scheduler.state is SchedulerState.ACTIVE_PREFILL
