"""NeuronScheduler construction, limits and queue restoration on the real vLLM scheduler."""

from __future__ import annotations

import re

import pytest

from neuronfleet.contract.config import EngineConfig
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler, build_vllm_config, construct_scheduler
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.neuron import NeuronScheduler, read_neuron_config

pytestmark = pytest.mark.vllm_matrix

SMALL = EngineConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024, block_size=16)


def test_buckets_come_from_additional_config() -> None:
    scheduler = build_scheduler(
        SMALL.model_copy(update={"num_batched_tokens_buckets": [256, 512], "num_seqs_buckets": [2, 4]}),
        num_kv_blocks=512,
    )
    assert scheduler.num_batched_tokens_buckets == [256, 512]
    assert scheduler.num_seqs_buckets == [2, 4]
    assert scheduler.max_prefills_per_batch == 1


def test_absent_buckets_get_the_defaults() -> None:
    vllm_config = build_vllm_config(SMALL, async_scheduling=False, enable_prefix_caching=False)
    vllm_config.additional_config = {}
    fresh = construct_scheduler(NeuronScheduler, vllm_config, num_kv_blocks=512)
    assert fresh.num_batched_tokens_buckets == [128, 256, 512]
    assert fresh.num_seqs_buckets == [1, 2, 4]


@pytest.mark.parametrize(
    ("neuron_config", "message"),
    [
        (
            {"num_batched_tokens_buckets": [128, 256]},
            "Last bucket in num_batched_tokens_buckets must equal max_num_batched_tokens (512), got 256",
        ),
        ({"num_seqs_buckets": [1, 2]}, "Last bucket in num_seqs_buckets must equal max_num_seqs (4), got 2"),
        ({"num_seqs_buckets": [4, 2, 4]}, "num_seqs_buckets must be in strictly ascending order, got [4, 2, 4]"),
    ],
)
def test_invalid_neuron_config_fails_at_construction(neuron_config: dict[str, list[int]], message: str) -> None:
    vllm_config = build_vllm_config(SMALL, async_scheduling=False, enable_prefix_caching=False)
    vllm_config.additional_config = {"neuron_config": neuron_config}
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        construct_scheduler(NeuronScheduler, vllm_config, num_kv_blocks=512)


def test_only_fcfs_is_supported() -> None:
    vllm_config = build_vllm_config(SMALL, async_scheduling=False, enable_prefix_caching=False)
    vllm_config.scheduler_config.policy = "priority"
    with pytest.raises(ValueError, match="supports only the 'fcfs' scheduling policy, got 'priority'"):
        construct_scheduler(NeuronScheduler, vllm_config, num_kv_blocks=512)


@pytest.mark.parametrize(
    ("additional_config", "expected"),
    [
        (None, {}),
        ({}, {}),
        ({"other": 1}, {}),
        ({"neuron_config": {"num_seqs_buckets": [1]}}, {"num_seqs_buckets": [1]}),
    ],
)
def test_read_neuron_config(additional_config: object, expected: dict[str, object]) -> None:
    assert read_neuron_config(additional_config) == expected


def test_read_neuron_config_rejects_a_non_mapping() -> None:
    with pytest.raises(ValueError, match=r"additional_config\.neuron_config must be a mapping, got list"):
        read_neuron_config({"neuron_config": [1, 2]})


def test_kv_bound_leaves_out_the_null_block() -> None:
    # 64 blocks per full-length request; 128 blocks hold only one once block 0 is reserved.
    assert build_scheduler(SMALL, num_kv_blocks=128)._max_kv_concurrent == 1
    assert build_scheduler(SMALL, num_kv_blocks=129)._max_kv_concurrent == 2


class FailingBaseScheduler(NeuronScheduler):
    """The base scheduler raising mid-step, as it may on an internal assertion."""

    def _call_base_schedule(self, throttle_prefills: bool = False) -> vllm_compat.SchedulerOutput:
        raise RuntimeError("base scheduler failed")


def test_limits_and_queues_are_restored_when_the_base_scheduler_raises() -> None:
    scheduler = build_scheduler(SMALL, num_kv_blocks=512, async_scheduling=False)
    engine = OfflineEngine(scheduler)
    for i in range(3):
        engine.add_request(f"r{i}", [1 + i] * 40, 8)
    engine.step()  # r0 prefills
    engine.step()  # r1 prefills while r0's decode is hidden
    assert len(scheduler.running) == 2
    running_before = [r.request_id for r in scheduler.running]
    waiting_before = [r.request_id for r in scheduler.waiting]
    limits_before = {name: getattr(scheduler, name) for name in vllm_compat.hidden_limit_attributes}

    scheduler.__class__ = FailingBaseScheduler
    with pytest.raises(RuntimeError, match="base scheduler failed"):
        scheduler.schedule()  # r2 is admitted and both decodes are hidden when the base fails

    assert {name: getattr(scheduler, name) for name in vllm_compat.hidden_limit_attributes} == limits_before
    assert sorted(r.request_id for r in scheduler.running) == sorted(running_before)
    assert [r.request_id for r in scheduler.waiting] == waiting_before
    assert not scheduler.holdback_queue


def test_async_class_keeps_two_steps_in_flight() -> None:
    engine = OfflineEngine(build_scheduler(SMALL, num_kv_blocks=512, async_scheduling=True))
    engine.add_request("r0", [3] * 100, 4)
    engine.step()
    assert len(engine.in_flight) == 1
    assert engine.progress["r0"].output_tokens == []
    engine.step()
    # The decode was scheduled before the prefill's token came back.
    assert engine.steps[1].scheduled[0].req_id == "r0"
    assert not engine.steps[1].scheduled[0].is_prefill
    assert len(engine.progress["r0"].output_tokens) == 1
