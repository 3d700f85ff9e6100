"""The model-runner side of the padding contract, as pure functions.

The scheduler decides each request's actual and padded token counts; the model
runner turns them into tensors of exactly a compiled shape. Padding must never
change results: padded tokens write no KV, attend to nothing real, and their
logits are never read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neuronfleet.contract.buckets import get_bucket_for_count

#: Token id of padding positions.
PAD_TOKEN_ID = 0
#: KV slot of padded positions: the first slot of block 0, which vLLM reserves as the
#: null block, so a padded write never lands in a block a request owns.
PAD_SLOT = 0


@dataclass(frozen=True)
class PrefillInputs:
    """Inputs of one prefill chunk, padded to its bucket."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    #: Index of the last real token: the only position whose logits are sampled.
    logits_index: int


@dataclass(frozen=True)
class DecodeInputs:
    """Inputs of one decode step, its batch padded to a ``num_seqs_buckets`` size."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    #: Rows ``[0, num_real)`` are requests; the rest are padding whose outputs are discarded.
    num_real: int


def kv_slot(position: int, block_ids: Sequence[int], block_size: int) -> int:
    """The KV cache slot a token at ``position`` writes, given the request's block table."""
    return block_ids[position // block_size] * block_size + position % block_size


def pad_prefill(
    chunk_token_ids: Sequence[int],
    num_computed_tokens: int,
    block_ids: Sequence[int],
    block_size: int,
    padded_len: int,
) -> PrefillInputs:
    """Pad one prefill chunk to ``padded_len`` (the scheduler's ``num_scheduled_tokens_padded``).

    ``chunk_token_ids`` are the chunk's real tokens, starting at position
    ``num_computed_tokens`` (after any prefix-cache hit or earlier chunks).
    """
    actual = len(chunk_token_ids)
    if actual == 0:
        raise ValueError("a prefill chunk needs at least one token")
    if padded_len < actual:
        raise ValueError(f"padded length {padded_len} is smaller than the chunk ({actual} tokens)")
    padding = padded_len - actual
    positions = list(range(num_computed_tokens, num_computed_tokens + actual))
    slots = [kv_slot(position, block_ids, block_size) for position in positions]
    return PrefillInputs(
        input_ids=[*chunk_token_ids, *([PAD_TOKEN_ID] * padding)],
        # Padding repeats the last real position, so rotary embeddings stay in range.
        positions=positions + [positions[-1]] * padding,
        slot_mapping=slots + [PAD_SLOT] * padding,
        logits_index=actual - 1,
    )


@dataclass(frozen=True)
class PrefillSequence:
    """One sequence's share of a packed prefill step."""

    #: The chunk's real tokens.
    token_ids: Sequence[int]
    #: Tokens of the sequence already in the KV cache: the chunk starts at this position.
    num_computed_tokens: int
    block_ids: Sequence[int]


@dataclass(frozen=True)
class PackedPrefillInputs:
    """Inputs of one prefill step holding several sequences back to back, padded once to a bucket."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    #: Where each sequence starts, then where the real tokens end (``cu_seqlens``): sequence ``i``
    #: is ``[query_start[i], query_start[i + 1])``; the padding follows the last one.
    query_start: list[int]
    #: Index of each sequence's last real token: the only positions whose logits are sampled.
    logits_indices: list[int]


def pad_packed_prefill(sequences: Sequence[PrefillSequence], block_size: int, padded_len: int) -> PackedPrefillInputs:
    """Lay out several prefill chunks back to back and pad the whole once to ``padded_len``.

    The ragged layout of chunked-prefill graphs: each sequence keeps its own positions and
    KV slots, attention stays within a sequence (``query_start``), and the padding after the
    last sequence repeats its last position and writes only the null block. One sequence
    gives the same tensors as :func:`pad_prefill`.
    """
    if not sequences:
        raise ValueError("a packed prefill needs at least one sequence")
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    for sequence in sequences:
        actual = len(sequence.token_ids)
        if actual == 0:
            raise ValueError("a prefill chunk needs at least one token")
        start = sequence.num_computed_tokens
        chunk_positions = list(range(start, start + actual))
        input_ids.extend(sequence.token_ids)
        positions.extend(chunk_positions)
        slots.extend(kv_slot(position, sequence.block_ids, block_size) for position in chunk_positions)
        query_start.append(query_start[-1] + actual)
    padding = padded_len - query_start[-1]
    if padding < 0:
        raise ValueError(f"padded length {padded_len} is smaller than the packed chunks ({query_start[-1]} tokens)")
    return PackedPrefillInputs(
        input_ids=input_ids + [PAD_TOKEN_ID] * padding,
        positions=positions + [positions[-1]] * padding,
        slot_mapping=slots + [PAD_SLOT] * padding,
        query_start=query_start,
        logits_indices=[end - 1 for end in query_start[1:]],
    )


def pad_decode(
    token_ids: Sequence[int],
    positions: Sequence[int],
    slot_mapping: Sequence[int],
    num_seqs_buckets: Sequence[int],
) -> DecodeInputs:
    """Pad a decode batch (one token per request) to the smallest batch bucket that holds it."""
    num_real = len(token_ids)
    if not num_real == len(positions) == len(slot_mapping):
        raise ValueError("token_ids, positions and slot_mapping must have one entry per request")
    padding = get_bucket_for_count(num_real, num_seqs_buckets) - num_real
    return DecodeInputs(
        input_ids=[*token_ids, *([PAD_TOKEN_ID] * padding)],
        positions=[*positions, *([0] * padding)],
        slot_mapping=[*slot_mapping, *([PAD_SLOT] * padding)],
        num_real=num_real,
    )
