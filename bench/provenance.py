"""What every benchmark records beside its figures: the commit it ran on, and each figure's spread."""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def commit() -> str:
    """The checkout's commit, with ``-dirty`` when tracked files differ from it (``unknown`` outside git)."""
    try:
        described = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=12"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return described.stdout.strip()


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements (seeds or runs)."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def ratio_spread(
    figures: Sequence[Mapping[str, float]], reference: Sequence[Mapping[str, float]], key: str
) -> dict[str, float]:
    """The spread of ``key``'s ratio to the reference's, measurement by measurement (seed by seed)."""
    return spread([f[key] / r[key] for f, r in zip(figures, reference, strict=True)])


def show(figure: dict[str, float], fmt: str = "{:.2f}") -> str:
    """A spread as ``median [min-max]``."""
    return f"{fmt.format(figure['median'])} [{fmt.format(figure['min'])}-{fmt.format(figure['max'])}]"
