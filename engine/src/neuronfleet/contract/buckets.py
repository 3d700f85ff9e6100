"""Compiled bucket sets: defaults, validation and bucket lookup.

A Neuron model is compiled once per bucket. Prefill chunks are padded to the
smallest ``num_batched_tokens_buckets`` entry that holds them and decode batches
to the smallest ``num_seqs_buckets`` entry. The rules and messages here are the
Neuron scheduler's, so users of that scheduler see the errors they know.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

#: Smallest default prefill bucket: below this, padding costs less than a graph.
MIN_DEFAULT_PREFILL_BUCKET = 128

NUM_BATCHED_TOKENS_BUCKETS = "num_batched_tokens_buckets"
NUM_SEQS_BUCKETS = "num_seqs_buckets"
DECODE_CONTEXT_LENGTH_BUCKETS = "decode_context_length_buckets"
#: Decode context buckets are multiples of the NKI attention kernel's tile (``P_MAX``).
DECODE_CONTEXT_TILE = 128

#: The rules' messages, worded as the Neuron scheduler words them; the operator's admission
#: rules (CEL) are written from these too, so the API server says what the engine says.
EMPTY_MESSAGE = "{name} cannot be empty"
ASCENDING_MESSAGE = "{name} must be in strictly ascending order"
LAST_BUCKET_MESSAGE = "Last bucket in {name} must equal {limit_name} ({limit}), got {last}"
#: vLLM Neuron's rules for decode context buckets (its design page states them; it words no message).
CONTEXT_BELOW_MAX_MESSAGE = (
    "Every bucket in {name} must be less than max_model_len ({limit}), got {value}: "
    "the max_model_len graph is always compiled"
)
CONTEXT_TILE_MESSAGE = "Every bucket in {name} must be a multiple of {tile} (the NKI attention tile), got {value}"


class BucketError(ValueError):
    """A bucket list that breaks one of the Neuron scheduler's rules."""


def effective_max_num_batched_tokens(max_num_batched_tokens: int, max_model_len: int) -> int:
    """The largest prefill chunk the engine can schedule in one step."""
    return min(max_num_batched_tokens, max_model_len)


def _powers_of_two_up_to(start: int, maximum: int) -> list[int]:
    """Powers of two from ``start`` below ``maximum``, then ``maximum`` itself.

    Ending on the maximum keeps "last bucket equals the limit" true when the
    limit is not a power of two.
    """
    buckets = []
    current = start
    while current < maximum:
        buckets.append(current)
        current *= 2
    buckets.append(maximum)
    return buckets


def get_default_num_batched_tokens_buckets(max_num_batched_tokens: int) -> list[int]:
    """Default prefill buckets: 128, 256, ... up to and ending on the effective maximum."""
    return _powers_of_two_up_to(MIN_DEFAULT_PREFILL_BUCKET, max_num_batched_tokens)


def get_default_num_seqs_buckets(max_num_seqs: int) -> list[int]:
    """Default decode batch buckets: 1, 2, 4, ... up to and ending on ``max_num_seqs``."""
    return _powers_of_two_up_to(1, max_num_seqs)


def validate_bucket_list(name: str, buckets: object) -> list[int]:
    """Check a bucket list's shape (rules 1-5 of the contract), in the contract's order.

    Returns the list unchanged when it passes; raises :class:`BucketError` with the
    first rule it breaks.
    """
    if buckets is None or (isinstance(buckets, list | tuple) and not buckets):
        raise BucketError(EMPTY_MESSAGE.format(name=name))
    if not isinstance(buckets, list):
        raise BucketError(f"{name} must be a list, got {type(buckets).__name__}")
    for i, value in enumerate(buckets):
        # bool is a subclass of int, but `True` is never a meant bucket size.
        if not isinstance(value, int) or isinstance(value, bool):
            raise BucketError(f"{name}[{i}] must be an integer, got {value}")
    for i, value in enumerate(buckets):
        if value <= 0:
            raise BucketError(f"{name}[{i}] must be positive, got {value}")
    if any(a >= b for a, b in itertools.pairwise(buckets)):
        raise BucketError(f"{ASCENDING_MESSAGE.format(name=name)}, got {buckets}")
    return buckets


def validate_last_bucket(name: str, buckets: list[int], limit_name: str, limit: int) -> None:
    """Rule 6: the largest bucket is exactly the limit, so every legal shape has a graph."""
    if buckets[-1] != limit:
        raise BucketError(LAST_BUCKET_MESSAGE.format(name=name, limit_name=limit_name, limit=limit, last=buckets[-1]))


def validate_num_batched_tokens_buckets(buckets: object, max_num_batched_tokens: int) -> list[int]:
    """Validate prefill buckets against the effective prefill budget."""
    checked = validate_bucket_list(NUM_BATCHED_TOKENS_BUCKETS, buckets)
    validate_last_bucket(NUM_BATCHED_TOKENS_BUCKETS, checked, "max_num_batched_tokens", max_num_batched_tokens)
    return checked


def validate_num_seqs_buckets(buckets: object, max_num_seqs: int) -> list[int]:
    """Validate decode batch buckets against ``max_num_seqs``."""
    checked = validate_bucket_list(NUM_SEQS_BUCKETS, buckets)
    validate_last_bucket(NUM_SEQS_BUCKETS, checked, "max_num_seqs", max_num_seqs)
    return checked


def validate_decode_context_length_buckets(buckets: list[int], max_model_len: int) -> None:
    """vLLM Neuron's rules beyond a bucket list's shape: below ``max_model_len``, whole attention tiles."""
    name = DECODE_CONTEXT_LENGTH_BUCKETS
    for value in buckets:
        if value >= max_model_len:
            raise BucketError(CONTEXT_BELOW_MAX_MESSAGE.format(name=name, limit=max_model_len, value=value))
        if value % DECODE_CONTEXT_TILE:
            raise BucketError(CONTEXT_TILE_MESSAGE.format(name=name, tile=DECODE_CONTEXT_TILE, value=value))


def get_bucket_for_count(count: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``count``; 0 for nothing to run.

    A count above every bucket has no compiled graph. The reference scheduler
    silently falls back to the largest bucket, which truncates the input; here it
    is an error, because it means the caller scheduled more than the limits allow.
    """
    if count == 0:
        return 0
    if count < 0:
        raise ValueError(f"token count must not be negative, got {count}")
    index = bisect.bisect_left(buckets, count)
    if index == len(buckets):
        raise ValueError(f"count {count} exceeds the largest compiled bucket {buckets[-1]}")
    return buckets[index]


def get_decode_padded_batch_size(
    num_reqs: int,
    max_query_len: int,
    num_seqs_buckets: Sequence[int],
    decode_token_threshold: int = 1,
) -> int:
    """Batch size a step runs at: decode steps pad to a ``num_seqs_buckets`` entry.

    Only a decode step (every request runs 1..threshold tokens) has a batch-bucketed
    graph; any other step keeps its real batch size.
    """
    if 1 <= max_query_len <= decode_token_threshold:
        return get_bucket_for_count(num_reqs, num_seqs_buckets)
    return num_reqs


def chunk_sizes(prompt_len: int, chunk_limit: int) -> list[int]:
    """How chunked prefill splits a prompt: full chunks of ``chunk_limit``, then the rest."""
    full, rest = divmod(prompt_len, chunk_limit)
    return [chunk_limit] * full + ([rest] if rest else [])
