"""Length distributions read from a running engine's Prometheus metrics.

A Prometheus histogram only says how many observations fell at or below each
bucket bound, so the distribution read back is approximate: every observation
counts at its bucket's upper bound. That rounds lengths up, never down, so a
bucket set recommended from it still holds every chunk it stands for.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from enum import Enum

from prometheus_client.parser import text_string_to_metric_families

from neuronfleet.contract import metrics

#: Prefill chunk lengths as scheduled, if the engine exports them: the direct input.
CHUNK_METRIC = metrics.PREFILL_CHUNK_TOKENS
#: vLLM's per-request prompt lengths: chunked here the way chunked prefill would.
PROMPT_METRIC = metrics.PROMPT_TOKENS


class Kind(Enum):
    """What the lengths of a histogram are."""

    CHUNKS = "chunks"
    PROMPTS = "prompts"


@dataclass(frozen=True)
class ObservedLengths:
    """A length histogram read from metrics, and which metric it came from."""

    metric: str
    kind: Kind
    #: Length (a bucket's upper bound, clipped to the limit) -> observations.
    histogram: dict[int, int]


class ExpositionError(ValueError):
    """Metrics text that holds no usable length histogram, said in one line."""


def observed_lengths(text: str, max_chunk: int, max_prompt: int) -> ObservedLengths:
    """The chunk-length histogram from ``text`` if there is one, else the prompt-length one.

    Lengths are capped at ``max_chunk`` (chunks) or ``max_prompt`` (prompts):
    observations above the last finite bound, and bounds above the cap, count at
    the cap, since nothing longer can be scheduled. Label sets (engines, models)
    are added together.
    """
    buckets = _histogram_buckets(text)
    for metric, kind, limit in ((CHUNK_METRIC, Kind.CHUNKS, max_chunk), (PROMPT_METRIC, Kind.PROMPTS, max_prompt)):
        if metric in buckets:
            histogram = _per_length(metric, buckets[metric], limit)
            if not any(histogram.values()):
                raise ExpositionError(f"{metric} has no observations yet")
            return ObservedLengths(metric=metric, kind=kind, histogram=histogram)
    raise ExpositionError(f"no {CHUNK_METRIC} or {PROMPT_METRIC} histogram in the metrics")


def _histogram_buckets(text: str) -> dict[str, dict[float, float]]:
    """Cumulative counts per upper bound of each histogram, summed over label sets."""
    found: dict[str, dict[float, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.type != "histogram":
                continue
            cumulative: defaultdict[float, float] = defaultdict(float)
            for sample in family.samples:
                if sample.name == f"{family.name}_bucket":
                    cumulative[float(sample.labels["le"])] += sample.value
            found[family.name] = dict(cumulative)
    except (ValueError, KeyError, TypeError) as error:
        raise ExpositionError(f"not valid Prometheus text exposition: {error}") from None
    return found


def _per_length(metric: str, cumulative: dict[float, float], limit: int) -> dict[int, int]:
    """Per-bucket counts from cumulative ones, each at its bucket's upper bound."""
    histogram: defaultdict[int, int] = defaultdict(int)
    below = 0
    for bound in sorted(cumulative):
        total = round(cumulative[bound])
        if total < below:
            raise ExpositionError(f"{metric} bucket counts decrease at le={bound}")
        # A bound under one token still means at least one; +Inf and anything past the limit is the limit.
        length = limit if math.isinf(bound) else max(1, min(math.ceil(bound), limit))
        histogram[length] += total - below
        below = total
    return {length: count for length, count in histogram.items() if count}
