"""The operator's own Prometheus metrics: what it reconciled, how long that took, where objects stand.

Series (all prefixed ``neuronfleet_operator_``):

- ``reconciles_total{kind, outcome}``: reconciles run; ``outcome`` is ``ok``, ``retry`` (the
  cluster was mid-change) or ``error`` (kopf retries it with backoff).
- ``reconcile_duration_seconds{kind}``: how long each took, reads and writes included.
- ``compiles_total{outcome}``: compile Jobs that ended, ``Ready`` or ``Failed``, counted when the
  artifact's stored status first says so (so a restarted operator does not count them again; a
  retried compile is a new Job and counts again).
- ``objects{kind, phase}``: services and artifacts by ``status.phase``, as last reconciled; every
  phase of each kind is exported, 0 when empty, so graphs and alerts see it drop.

``kind`` is ``NeuronInferenceService`` or ``NeuronCompiledArtifact``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter as Tally
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from neuronfleet.operator.api import ArtifactPhase, ServicePhase
from neuronfleet.operator.kube import ARTIFACTS, SERVICES_NIS

#: Reconciles take milliseconds to a few seconds (a slow API server, a large namespace).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Artifact phases that end a compile.
COMPILE_OUTCOMES = frozenset({"Ready", "Failed"})
#: Every phase of each kind, exported even when no object is in it.
PHASES: dict[str, tuple[str, ...]] = {
    SERVICES_NIS.kind: get_args(ServicePhase),
    ARTIFACTS.kind: get_args(ArtifactPhase),
}


class _PhaseCollector(Collector):
    """``objects{kind, phase}``, counted at scrape time from the phases last seen."""

    def __init__(self, metrics: OperatorMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "neuronfleet_operator_objects",
            "Objects by kind and status.phase, as last reconciled.",
            labels=["kind", "phase"],
        )
        counts = self._metrics.phase_counts()
        for kind, phases in PHASES.items():
            for phase in phases:
                family.add_metric([kind, phase], counts.get((kind, phase), 0))
        yield family


class OperatorMetrics:
    """The operator's metrics, in their own registry (so tests and several operators never share one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "neuronfleet_operator_reconciles",
            "Reconciles run, by kind and outcome (ok, retry, error).",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.reconcile_duration = Histogram(
            "neuronfleet_operator_reconcile_duration_seconds",
            "Seconds per reconcile, by kind.",
            ["kind"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.compiles = Counter(
            "neuronfleet_operator_compiles",
            "Compile Jobs that ended, by outcome (Ready, Failed).",
            ["outcome"],
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str, str], str] = {}
        self.registry.register(_PhaseCollector(self))

    @contextlib.contextmanager
    def reconciling(self, kind: str, retryable: tuple[type[Exception], ...] = ()) -> Iterator[None]:
        """Time one reconcile of ``kind`` and count its outcome (``retryable`` errors: retry); errors pass through."""
        start = time.perf_counter()
        outcome = "error"
        try:
            yield
            outcome = "ok"
        except retryable:
            outcome = "retry"
            raise
        finally:
            self.reconcile_duration.labels(kind).observe(time.perf_counter() - start)
            self.reconciles.labels(kind, outcome).inc()

    def status_written(
        self, kind: str, namespace: str, name: str, old: Mapping[str, Any], new: Mapping[str, Any]
    ) -> None:
        """Record an object's phase from the status it now has; count a compile Job that just ended."""
        phase = new.get("phase")
        with self._lock:
            if phase is None:
                self._phases.pop((kind, namespace, name), None)
            else:
                self._phases[(kind, namespace, name)] = str(phase)
        # A compile ended when a Job ran (an invalid spec fails without one) and the phase just changed.
        if kind == ARTIFACTS.kind and phase in COMPILE_OUTCOMES and new.get("job") and old.get("phase") != phase:
            self.compiles.labels(phase).inc()

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """A deleted object leaves the phase counts."""
        with self._lock:
            self._phases.pop((kind, namespace, name), None)

    def tracked(self, kind: str, namespaces: Collection[str] | None) -> set[tuple[str, str]]:
        """The (namespace, name) of every ``kind`` object counted, in ``namespaces`` (all when ``None``)."""
        with self._lock:
            return {
                (namespace, name)
                for (k, namespace, name) in self._phases
                if k == kind and (namespaces is None or namespace in namespaces)
            }

    def phase_counts(self) -> dict[tuple[str, str], int]:
        """How many objects of each kind are in each phase."""
        with self._lock:
            return dict(Tally((kind, phase) for (kind, _, _), phase in self._phases.items()))
