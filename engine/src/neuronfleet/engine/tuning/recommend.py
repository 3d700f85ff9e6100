"""Recommend prefill buckets: the bucket set that spends the least compute on padding.

Chunked prefill splits each prompt into chunks of at most the effective maximum
(``min(max_num_batched_tokens, max_model_len)``), and every chunk runs at the size
of the smallest bucket that holds it. A bucket set's cost for a workload is
therefore its *padded compute*: the sum over chunks of the bucket each pads to.
The real tokens are fixed by the workload, so minimising padded compute is the
same as minimising padding.

:func:`optimal_buckets` finds the exact minimum for a given number of buckets by
dynamic programming; everything here is a pure function of a histogram
(length -> how many), so a million prompts cost no more than their distinct lengths.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from neuronfleet.contract.buckets import (
    chunk_sizes,
    effective_max_num_batched_tokens,
    get_bucket_for_count,
    get_default_num_batched_tokens_buckets,
)

#: Default step between recommended buckets: compiled shapes are tiled in 128s.
DEFAULT_GRANULARITY = 128

#: A length distribution: length in tokens -> how many prompts (or chunks) have it.
Histogram = Mapping[int, int]


class RecommendError(ValueError):
    """Input the recommender cannot work with, said in one line."""


@dataclass(frozen=True)
class BucketSet:
    """A bucket list and the share of its padded compute that is padding."""

    buckets: list[int]
    padding_waste: float

    @property
    def count(self) -> int:
        """How many buckets (compiled graphs) the set has."""
        return len(self.buckets)


@dataclass(frozen=True)
class Recommendation:
    """The recommended buckets for a chunk distribution, and what they are compared with."""

    effective_max: int
    granularity: int
    requested_count: int
    #: How many bucket sizes can matter at all; fewer buckets than asked come back when this is smaller.
    useful_sizes: int
    chunks: int
    tokens: int
    recommended: BucketSet
    #: The power-of-two defaults the engine uses when no buckets are configured.
    default: BucketSet
    #: The optimum with as many buckets as the defaults: no set of that size wastes less.
    optimal_at_default_count: BucketSet

    @property
    def defaults_are_on_granularity(self) -> bool:
        """Whether every default bucket is a multiple of the granularity (or the maximum).

        Only then is the default set one of the sets the optimum is chosen from,
        so only then is the optimum guaranteed to waste no more than the defaults.
        """
        return all(b % self.granularity == 0 or b == self.effective_max for b in self.default.buckets)


def prompt_histogram(lengths: Iterable[int]) -> dict[int, int]:
    """Count prompt lengths into a histogram."""
    return dict(Counter(lengths))


def chunk_histogram(prompts: Histogram, max_num_batched_tokens: int, max_model_len: int) -> dict[int, int]:
    """The prefill chunks a prompt histogram becomes under chunked prefill.

    Raises :class:`RecommendError` for a prompt the engine would not accept.
    """
    _check_positive("max_num_batched_tokens", max_num_batched_tokens)
    _check_positive("max_model_len", max_model_len)
    limit = effective_max_num_batched_tokens(max_num_batched_tokens, max_model_len)
    chunks: Counter[int] = Counter()
    for length, count in prompts.items():
        _check_entry("prompt length", length, count)
        if length > max_model_len:
            raise RecommendError(f"prompt length {length} exceeds max_model_len ({max_model_len})")
        # Every prompt of this length splits the same way, so split once and scale.
        for size in chunk_sizes(length, limit):
            chunks[size] += count
    return dict(chunks)


def padded_compute(chunks: Histogram, buckets: Sequence[int]) -> int:
    """Tokens computed when every chunk runs at the bucket it pads to."""
    return sum(get_bucket_for_count(length, buckets) * count for length, count in chunks.items())


def padding_waste(chunks: Histogram, buckets: Sequence[int]) -> float:
    """Share of padded compute spent on padding: ``(padded - real) / padded``."""
    padded = padded_compute(chunks, buckets)
    real = sum(length * count for length, count in chunks.items())
    return (padded - real) / padded if padded else 0.0


def round_up_to_candidate(length: int, effective_max: int, granularity: int) -> int:
    """The smallest legal bucket that holds ``length``: the next multiple of the granularity, or the maximum."""
    return min(math.ceil(length / granularity) * granularity, effective_max)


def candidate_weights(chunks: Histogram, effective_max: int, granularity: int) -> dict[int, int]:
    """Chunk counts gathered at the smallest legal bucket holding them; the maximum always present.

    These sizes are the only ones an optimal set needs (see :func:`optimal_buckets`).
    """
    weights: Counter[int] = Counter()
    for length, count in chunks.items():
        weights[round_up_to_candidate(length, effective_max, granularity)] += count
    # The last bucket must be the maximum even when no chunk rounds up to it.
    weights[effective_max] += 0
    return dict(weights)


def optimal_buckets(
    chunks: Histogram, count: int, effective_max: int, granularity: int = DEFAULT_GRANULARITY
) -> list[int]:
    """The bucket set of at most ``count`` buckets with the least padded compute for ``chunks``.

    Legal sets are strictly ascending, positive, end at ``effective_max``, and hold
    only multiples of ``granularity`` besides that last bucket. The answer is exact.
    It has ``count`` buckets, or fewer when fewer sizes can matter (then every useful
    size is a bucket and padding is only what the granularity forces).

    Why only *candidates* are needed: call ``c(L)`` the smallest legal size ``>= L``.
    Take any legal set and a bucket ``b`` in it other than the last. The chunks that
    pad to ``b`` have lengths ``L`` with ``prev < L <= b``; since ``b`` is itself
    legal, each ``c(L) <= b``. Lower ``b`` to ``b' = max c(L)`` over those chunks:
    ``b'`` is legal, still above ``prev`` (``c(L) >= L > prev``), still holds each of
    them, and no chunk pads further. A bucket no chunk pads to can be dropped. So some
    optimal set uses only sizes ``c(L)`` of observed lengths, plus the maximum, and
    the candidate count is bounded by the distinct lengths, not by the maximum.

    The dynamic program: with candidates ``s_0 < ... < s_{m-1} = effective_max``
    and ``W(i, j]`` the chunks at candidates ``i+1..j``, let ``best_k[j]`` be the
    least padded compute of the chunks at candidates ``0..j`` with ``k`` buckets,
    the largest at ``s_j``. The largest bucket serves every chunk above the one
    before it, at ``i``::

        best_1[j] = s_j * W(-1, j]
        best_k[j] = min over i < j of  best_{k-1}[i] + s_j * W(i, j]

    and the answer is ``best_K[m-1]``. A plain scan of ``i`` is ``O(K m^2)``. The
    cost ``w(i, j) = s_j * W(i, j]`` satisfies the quadrangle inequality: for
    ``a <= b <= c <= d``, ``w(a,c) + w(b,d) - w(a,d) - w(b,c) = W(a, b] (s_c - s_d) <= 0``.
    Hence the leftmost best ``i`` never decreases as ``j`` grows, and each layer is
    solved by divide and conquer in ``O(m log m)``: ``O(K m log m)`` in all.

    Raises :class:`RecommendError` for inputs no legal set can serve.
    """
    _check_positive("count", count)
    _check_positive("granularity", granularity)
    _check_positive("effective maximum", effective_max)
    _check_chunks(chunks, effective_max)
    weights = candidate_weights(chunks, effective_max, granularity)
    sizes = sorted(weights)
    m = len(sizes)
    # prefix[j + 1] = chunks at candidates 0..j, so W(i, j] = prefix[j + 1] - prefix[i + 1].
    prefix = [0, *itertools.accumulate(weights[size] for size in sizes)]
    # Exactly min(count, m) buckets: adding a bucket never costs more, so the best
    # set of at most K buckets can always be taken to have min(K, m).
    layers = min(count, m)

    best = [sizes[j] * prefix[j + 1] for j in range(m)]
    # back[k - 1][j]: where the buckets before s_j end in the best k-bucket set ending at s_j.
    back: list[list[int]] = [[-1] * m]
    for k in range(2, layers + 1):
        best, choice = _next_layer(best, sizes, prefix, k)
        back.append(choice)

    buckets = [sizes[m - 1]]
    j = m - 1
    for k in range(layers, 1, -1):
        j = back[k - 1][j]
        buckets.append(sizes[j])
    return buckets[::-1]


def _next_layer(previous: list[int], sizes: list[int], prefix: list[int], k: int) -> tuple[list[int], list[int]]:
    """``best_k`` and its split points from ``best_{k-1}`` (see :func:`optimal_buckets`)."""
    m = len(sizes)
    # Entries below k-1 (too few candidates for k buckets) are never read by the next layer.
    best = [0] * m
    choice = [-1] * m

    def solve(j_lo: int, j_hi: int, i_lo: int, i_hi: int) -> None:
        # Fills best[j_lo..j_hi], knowing their split points lie in i_lo..i_hi.
        if j_lo > j_hi:
            return
        j = (j_lo + j_hi) // 2
        winner, cost = i_lo, previous[i_lo] + sizes[j] * (prefix[j + 1] - prefix[i_lo + 1])
        for i in range(i_lo + 1, min(i_hi, j - 1) + 1):
            candidate = previous[i] + sizes[j] * (prefix[j + 1] - prefix[i + 1])
            if candidate < cost:  # strict: keeps the leftmost best, the one the order holds for
                winner, cost = i, candidate
        best[j], choice[j] = cost, winner
        solve(j_lo, j - 1, i_lo, winner)
        solve(j + 1, j_hi, winner, i_hi)

    # With k buckets the largest sits at index k-1 or later, the one before it at k-2 or later.
    solve(k - 1, m - 1, k - 2, m - 2)
    return best, choice


def bucket_set(chunks: Histogram, buckets: list[int]) -> BucketSet:
    """Pair a bucket list with its padding waste for ``chunks``."""
    return BucketSet(buckets=buckets, padding_waste=padding_waste(chunks, buckets))


def recommend(
    chunks: Histogram, count: int, effective_max: int, granularity: int = DEFAULT_GRANULARITY
) -> Recommendation:
    """The optimal ``count``-bucket set for ``chunks``, beside the defaults and the optimum at their size."""
    recommended = optimal_buckets(chunks, count, effective_max, granularity)
    defaults = get_default_num_batched_tokens_buckets(effective_max)
    at_default_count = optimal_buckets(chunks, len(defaults), effective_max, granularity)
    return Recommendation(
        effective_max=effective_max,
        granularity=granularity,
        requested_count=count,
        useful_sizes=len(candidate_weights(chunks, effective_max, granularity)),
        chunks=sum(chunks.values()),
        tokens=sum(length * n for length, n in chunks.items()),
        recommended=bucket_set(chunks, recommended),
        default=bucket_set(chunks, defaults),
        optimal_at_default_count=bucket_set(chunks, at_default_count),
    )


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise RecommendError(f"{name} must be at least 1, got {value}")


def _check_entry(what: str, length: int, count: int) -> None:
    if length < 1:
        raise RecommendError(f"{what} must be positive, got {length}")
    if count < 0:
        raise RecommendError(f"count for {what} {length} must not be negative, got {count}")


def _check_chunks(chunks: Histogram, effective_max: int) -> None:
    for length, count in chunks.items():
        _check_entry("chunk length", length, count)
        if length > effective_max:
            raise RecommendError(f"chunk length {length} exceeds the effective maximum ({effective_max})")
    if not any(chunks.values()):
        raise RecommendError("the distribution is empty: no prompt lengths to recommend buckets for")
