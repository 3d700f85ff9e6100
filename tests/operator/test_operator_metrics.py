"""The operator's own metrics, read back from their registry as Prometheus would."""

from __future__ import annotations

import threading
import time

import pytest
from prometheus_client import generate_latest

from neuronfleet.devcluster.addons.metrics import Samples, parse_samples
from neuronfleet.operator.metrics import OperatorMetrics

NIS, NCA = "NeuronInferenceService", "NeuronCompiledArtifact"


class Later(Exception):
    pass


def scrape(metrics: OperatorMetrics) -> Samples:
    return parse_samples(generate_latest(metrics.registry).decode())


def test_reconciles_are_counted_by_outcome_and_timed() -> None:
    metrics = OperatorMetrics()
    with metrics.reconciling(NIS, (Later,)):
        pass
    with pytest.raises(Later), metrics.reconciling(NIS, (Later,)):
        raise Later
    with pytest.raises(KeyError), metrics.reconciling(NCA, (Later,)):
        raise KeyError("boom")
    samples = scrape(metrics)
    total = "neuronfleet_operator_reconciles_total"
    assert samples[(total, (("kind", NIS), ("outcome", "ok")))] == 1
    assert samples[(total, (("kind", NIS), ("outcome", "retry")))] == 1
    assert samples[(total, (("kind", NCA), ("outcome", "error")))] == 1
    assert (total, (("kind", NCA), ("outcome", "ok"))) not in samples
    assert samples[("neuronfleet_operator_reconcile_duration_seconds_count", (("kind", NIS),))] == 2
    assert samples[("neuronfleet_operator_reconcile_duration_seconds_count", (("kind", NCA),))] == 1


def test_full_resyncs_are_counted_by_outcome_timed_and_their_objects_summed() -> None:
    metrics = OperatorMetrics()
    resyncs = "neuronfleet_operator_resyncs_total"
    # Exported before the first pass, so a reader can wait for it to move.
    assert scrape(metrics)[(resyncs, (("outcome", "ok"),))] == 0
    with metrics.resyncing():
        metrics.resync_objects.inc(3)
    with metrics.resyncing():
        metrics.resync_objects.inc(2)
        # CPU the pass's own thread spends counts; a wait (the pass letting the event loop turn) does not.
        spent = time.thread_time()
        while time.thread_time() - spent < 0.05:
            pass
        threading.Event().wait(0.2)
    with pytest.raises(KeyError), metrics.resyncing():
        raise KeyError("the list failed")
    samples = scrape(metrics)
    assert samples[(resyncs, (("outcome", "ok"),))] == 2
    assert samples[(resyncs, (("outcome", "error"),))] == 1
    assert samples[("neuronfleet_operator_resync_duration_seconds_count", ())] == 3
    assert samples[("neuronfleet_operator_resync_objects_total", ())] == 5
    assert 0.05 <= samples[("neuronfleet_operator_resync_cpu_seconds_total", ())] < 0.2


def phase(value: str | None, **more: str) -> dict[str, str]:
    return {"phase": value, **more} if value is not None else dict(more)


def test_objects_are_counted_by_phase_and_leave_when_forgotten() -> None:
    metrics = OperatorMetrics()
    metrics.status_written(NIS, "a", "llama", {}, phase("Compiling"))
    metrics.status_written(NIS, "a", "mistral", {}, phase("Compiling"))
    metrics.status_written(NIS, "a", "llama", phase("Compiling"), phase("Ready"))
    metrics.status_written(NIS, "b", "llama", {}, phase("Ready"))
    objects = "neuronfleet_operator_objects"
    samples = scrape(metrics)
    assert samples[(objects, (("kind", NIS), ("phase", "Ready")))] == 2
    assert samples[(objects, (("kind", NIS), ("phase", "Compiling")))] == 1
    assert metrics.tracked(NIS, ["a"]) == {("a", "llama"), ("a", "mistral")}
    assert metrics.tracked(NIS, None) == {("a", "llama"), ("a", "mistral"), ("b", "llama")}
    metrics.forget(NIS, "a", "mistral")
    metrics.forget(NIS, "a", "never-seen")
    samples = scrape(metrics)
    # An emptied phase drops to 0 rather than vanishing, and every phase of each kind is there.
    assert samples[(objects, (("kind", NIS), ("phase", "Compiling")))] == 0
    assert samples[(objects, (("kind", NIS), ("phase", "Ready")))] == 2
    assert samples[(objects, (("kind", NIS), ("phase", "Blocked")))] == 0
    assert samples[(objects, (("kind", NCA), ("phase", "Failed")))] == 0


def test_a_compile_counts_once_when_its_artifact_first_reaches_an_end() -> None:
    metrics = OperatorMetrics()
    job = {"job": "x-compile"}
    metrics.status_written(NCA, "a", "x", {}, phase("Pending"))
    metrics.status_written(NCA, "a", "x", phase("Pending"), phase("Compiling", **job))
    metrics.status_written(NCA, "a", "x", phase("Compiling", **job), phase("Ready", **job))
    # Later reconciles (and a restarted operator) read Ready back from the status: no second count.
    metrics.status_written(NCA, "a", "x", phase("Ready", **job), phase("Ready", **job))
    metrics.status_written(NCA, "a", "y", phase("Compiling", **job), phase("Failed", **job))
    # An invalid spec fails without a Job: no compile ended.
    metrics.status_written(NCA, "a", "z", {}, phase("Failed"))
    # A service reaching Ready is no compile.
    metrics.status_written(NIS, "a", "svc", phase("RollingOut"), phase("Ready", **job))
    samples = scrape(metrics)
    assert samples[("neuronfleet_operator_compiles_total", (("outcome", "Ready"),))] == 1
    assert samples[("neuronfleet_operator_compiles_total", (("outcome", "Failed"),))] == 1


def test_each_operator_has_its_own_registry() -> None:
    first, second = OperatorMetrics(), OperatorMetrics()
    with first.reconciling(NIS):
        pass
    key = ("neuronfleet_operator_reconciles_total", (("kind", NIS), ("outcome", "ok")))
    assert scrape(first)[key] == 1
    assert key not in scrape(second)
