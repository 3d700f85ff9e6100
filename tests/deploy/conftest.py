"""Helpers for the shipping tests: helm without a cluster, and the Argo CD health checks in Lua 5.1."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.programs import run_program
from lupa import lua51

from neuronfleet.devcluster.process.tools import KubeTools, helm_env

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "neuronfleet"
HEALTH = ROOT / "argocd" / "resource_customizations" / "neuronfleet.io"

Helm = Callable[..., subprocess.CompletedProcess[str]]
Render = Callable[..., list[dict[str, Any]]]
Health = Callable[[str, Mapping[str, Any]], dict[str, str]]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """The pinned helm, with its caches in a temp directory; output captured, status not checked."""
    home = tmp_path_factory.mktemp("helm")
    binary = str(KubeTools.locate().path("helm"))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_program([binary, *args], timeout=120, env=helm_env(home))

    return run


@pytest.fixture(scope="session")
def render(helm: Helm) -> Render:
    """``helm template`` of the chart with ``--set`` values: the manifests, parsed."""

    def run(*sets: str, namespace: str = "neuronfleet-system", release: str = "neuronfleet") -> list[dict[str, Any]]:
        args = ["template", release, str(CHART), "--namespace", namespace]
        for value in sets:
            args += ["--set", value]
        rendered = helm(*args)
        assert rendered.returncode == 0, rendered.stderr
        return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]

    return run


def lua_table(runtime: Any, value: Any) -> Any:
    """A Python value as Argo CD hands it to Lua: maps and lists as tables (lists 1-based)."""
    if isinstance(value, Mapping):
        return runtime.table_from({k: lua_table(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([lua_table(runtime, v) for v in value])
    return value


def run_lua_health(script: Path, obj: Mapping[str, Any]) -> dict[str, str]:
    """Run a health check on ``obj`` in a fresh Lua 5.1, as Argo CD does; return status and message."""
    runtime = lua51.LuaRuntime(register_eval=False)
    assert runtime.lua_version == (5, 1)
    runtime.globals().obj = lua_table(runtime, obj)
    result = runtime.execute(script.read_text())
    return {"status": str(result["status"]), "message": str(result["message"])}


def run_health(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """Run ``<kind>/health.lua`` (of our group) on ``obj``."""
    return run_lua_health(HEALTH / kind / "health.lua", obj)


@pytest.fixture
def argo_health() -> Health:
    """The Argo CD health checks, by kind."""
    return run_health


@pytest.fixture
def application_health() -> Callable[[Mapping[str, Any]], dict[str, str]]:
    """The Application health check an app of apps needs (``argoproj.io/Application/health.lua``)."""
    script = HEALTH.parent / "argoproj.io" / "Application" / "health.lua"
    return lambda obj: run_lua_health(script, obj)


@pytest.fixture
def captured() -> Callable[[str, str], dict[str, Any]]:
    """The health checks' test inputs: objects captured from the operator on the local control plane."""

    def load(kind: str, name: str) -> dict[str, Any]:
        body: dict[str, Any] = yaml.safe_load((HEALTH / kind / "testdata" / name).read_text())
        return body

    return load
