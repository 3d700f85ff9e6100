"""Shared test helpers."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness.engine_server import ServerPool
from harness.programs import run_program

from neuronfleet.devcluster.process.managed import SCRIPTS

# `cluster`, `crds`, `kube`, `namespace` and `wait_for`: a real local control plane, started on first use.
# The operator's fixtures (`api`, `operator`, `services`) load only in the modules that name them.
# `s3_server` and `s3_bucket`: a real local S3-compatible server, started on first use.
pytest_plugins = ["harness.cluster_fixtures", "harness.s3_fixtures"]


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run an installed console script as a user would, capturing its output."""

    def run(program: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return run_program(
            [str(SCRIPTS / program), *args],
            timeout=120,
            cwd=cwd,
            env={"PATH": str(SCRIPTS), "COLUMNS": "120", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"},
        )

    return run


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """Start ``neuronfleet-engine serve`` subprocesses; all are stopped when the module is done."""
    pool = ServerPool(lambda: tmp_path_factory.mktemp("serve"))
    yield pool
    pool.stop_all()
