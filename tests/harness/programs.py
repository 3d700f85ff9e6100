"""Run a program once as a user would: output captured, no standard input, its status left to the test."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_program(
    argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to the end (or ``timeout``) and return what it printed and its exit status."""
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        check=False,
        env=None if env is None else dict(env),
    )
