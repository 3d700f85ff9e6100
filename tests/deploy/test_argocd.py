"""Argo CD: the Lua health checks (upstream layout, run in Lua 5.1) and the example Applications."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ARGOCD = ROOT / "argocd"
HEALTH = ARGOCD / "resource_customizations" / "neuronfleet.io"
KINDS = ["NeuronInferenceService", "NeuronCompiledArtifact"]

Health = Callable[[str, dict[str, Any]], dict[str, str]]


def health_tests(kind: str) -> list[dict[str, Any]]:
    tests: list[dict[str, Any]] = yaml.safe_load((HEALTH / kind / "health_test.yaml").read_text())["tests"]
    return tests


@pytest.mark.parametrize(
    ("kind", "case"),
    [(kind, case) for kind in KINDS for case in health_tests(kind)],
    ids=[f"{kind}-{Path(case['inputPath']).stem}" for kind in KINDS for case in health_tests(kind)],
)
def test_health_check_as_argo_cd_runs_it(kind: str, case: dict[str, Any], argo_health: Health) -> None:
    obj = yaml.safe_load((HEALTH / kind / case["inputPath"]).read_text())
    assert argo_health(kind, obj) == case["healthStatus"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_testdata_file_is_tested(kind: str) -> None:
    used = {Path(case["inputPath"]).name for case in health_tests(kind)}
    assert used == {p.name for p in (HEALTH / kind / "testdata").glob("*.yaml")}


def test_service_health_covers_the_issue_cases() -> None:
    """Progressing while observedGeneration lags or compiling, Healthy when Ready, Degraded on failed compiles and
    while a Neuron fault leaves the fleet short; Healthy again once it is whole."""
    by_input = {Path(c["inputPath"]).stem: c["healthStatus"]["status"] for c in health_tests("NeuronInferenceService")}
    assert by_input["generation-lag"] == "Progressing"
    assert by_input["compiling"] == "Progressing"
    assert by_input["ready"] == "Healthy"
    assert by_input["compile-failed"] == "Degraded"
    assert by_input["blocked"] == "Degraded"
    assert by_input["device-fault"] == "Degraded"
    assert by_input["faulty-node-avoided"] == "Healthy"


def test_generation_lag_wins_over_a_stale_ready(argo_health: Health, captured: Callable[..., dict[str, Any]]) -> None:
    ready = captured("NeuronInferenceService", "ready.yaml")
    assert argo_health("NeuronInferenceService", ready)["status"] == "Healthy"
    ready["metadata"]["generation"] += 1
    assert argo_health("NeuronInferenceService", ready) == {
        "status": "Progressing",
        "message": f"Waiting for the operator to act on generation {ready['metadata']['generation']}",
    }


def test_argocd_cm_patch_carries_the_scripts_verbatim() -> None:
    data = yaml.safe_load((ARGOCD / "argocd-cm-health.yaml").read_text())["data"]
    scripts = sorted((ARGOCD / "resource_customizations").glob("*/*/health.lua"))
    # Ours, and the Application check an app of apps needs to wait for each wave.
    assert {(p.parent.parent.name, p.parent.name) for p in scripts} == {
        *(("neuronfleet.io", kind) for kind in KINDS),
        ("argoproj.io", "Application"),
    }
    assert data == {
        f"resource.customizations.health.{p.parent.parent.name}_{p.parent.name}": p.read_text() for p in scripts
    }


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, "Progressing"),
        # Just created: Argo CD says Healthy before its first sync applied anything.
        ({"health": {"status": "Healthy"}, "sync": {"status": "OutOfSync"}}, "Progressing"),
        ({"health": {"status": "Healthy"}}, "Progressing"),
        ({"health": {"status": "Healthy"}, "sync": {"status": "Synced"}}, "Healthy"),
        ({"health": {"status": "Progressing"}, "sync": {"status": "Synced"}}, "Progressing"),
        ({"health": {"status": "Degraded", "message": "compile failed"}, "sync": {"status": "Synced"}}, "Degraded"),
    ],
)
def test_application_health_is_healthy_only_once_synced(
    status: dict[str, Any] | None, expected: str, application_health: Callable[[dict[str, Any]], dict[str, str]]
) -> None:
    obj: dict[str, Any] = {"metadata": {"name": "neuronfleet-crds"}}
    if status is not None:
        obj["status"] = status
    assert application_health(obj)["status"] == expected


def applications() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all((ARGOCD / "applications.yaml").read_text())}


def test_applications_sync_crds_first_then_the_operator_then_services() -> None:
    apps = applications()
    wave = {name: int(app["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]) for name, app in apps.items()}
    assert wave["neuronfleet-crds"] < wave["neuronfleet-operator"] < wave["neuronfleet-services"]
    for name, app in apps.items():
        assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"], name
        source = app["spec"]["source"]
        assert (ROOT / source["path"]).is_dir(), f"{name}: no {source['path']} in the repository"
    assert apps["neuronfleet-crds"]["spec"]["source"]["path"] == "crds"
    assert apps["neuronfleet-crds"]["spec"]["syncPolicy"]["automated"]["prune"] is False
    # The CRDs Application owns them: the chart must not install a second copy.
    assert apps["neuronfleet-operator"]["spec"]["source"]["helm"]["skipCrds"] is True
    services = apps["neuronfleet-services"]["spec"]
    assert "SkipDryRunOnMissingResource=true" in services["syncPolicy"]["syncOptions"]
    assert (ROOT / services["source"]["path"] / services["source"]["directory"]["include"]).is_file()


def test_application_helm_values_pass_the_chart_schema(
    helm: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    values = applications()["neuronfleet-operator"]["spec"]["source"]["helm"]["valuesObject"]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    rendered = helm("template", "neuronfleet", str(ROOT / "charts" / "neuronfleet"), "--values", str(path))
    assert rendered.returncode == 0, rendered.stderr
