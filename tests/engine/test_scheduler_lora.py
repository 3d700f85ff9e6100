"""LoRA adapters on the real vLLM scheduler: the Neuron rules hold with adapters mixed in a batch, and a step
never runs more adapters than the compiled slots."""

from __future__ import annotations

import pytest
from vllm.lora.request import LoRARequest

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.lora import LoraSlots
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler

pytestmark = pytest.mark.vllm_matrix

ENGINE = EngineConfig(
    max_num_seqs=4,
    max_num_batched_tokens=128,
    max_model_len=256,
    block_size=16,
    num_batched_tokens_buckets=[32, 64, 128],
    num_seqs_buckets=[1, 2, 4],
)
SLOTS = LoraSlots(max_loras=2, max_lora_rank=16)
#: Three adapters for two slots, and the base model (None).
ADAPTERS = [None, *(LoRARequest(f"adapter-{i}", i, f"/adapters/{i}") for i in (1, 2, 3))]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_adapters_mixed_in_decode_batches_keep_the_neuron_rules_within_the_slots(async_scheduling: bool) -> None:
    blocks_per_request = -(-ENGINE.max_model_len // ENGINE.block_size)
    scheduler = build_scheduler(
        ENGINE, num_kv_blocks=3 * blocks_per_request, async_scheduling=async_scheduling, lora=SLOTS
    )
    engine = OfflineEngine(scheduler)
    adapter_of: dict[str, LoRARequest | None] = {}
    for i in range(16):
        req_id = f"r{i}"
        adapter_of[req_id] = ADAPTERS[i % len(ADAPTERS)]
        engine.add_request(req_id, [5 + i] * (20 + 9 * i), max_tokens=12, lora_request=adapter_of[req_id])
    steps = engine.run(max_steps=5_000)

    mixed_decodes = 0
    for record in steps:
        adapters = {adapter_of[item.req_id] for item in record.scheduled}
        assert len(adapters - {None}) <= SLOTS.max_loras, f"more adapters than slots in step {record.index}"
        assert not record.preempted, f"preempted: {record.preempted}"
        if record.is_prefill:
            (item,) = record.scheduled
            assert item.num_tokens_padded in ENGINE.effective_num_batched_tokens_buckets
        elif record.scheduled:
            assert all(item.num_tokens == item.num_tokens_padded == 1 for item in record.scheduled)
            mixed_decodes += len(adapters) >= 2
    # The case the test is about was reached: decode batches that mix adapters (or an adapter and the base).
    assert mixed_decodes >= 5, mixed_decodes
    assert not engine.unfinished()
    assert all(len(progress.output_tokens) == 12 for progress in engine.progress.values())
