"""The supported vLLM releases: the pure check, the import-time refusal, and the pins that state them."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import vllm
from packaging.requirements import Requirement

from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.vllm_range import SUPPORTED_RANGE, UnsupportedVllmError, supported_series

pytestmark = pytest.mark.vllm_matrix

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("version", "series"),
    [("0.29.0", "0.29"), ("0.29.0+neuron.2.33", "0.29"), ("0.29.1", "0.29"), ("0.34.0", "0.34"), ("0.34.2rc1", "0.34")],
)
def test_supported_versions(version: str, series: str) -> None:
    assert supported_series(version) == series


@pytest.mark.parametrize(
    "version", ["0.28.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.35.0", "0.290.0", "1.0", "dev", ""]
)
def test_unsupported_versions_name_the_range(version: str) -> None:
    with pytest.raises(UnsupportedVllmError) as raised:
        supported_series(version)
    assert str(raised.value) == (
        f"neuronfleet's Neuron scheduler supports {SUPPORTED_RANGE}; this environment has vLLM {version}"
    )


def test_the_installed_vllm_is_the_series_in_use() -> None:
    assert supported_series(vllm.__version__) == vllm_compat.VLLM_SERIES


def test_importing_the_scheduler_on_an_unsupported_vllm_fails_with_one_line(tmp_path: Path) -> None:
    code = "import vllm; vllm.__version__ = '0.31.0'; import neuronfleet.engine.scheduler"
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "neuronfleet.engine.scheduler.vllm_range.UnsupportedVllmError: neuronfleet's Neuron scheduler supports "
        "vLLM 0.29.x (Neuron SDK 2.33) or 0.34.x; this environment has vLLM 0.31.0"
    )


@pytest.mark.parametrize(
    "version", ["0.28.9", "0.29.0", "0.29.3", "0.30.0", "0.31.1", "0.32.0", "0.33.0", "0.33.4", "0.34.0", "0.35.0"]
)
def test_the_engine_extra_admits_exactly_the_supported_series(version: str) -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["engine"]
    (requirement,) = [r for r in map(Requirement, extra) if r.name == "vllm"]
    try:
        supported_series(version)
    except UnsupportedVllmError:
        assert not requirement.specifier.contains(version)
    else:
        assert requirement.specifier.contains(version)
