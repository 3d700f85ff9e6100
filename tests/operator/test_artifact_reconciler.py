"""The artifact reconciler's decision: when to start a compile Job, and whom to tell of a status change."""

from __future__ import annotations

from typing import Any

from neuronfleet.operator import api
from neuronfleet.operator.reconcilers.artifact import CompileAction, compile_action, owner_services

READY = api.NeuronCompiledArtifactStatus(phase="Ready")
COMPILING = api.NeuronCompiledArtifactStatus(phase="Compiling")


def job(**metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": "model-abc-compile", **metadata}}


def test_a_compile_starts_only_without_a_job_and_before_the_artifact_is_ready() -> None:
    assert compile_action(None, COMPILING) is CompileAction.START
    assert compile_action(None, api.NeuronCompiledArtifactStatus()) is CompileAction.START
    # A compiled artifact whose Job was cleaned up is not compiled again.
    assert compile_action(None, READY) is CompileAction.FOLLOW
    assert compile_action(job(), COMPILING) is CompileAction.FOLLOW


def test_a_job_being_deleted_is_waited_for() -> None:
    deleting = job(deletionTimestamp="2026-12-02T12:00:00Z")
    assert compile_action(deleting, READY) is CompileAction.WAIT_FOR_DELETION
    assert compile_action(deleting, COMPILING) is CompileAction.WAIT_FOR_DELETION


def test_owner_services_are_the_services_among_the_owners() -> None:
    refs = [
        {"kind": "NeuronInferenceService", "name": "a", "uid": "1"},
        {"kind": "ConfigMap", "name": "x", "uid": "2"},
        {"kind": "NeuronInferenceService", "name": "b", "uid": "3"},
    ]
    assert owner_services({"metadata": {"ownerReferences": refs}}) == ["a", "b"]
    assert owner_services({"metadata": {}}) == []
