"""The model-runner side of the padding contract."""

from __future__ import annotations

import pytest

from neuronfleet.engine.scheduler.padding import PAD_SLOT, PAD_TOKEN_ID, pad_decode, pad_prefill


def test_prefill_of_200_tokens_in_the_256_bucket() -> None:
    tokens = list(range(1, 201))
    inputs = pad_prefill(tokens, num_computed_tokens=0, block_ids=list(range(1, 14)), block_size=16, padded_len=256)
    assert len(inputs.input_ids) == len(inputs.positions) == len(inputs.slot_mapping) == 256
    assert inputs.input_ids[:200] == tokens
    assert inputs.input_ids[200:] == [PAD_TOKEN_ID] * 56
    assert inputs.positions[:200] == list(range(200))
    assert inputs.positions[200:] == [199] * 56
    # Block 1 starts at slot 16, as in the design's example.
    assert inputs.slot_mapping[:200] == list(range(16, 216))
    assert inputs.slot_mapping[200:] == [PAD_SLOT] * 56
    assert inputs.logits_index == 199


def test_prefill_after_a_prefix_hit_starts_at_the_cached_position() -> None:
    # 4000 new tokens after 1000 cached ones, blocks of 8: positions 1000.. in block table entries 125..
    block_ids = list(range(10, 10 + 625))
    inputs = pad_prefill([7] * 4000, num_computed_tokens=1000, block_ids=block_ids, block_size=8, padded_len=4096)
    assert inputs.positions[0] == 1000
    assert inputs.positions[3999] == 4999
    assert inputs.positions[4000:] == [4999] * 96
    assert inputs.slot_mapping[0] == block_ids[125] * 8
    assert inputs.slot_mapping[4000:] == [PAD_SLOT] * 96
    assert inputs.logits_index == 3999


def test_prefill_padded_slots_never_touch_the_requests_blocks() -> None:
    block_ids = [5, 9]
    inputs = pad_prefill([1] * 20, 0, block_ids, 16, padded_len=32)
    owned = {b * 16 + i for b in block_ids for i in range(16)}
    assert not set(inputs.slot_mapping[20:]) & owned


@pytest.mark.parametrize(("actual", "padded"), [(0, 128), (129, 128)])
def test_prefill_rejects_impossible_shapes(actual: int, padded: int) -> None:
    with pytest.raises(ValueError, match=r"prefill chunk|smaller than the chunk"):
        pad_prefill([1] * actual, 0, [1] * 20, 16, padded_len=padded)


def test_decode_batch_of_three_pads_to_four() -> None:
    inputs = pad_decode([11, 12, 13], [200, 57, 9], [300, 301, 302], [1, 2, 4, 8])
    assert inputs.input_ids == [11, 12, 13, PAD_TOKEN_ID]
    assert inputs.positions == [200, 57, 9, 0]
    assert inputs.slot_mapping == [300, 301, 302, PAD_SLOT]
    assert inputs.num_real == 3


def test_decode_batch_at_a_bucket_is_not_padded() -> None:
    inputs = pad_decode([1, 2], [5, 6], [7, 8], [1, 2, 4])
    assert inputs.input_ids == [1, 2]
    assert inputs.num_real == 2


def test_decode_rejects_ragged_inputs() -> None:
    with pytest.raises(ValueError, match="one entry per request"):
        pad_decode([1, 2], [5], [7, 8], [1, 2])
