"""Where the engine keeps what it may keep between runs on one machine."""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(*parts: str) -> Path:
    """``$XDG_CACHE_HOME/neuronfleet/<parts>`` (``~/.cache`` when the variable is unset or empty)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root, "neuronfleet", *parts)
