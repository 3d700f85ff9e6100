"""The vLLM releases the Neuron scheduler supports, as a pure check of a version string.

Two release series: 0.29, the vLLM that the vLLM Neuron plugin of Neuron SDK 2.33 pins (what a
Neuron host runs), and 0.34, the project's own pin. Both are tested (``make test``); the releases
between them changed the scheduler internals the Neuron scheduler rearranges more than once and
are untested, so they are refused rather than guessed at.
"""

from __future__ import annotations

import re

#: The release series (major.minor) the scheduler supports, oldest first.
SUPPORTED_SERIES = ("0.29", "0.34")
#: The same, as users read it (the line an unsupported vLLM fails with names it).
SUPPORTED_RANGE = "vLLM 0.29.x (Neuron SDK 2.33) or 0.34.x"


class UnsupportedVllmError(ImportError):
    """The installed vLLM is outside ``SUPPORTED_RANGE``."""


def supported_series(version: str) -> str:
    """The supported series ``version`` (e.g. ``"0.29.0+neuron"``) belongs to; raises ``UnsupportedVllmError``."""
    match = re.match(r"(\d+)\.(\d+)(?![\d])", version)
    series = f"{match[1]}.{match[2]}" if match else ""
    if series not in SUPPORTED_SERIES:
        raise UnsupportedVllmError(
            f"neuronfleet's Neuron scheduler supports {SUPPORTED_RANGE}; this environment has vLLM {version}"
        )
    return series
