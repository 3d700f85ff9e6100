"""The bucket rules of the Neuron scheduler contract: defaults, messages, lookup."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuronfleet.contract.buckets import (
    BucketError,
    chunk_sizes,
    get_bucket_for_count,
    get_decode_padded_batch_size,
    get_default_num_batched_tokens_buckets,
    get_default_num_seqs_buckets,
    validate_num_batched_tokens_buckets,
    validate_num_seqs_buckets,
)


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (2048, [128, 256, 512, 1024, 2048]),
        (3000, [128, 256, 512, 1024, 2048, 3000]),
        (8192, [128, 256, 512, 1024, 2048, 4096, 8192]),
        (128, [128]),
        (100, [100]),
    ],
)
def test_default_prefill_buckets(limit: int, expected: list[int]) -> None:
    assert get_default_num_batched_tokens_buckets(limit) == expected


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(8, [1, 2, 4, 8]), (6, [1, 2, 4, 6]), (1, [1]), (2, [1, 2]), (64, [1, 2, 4, 8, 16, 32, 64])],
)
def test_default_decode_buckets(limit: int, expected: list[int]) -> None:
    assert get_default_num_seqs_buckets(limit) == expected


P = "num_batched_tokens_buckets"


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        (None, f"{P} cannot be empty"),
        ([], f"{P} cannot be empty"),
        ("512,1024", f"{P} must be a list, got str"),
        ((512, 1024), f"{P} must be a list, got tuple"),
        ([512, "1024"], f"{P}[1] must be an integer, got 1024"),
        ([512, 1024.0], f"{P}[1] must be an integer, got 1024.0"),
        ([True, 8192], f"{P}[0] must be an integer, got True"),
        ([0, 8192], f"{P}[0] must be positive, got 0"),
        ([512, -1, 8192], f"{P}[1] must be positive, got -1"),
        ([1024, 512, 8192], f"{P} must be in strictly ascending order, got [1024, 512, 8192]"),
        ([512, 512, 8192], f"{P} must be in strictly ascending order, got [512, 512, 8192]"),
        ([512, 1024, 2048], f"Last bucket in {P} must equal max_num_batched_tokens (8192), got 2048"),
    ],
)
def test_prefill_bucket_messages(buckets: object, message: str) -> None:
    with pytest.raises(BucketError) as caught:
        validate_num_batched_tokens_buckets(buckets, 8192)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        # Each list breaks several rules; the earliest rule in the contract's order wins.
        ([0, "x"], f"{P}[1] must be an integer, got x"),
        ([4096, 0], f"{P}[1] must be positive, got 0"),
        ([4096, 2048], f"{P} must be in strictly ascending order, got [4096, 2048]"),
    ],
)
def test_rules_are_checked_in_contract_order(buckets: object, message: str) -> None:
    with pytest.raises(BucketError) as caught:
        validate_num_batched_tokens_buckets(buckets, 8192)
    assert str(caught.value) == message


def test_decode_bucket_last_must_equal_max_num_seqs() -> None:
    with pytest.raises(BucketError) as caught:
        validate_num_seqs_buckets([1, 2, 4], 8)
    assert str(caught.value) == "Last bucket in num_seqs_buckets must equal max_num_seqs (8), got 4"
    assert validate_num_seqs_buckets([1, 2, 4, 8], 8) == [1, 2, 4, 8]


@pytest.mark.parametrize(
    ("count", "bucket"),
    [(0, 0), (1, 128), (50, 128), (127, 128), (128, 128), (129, 256), (1500, 2048), (8192, 8192)],
)
def test_bucket_for_count_matches_design_examples(count: int, bucket: int) -> None:
    assert get_bucket_for_count(count, get_default_num_batched_tokens_buckets(8192)) == bucket


def test_count_above_every_bucket_is_an_error() -> None:
    with pytest.raises(ValueError, match="exceeds the largest compiled bucket 8192"):
        get_bucket_for_count(8193, [4096, 8192])


@pytest.mark.parametrize(
    ("num_reqs", "max_query_len", "expected"),
    [(3, 1, 4), (3, 256, 3), (8, 1, 8), (1, 1, 1), (5, 0, 5)],
)
def test_decode_padded_batch_size(num_reqs: int, max_query_len: int, expected: int) -> None:
    assert get_decode_padded_batch_size(num_reqs, max_query_len, [1, 2, 4, 8]) == expected


def test_chunk_sizes_follow_chunked_prefill() -> None:
    assert chunk_sizes(32000, 8192) == [8192, 8192, 8192, 7424]
    assert chunk_sizes(8192, 8192) == [8192]
    assert chunk_sizes(200, 8192) == [200]


bucket_lists = st.lists(st.integers(min_value=-4, max_value=20_000), min_size=0, max_size=8)


@given(buckets=bucket_lists, limit=st.integers(min_value=1, max_value=20_000))
def test_accepted_lists_are_ascending_and_end_at_the_limit(buckets: list[int], limit: int) -> None:
    try:
        accepted = validate_num_batched_tokens_buckets(buckets, limit)
    except BucketError:
        return
    assert all(a < b for a, b in itertools.pairwise(accepted))
    assert accepted[0] > 0
    assert accepted[-1] == limit


@given(limit=st.integers(min_value=1, max_value=20_000), below=st.sets(st.integers(min_value=1, max_value=19_999)))
def test_every_ascending_list_ending_at_the_limit_is_accepted(limit: int, below: set[int]) -> None:
    # The test above holds only for what is accepted; this one makes sure the accepted side is ever reached.
    buckets = [*sorted(value for value in below if value < limit)[:7], limit]
    assert validate_num_batched_tokens_buckets(buckets, limit) == buckets


@given(limit=st.integers(min_value=1, max_value=1 << 20))
def test_default_lists_always_validate(limit: int) -> None:
    assert validate_num_batched_tokens_buckets(get_default_num_batched_tokens_buckets(limit), limit)
    assert validate_num_seqs_buckets(get_default_num_seqs_buckets(min(limit, 1024)), min(limit, 1024))


@given(
    buckets=st.lists(st.integers(min_value=1, max_value=1 << 16), min_size=1, max_size=10, unique=True).map(sorted),
    data=st.data(),
)
def test_bucket_for_count_is_the_smallest_that_fits(buckets: list[int], data: st.DataObject) -> None:
    count = data.draw(st.integers(min_value=1, max_value=buckets[-1]))
    bucket = get_bucket_for_count(count, buckets)
    assert bucket in buckets
    assert bucket >= count
    assert all(smaller < count for smaller in buckets if smaller < bucket)
