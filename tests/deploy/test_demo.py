"""``make demo``: the stages it shows (from captured objects), and one whole run with --exit-when-ready."""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from harness.programs import run_program

from neuronfleet.devcluster.cluster import LocalCluster
from neuronfleet.devcluster.demo import DEFAULT_EXAMPLE, paced, store_claim
from neuronfleet.devcluster.demo_view import headline, stages
from neuronfleet.devcluster.kwok import COMPLETE_AFTER_ANNOTATION, READY_AFTER_ANNOTATION
from neuronfleet.devcluster.processes import SCRIPTS

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "NeuronInferenceService"
ARTIFACT = "NeuronCompiledArtifact"
NOW = datetime.datetime(2026, 11, 30, 2, 3, 30, tzinfo=datetime.UTC)

Captured = Callable[[str, str], dict[str, Any]]


def states(service: dict[str, Any] | None, artifact: dict[str, Any] | None = None) -> dict[str, str]:
    return {s.name: s.state for s in stages(service, artifact, NOW)}


def test_stages_follow_the_service_from_apply_to_ready(captured: Captured) -> None:
    assert states(captured(SERVICE, "no-status.yaml")) == {
        "Validated": "active",
        "Compiling": "waiting",
        "Rolling out": "waiting",
        "Ready": "waiting",
    }
    compiling = stages(captured(SERVICE, "compiling.yaml"), captured(ARTIFACT, "compiling.yaml"), NOW)
    assert [s.state for s in compiling] == ["done", "active", "waiting", "waiting"]
    assert headline(compiling) == "Compiling"
    # Progress: buckets compiled, the Job's attempt, time since the Job started.
    assert "0/9 buckets compiled" in compiling[1].detail
    assert "attempt 1 of 3" in compiling[1].detail
    assert compiling[1].detail.endswith(" s")
    assert states(captured(SERVICE, "rolling-out.yaml"), captured(ARTIFACT, "ready.yaml")) == {
        "Validated": "done",
        "Compiling": "done",
        "Rolling out": "active",
        "Ready": "waiting",
    }
    ready = stages(captured(SERVICE, "ready.yaml"), captured(ARTIFACT, "ready.yaml"), NOW)
    assert [s.state for s in ready] == ["done"] * 4
    assert ready[2].detail.startswith("2/2 replicas ready")


def test_stages_show_what_stops_the_way_to_ready(captured: Captured) -> None:
    failed = stages(captured(SERVICE, "compile-failed.yaml"), captured(ARTIFACT, "failed.yaml"), NOW)
    assert [s.state for s in failed] == ["done", "failed", "waiting", "waiting"]
    assert "BackoffLimitExceeded" in failed[1].detail
    blocked = states(captured(SERVICE, "blocked.yaml"), captured(ARTIFACT, "failed.yaml"))
    assert blocked["Compiling"] == "failed"
    assert states(captured(SERVICE, "invalid.yaml"))["Validated"] == "failed"
    # A spec the operator has not acted on yet is not shown as the old one's outcome.
    assert states(captured(SERVICE, "generation-lag.yaml"))["Validated"] == "active"


def test_pacing_touches_only_pod_annotations() -> None:
    example = yaml.safe_load((ROOT / DEFAULT_EXAMPLE).read_text())
    body = paced(example)
    assert body["spec"]["podAnnotations"][READY_AFTER_ANNOTATION]
    assert body["spec"]["compile"]["podAnnotations"][COMPLETE_AFTER_ANNOTATION]
    for spec in (body["spec"], example["spec"]):
        spec.pop("podAnnotations", None)
        spec["compile"].pop("podAnnotations", None)
    assert body == example


def test_the_store_claim_comes_from_a_pvc_store_alone() -> None:
    example = yaml.safe_load((ROOT / DEFAULT_EXAMPLE).read_text())
    assert example["spec"]["compile"]["artifactStore"] == "pvc://neuronfleet-artifacts/neff"
    assert store_claim(example) == "neuronfleet-artifacts"
    example["spec"]["compile"]["artifactStore"] = "s3://bucket/neff"
    assert store_claim(example) is None


def test_demo_reaches_ready_and_tears_down() -> None:
    name = f"demo-test-{os.getpid()}"
    ran = run_program(
        [str(SCRIPTS / "neuronfleet-dev"), "demo", "--exit-when-ready", "--no-pace", "--name", name],
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    output = ran.stdout + ran.stderr
    assert ran.returncode == 0, output
    lines = output.splitlines()

    def at(text: str) -> int:
        found = [i for i, line in enumerate(lines) if text in line]
        assert found, f"no {text!r} in:\n{output}"
        return found[0]

    # The stages, in order, each reached; the chart installed; the operator under the chart's account.
    order = [at("helm install neuronfleet"), at("operator running as serviceaccount neuronfleet-system/neuronfleet")]
    order += [at(f"✓ {stage}") for stage in ("Validated", "Compiling", "Rolling out", "Ready")]
    assert order == sorted(order), output
    assert "Compiling  llama-3-1-8b-instruct-" in output
    assert f"kubectl --kubeconfig /tmp/neuronfleet-{name}-" in output
    assert "get neuron -n demo" in output
    assert at("done: every process stopped") > order[-1]
    assert LocalCluster.find(name) is None, "the demo left its cluster behind"
