"""The bucket recommender: exact optimum, legal sets, and the inputs it is built from."""

from __future__ import annotations

import itertools
import random
import re
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuronfleet.contract.buckets import get_default_num_batched_tokens_buckets, validate_num_batched_tokens_buckets
from neuronfleet.engine.tuning.exposition import CHUNK_METRIC, PROMPT_METRIC, ExpositionError, Kind, observed_lengths
from neuronfleet.engine.tuning.recommend import (
    RecommendError,
    candidate_weights,
    chunk_histogram,
    optimal_buckets,
    padded_compute,
    padding_waste,
    prompt_histogram,
    recommend,
)
from neuronfleet.engine.tuning.workloads import WORKLOADS


def brute_force_cost(chunks: dict[int, int], count: int, effective_max: int, granularity: int) -> int:
    """Least padded compute over every legal set of at most ``count`` buckets, found by trying them all."""
    below_max = range(granularity, effective_max, granularity)
    return min(
        padded_compute(chunks, [*subset, effective_max])
        for size in range(count)
        for subset in itertools.combinations(below_max, size)
    )


def assert_legal(buckets: list[int], effective_max: int, granularity: int) -> None:
    validate_num_batched_tokens_buckets(buckets, effective_max)  # positive, ascending, last is the maximum
    assert all(b % granularity == 0 for b in buckets[:-1]), buckets


@st.composite
def small_instances(draw: st.DrawFn) -> tuple[dict[int, int], int, int, int]:
    """Chunk histograms over at most ten legal bucket sizes, so brute force stays cheap."""
    granularity = draw(st.sampled_from([1, 2, 3, 16, 100, 128]))
    effective_max = draw(st.integers(min_value=1, max_value=10 * granularity))
    chunks = draw(
        st.dictionaries(
            st.integers(min_value=1, max_value=effective_max), st.integers(min_value=0, max_value=30), min_size=1
        ).filter(lambda histogram: any(histogram.values()))
    )
    count = draw(st.integers(min_value=1, max_value=6))
    return chunks, count, effective_max, granularity


@settings(max_examples=300)
@given(small_instances())
def test_dynamic_program_matches_brute_force(instance: tuple[dict[int, int], int, int, int]) -> None:
    chunks, count, effective_max, granularity = instance
    buckets = optimal_buckets(chunks, count, effective_max, granularity)
    assert_legal(buckets, effective_max, granularity)
    assert len(buckets) <= count
    assert padded_compute(chunks, buckets) == brute_force_cost(chunks, count, effective_max, granularity)


@st.composite
def large_instances(draw: st.DrawFn) -> tuple[dict[int, int], int, int, int]:
    granularity = draw(st.sampled_from([1, 16, 64, 100, 128, 256]))
    effective_max = draw(st.integers(min_value=1, max_value=32_768))
    chunks = draw(
        st.dictionaries(
            st.integers(min_value=1, max_value=effective_max),
            st.integers(min_value=1, max_value=1000),
            min_size=1,
            max_size=300,
        )
    )
    count = draw(st.integers(min_value=1, max_value=64))
    return chunks, count, effective_max, granularity


@given(large_instances())
def test_recommended_sets_are_always_legal_and_as_long_as_they_can_be(
    instance: tuple[dict[int, int], int, int, int],
) -> None:
    chunks, count, effective_max, granularity = instance
    buckets = optimal_buckets(chunks, count, effective_max, granularity)
    assert_legal(buckets, effective_max, granularity)
    assert len(buckets) == min(count, len(candidate_weights(chunks, effective_max, granularity)))


@given(
    prompts=st.dictionaries(
        st.integers(min_value=1, max_value=32_768), st.integers(min_value=1, max_value=50), min_size=1
    ),
    max_num_batched_tokens=st.sampled_from([100, 512, 2048, 3000, 8192]),
    granularity=st.sampled_from([1, 32, 128]),
)
def test_never_more_waste_than_the_defaults_at_their_count(
    prompts: dict[int, int], max_num_batched_tokens: int, granularity: int
) -> None:
    # The defaults are multiples of every granularity dividing 128, so they are among the sets searched.
    chunks = chunk_histogram(prompts, max_num_batched_tokens, 32_768)
    result = recommend(chunks, 3, max_num_batched_tokens, granularity)
    assert result.defaults_are_on_granularity
    assert result.optimal_at_default_count.count <= len(get_default_num_batched_tokens_buckets(max_num_batched_tokens))
    assert result.optimal_at_default_count.padding_waste <= result.default.padding_waste


@pytest.mark.parametrize(
    ("chunks", "count", "effective_max", "granularity", "expected"),
    [
        # One length: its rounded-up size and the mandatory maximum.
        ({300: 7}, 2, 8192, 128, [384, 8192]),
        ({300: 7}, 1, 8192, 128, [8192]),
        # Ten chunks of 1024 outweigh two short ones: 256 beats 128 (10752 vs 11392 tokens).
        ({128: 1, 256: 1, 1024: 10}, 2, 1024, 128, [256, 1024]),
        # A maximum off the granularity is still the last bucket; chunks above 896 pad to it.
        ({100: 1, 950: 1}, 2, 1000, 128, [128, 1000]),
        ({50: 3}, 4, 100, 128, [100]),
        # Granularity 1 puts buckets on the lengths; the maximum is one though no chunk needs it.
        ({5: 1, 7: 1, 9: 1}, 3, 10, 1, [5, 7, 10]),
    ],
)
def test_known_examples(
    chunks: dict[int, int], count: int, effective_max: int, granularity: int, expected: list[int]
) -> None:
    assert optimal_buckets(chunks, count, effective_max, granularity) == expected


def test_more_buckets_than_useful_sizes_returns_fewer_and_says_so() -> None:
    result = recommend({300: 5, 1000: 1}, 6, 8192)
    assert result.recommended.buckets == [384, 1024, 8192]
    assert result.requested_count == 6
    assert result.useful_sizes == 3
    assert result.recommended.padding_waste == pytest.approx((5 * 84 + 24) / (5 * 384 + 1024))


def test_recommendation_reports_padding_waste_of_every_set() -> None:
    chunks = {300: 1}
    result = recommend(chunks, 1, 512)
    assert result.recommended.buckets == [512]
    assert result.recommended.padding_waste == pytest.approx(212 / 512)
    assert result.default.buckets == [128, 256, 512]
    assert result.default.padding_waste == pytest.approx(212 / 512)
    assert result.optimal_at_default_count.buckets == [384, 512]
    assert result.optimal_at_default_count.padding_waste == pytest.approx(84 / 384)
    assert (result.chunks, result.tokens) == (1, 300)


def test_padding_waste_is_padding_over_padded_compute() -> None:
    assert padding_waste({100: 2, 200: 1}, [128, 256]) == pytest.approx((2 * 28 + 56) / (2 * 128 + 256))
    assert padding_waste({256: 4}, [256]) == 0.0


def test_prompts_are_chunked_the_way_chunked_prefill_splits_them() -> None:
    prompts = prompt_histogram([20_000, 20_000, 100])
    assert prompts == {20_000: 2, 100: 1}
    assert chunk_histogram(prompts, 8192, 32_768) == {8192: 4, 3616: 2, 100: 1}
    assert chunk_histogram({2000: 1}, 1024, 2048) == {1024: 1, 976: 1}


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ({40_000: 1}, "prompt length 40000 exceeds max_model_len (32768)"),
        ({0: 1}, "prompt length must be positive, got 0"),
        ({10: -1}, "count for prompt length 10 must not be negative, got -1"),
    ],
)
def test_prompts_the_engine_would_refuse_are_errors(prompts: dict[int, int], message: str) -> None:
    with pytest.raises(RecommendError, match=f"^{re.escape(message)}$"):
        chunk_histogram(prompts, 8192, 32_768)


@pytest.mark.parametrize(
    ("chunks", "count", "granularity", "message"),
    [
        ({}, 2, 128, "the distribution is empty"),
        ({100: 0}, 2, 128, "the distribution is empty"),
        ({9000: 1}, 2, 128, "chunk length 9000 exceeds the effective maximum (8192)"),
        ({100: 1}, 0, 128, "count must be at least 1, got 0"),
        ({100: 1}, 2, 0, "granularity must be at least 1, got 0"),
    ],
)
def test_unusable_input_is_an_error(chunks: dict[int, int], count: int, granularity: int, message: str) -> None:
    with pytest.raises(RecommendError) as error:
        optimal_buckets(chunks, count, 8192, granularity)
    assert str(error.value).startswith(message)


def quadratic_cost(chunks: dict[int, int], count: int, effective_max: int, granularity: int) -> int:
    """Least padded compute by the plain O(K n^2) recurrence over *every* legal size, not only candidates."""
    sizes = [*range(granularity, effective_max, granularity), effective_max]
    weights = [0] * len(sizes)
    for length, n in chunks.items():
        weights[next(index for index, size in enumerate(sizes) if size >= length)] += n
    below: list[int] = [0, *itertools.accumulate(weights)]
    best: list[int] = [size * below[j + 1] for j, size in enumerate(sizes)]
    least: int = best[-1]
    for _ in range(count - 1):
        best = [
            min([best[j]] + [best[i] + size * (below[j + 1] - below[i + 1]) for i in range(j)])
            for j, size in enumerate(sizes)
        ]
        least = min(least, best[-1])
    return least


@pytest.mark.parametrize(("seed", "granularity"), [(0, 1), (1, 1), (2, 3), (3, 7)])
def test_hundreds_of_candidates_match_the_plain_recurrence(seed: int, granularity: int) -> None:
    # Hundreds of candidates: beyond brute force, where the divide-and-conquer layers must still be exact.
    rng = random.Random(seed)
    effective_max = 300 * granularity
    chunks = {rng.randint(1, effective_max): rng.randint(1, 40) for _ in range(250)}
    count = rng.randint(2, 12)
    buckets = optimal_buckets(chunks, count, effective_max, granularity)
    assert len(candidate_weights(chunks, effective_max, granularity)) > 150
    assert_legal(buckets, effective_max, granularity)
    assert padded_compute(chunks, buckets) == quadratic_cost(chunks, count, effective_max, granularity)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_are_seeded_and_bounded(name: str) -> None:
    workload = WORKLOADS[name]
    lengths = workload.sample(20_000, seed=7)
    assert lengths == workload.sample(20_000, seed=7)
    assert lengths != workload.sample(20_000, seed=8)
    assert min(lengths) >= workload.minimum
    assert max(lengths) <= workload.max_model_len
    # The median is the documented one, give or take sampling noise.
    assert statistics.median(lengths) == pytest.approx(workload.median, rel=0.05)
    assert max(workload.sample(1000, seed=7, max_model_len=600)) <= 600


def test_summarization_prompts_span_several_chunks() -> None:
    workload = WORKLOADS["summarization"]
    prompts = prompt_histogram(workload.sample(5000, seed=0))
    chunks = chunk_histogram(prompts, workload.max_num_batched_tokens, workload.max_model_len)
    assert chunks[8192] > 0.1 * sum(prompts.values())


VLLM_METRICS = f"""\
# HELP {PROMPT_METRIC} Number of prefill tokens processed.
# TYPE {PROMPT_METRIC} histogram
{PROMPT_METRIC}_bucket{{engine="0",le="100.0",model_name="m"}} 2.0
{PROMPT_METRIC}_bucket{{engine="0",le="1000.0",model_name="m"}} 5.0
{PROMPT_METRIC}_bucket{{engine="0",le="10000.0",model_name="m"}} 6.0
{PROMPT_METRIC}_bucket{{engine="0",le="+Inf",model_name="m"}} 7.0
{PROMPT_METRIC}_count{{engine="0",model_name="m"}} 7.0
{PROMPT_METRIC}_sum{{engine="0",model_name="m"}} 12345.0
{PROMPT_METRIC}_bucket{{engine="1",le="100.0",model_name="m"}} 1.0
{PROMPT_METRIC}_bucket{{engine="1",le="1000.0",model_name="m"}} 1.0
{PROMPT_METRIC}_bucket{{engine="1",le="10000.0",model_name="m"}} 1.0
{PROMPT_METRIC}_bucket{{engine="1",le="+Inf",model_name="m"}} 1.0
# HELP vllm:num_requests_running Requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""

CHUNK_METRICS = f"""\
# TYPE {CHUNK_METRIC} histogram
{CHUNK_METRIC}_bucket{{le="256"}} 4
{CHUNK_METRIC}_bucket{{le="8192"}} 6
{CHUNK_METRIC}_bucket{{le="+Inf"}} 6
"""


def test_prompt_histogram_from_vllm_metrics_counts_at_upper_bounds() -> None:
    observed = observed_lengths(VLLM_METRICS, max_chunk=8192, max_prompt=8192)
    assert (observed.metric, observed.kind) == (PROMPT_METRIC, Kind.PROMPTS)
    # Both engines added; 10000 and +Inf are past max_model_len, so they count at it.
    assert observed.histogram == {100: 3, 1000: 3, 8192: 2}


def test_chunk_histogram_is_preferred_to_prompt_lengths() -> None:
    observed = observed_lengths(VLLM_METRICS + CHUNK_METRICS, max_chunk=4096, max_prompt=8192)
    assert (observed.metric, observed.kind) == (CHUNK_METRIC, Kind.CHUNKS)
    assert observed.histogram == {256: 4, 4096: 2}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('# TYPE other histogram\nother_bucket{le="+Inf"} 3\n', "no neuronfleet:prefill_chunk_tokens or vllm:"),
        (f'# TYPE {PROMPT_METRIC} histogram\n{PROMPT_METRIC}_bucket{{le="+Inf"}} 0\n', "has no observations yet"),
        ("this is { not metrics", "not valid Prometheus text exposition"),
        (
            f'# TYPE {CHUNK_METRIC} histogram\n{CHUNK_METRIC}_bucket{{le="10"}} 5\n'
            f'{CHUNK_METRIC}_bucket{{le="20"}} 4\n',
            "bucket counts decrease at le=20",
        ),
    ],
)
def test_metrics_without_a_usable_histogram_are_errors(text: str, message: str) -> None:
    with pytest.raises(ExpositionError, match=message):
        observed_lengths(text, max_chunk=8192, max_prompt=8192)
