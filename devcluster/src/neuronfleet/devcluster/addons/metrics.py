"""Reading a Prometheus ``/metrics`` page: every sample by name and labels."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: Prometheus samples by (name, sorted labels).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, by name and sorted labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(url: str, *, timeout: float = 5.0) -> Samples:
    """GET ``url`` (a ``/metrics`` endpoint) and parse it; an error status raises ``httpx.HTTPStatusError``."""
    response = httpx.get(url, timeout=timeout)
    response.raise_for_status()
    return parse_samples(response.text)
