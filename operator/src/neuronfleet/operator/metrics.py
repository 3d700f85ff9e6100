"""The operator's own Prometheus metrics: what it reconciled, how long that took, where objects stand.

Series (all prefixed ``neuronfleet_operator_``):

- ``reconciles_total{kind, outcome}``: reconciles run; ``outcome`` is ``ok``, ``retry`` (the
  cluster was mid-change) or ``error``; both are retried as ``retries.py`` says.
- ``reconcile_duration_seconds{kind}``: how long each took, reads and writes included.
- ``compiles_total{outcome}``: compile Jobs that ended, ``Ready`` or ``Failed``, counted when the
  artifact's stored status first says so (so a restarted operator does not count them again; a
  retried compile is a new Job and counts again).
- ``objects{kind, phase}``: services and artifacts by ``status.phase``, as last reconciled; every
  phase of each kind is exported, 0 when empty, so graphs and alerts see it drop.
- ``resyncs_total{outcome}``: full resyncs (the periodic pass over everything) that ended; ``ok``, or
  ``error`` when a list failed and ended the pass early.
- ``resync_duration_seconds``: how long each full resync took.
- ``resync_objects_total``: objects the full resyncs reconciled (one that failed counts next pass).
- ``resync_cpu_seconds_total``: CPU time the full resyncs spent, on the thread each runs on: what the safety net
  costs, apart from what the changes cost.
- ``quarantined_replicas_total{fault}``: serving pods taken out of service for a Neuron fault, ``device``
  (their engine reported it) or ``node`` (their node's condition did).
- ``queue_wait_seconds{priority}``: how long each reconcile asked for waited for a worker, ``spec_change`` (a
  service's spec changed: what moves its ``observedGeneration``) or ``follow_up`` (what the children's events,
  the artifacts and the resyncs wake); one that joined a reconcile of the same object still waiting counts
  until that one began.
- ``leader``: 1 while this process reconciles, 0 while it stands by for the Lease (``leadership.py``).

``kind`` is ``NeuronInferenceService`` or ``NeuronCompiledArtifact``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from neuronfleet.operator.api import ArtifactPhase, ServicePhase
from neuronfleet.operator.cluster.kube import ARTIFACTS, SERVICES_NIS

#: Reconciles take milliseconds to a few seconds (a slow API server, a large namespace).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: A full resync takes from a fraction of a second (a few services) to minutes (a thousand, on 2 cores).
RESYNC_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: A reconcile waits for a worker from nothing (one is free) to seconds (eight busy under a stream of changes).
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Series names, for readers of ``/metrics`` (tests, the bench) as much as for the registry.
QUEUE_WAIT = "neuronfleet_operator_queue_wait_seconds"
RESYNCS = "neuronfleet_operator_resyncs"
RESYNC_DURATION = "neuronfleet_operator_resync_duration_seconds"
RESYNC_OBJECTS = "neuronfleet_operator_resync_objects"
RESYNC_CPU = "neuronfleet_operator_resync_cpu_seconds"
QUARANTINED = "neuronfleet_operator_quarantined_replicas"
LEADER = "neuronfleet_operator_leader"
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
        self.resyncs = Counter(
            RESYNCS, "Full resyncs that ended, by outcome (ok, error).", ["outcome"], registry=self.registry
        )
        for outcome in ("ok", "error"):
            self.resyncs.labels(outcome)  # exported as 0 before the first pass
        self.resync_duration = Histogram(
            RESYNC_DURATION, "Seconds per full resync.", buckets=RESYNC_BUCKETS, registry=self.registry
        )
        self.resync_objects = Counter(RESYNC_OBJECTS, "Objects reconciled by full resyncs.", registry=self.registry)
        self.resync_cpu = Counter(
            RESYNC_CPU, "CPU seconds the full resyncs spent on their own thread.", registry=self.registry
        )
        self.quarantined = Counter(
            QUARANTINED,
            "Serving pods taken out of service for a Neuron fault, by where it was seen (device, node).",
            ["fault"],
            registry=self.registry,
        )
        for fault in ("device", "node"):
            self.quarantined.labels(fault)
        self.queue_wait = Histogram(
            QUEUE_WAIT,
            "Seconds a reconcile waited for a worker, by priority (spec_change, follow_up).",
            ["priority"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.leader = Gauge(
            LEADER, "1 while this operator reconciles, 0 while it stands by for the Lease.", registry=self.registry
        )
        self._lock = threading.Lock()
        self._phases: dict[tuple[str, str, str], str] = {}
        self.registry.register(_PhaseCollector(self))

    def reconciling(
        self, kind: str, retryable: tuple[type[Exception], ...] = ()
    ) -> contextlib.AbstractContextManager[None]:
        """Time one reconcile of ``kind`` and count its outcome (``retryable`` errors: retry); errors pass through."""
        return _timed(
            lambda outcome: self.reconciles.labels(kind, outcome), self.reconcile_duration.labels(kind), retryable
        )

    @contextlib.contextmanager
    def resyncing(self) -> Iterator[None]:
        """Time one full resync, which runs on the calling thread, count its outcome and its CPU time; errors pass
        through."""
        cpu = time.thread_time()
        try:
            with _timed(self.resyncs.labels, self.resync_duration):
                yield
        finally:
            self.resync_cpu.inc(time.thread_time() - cpu)

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


@contextlib.contextmanager
def _timed(
    outcomes: Callable[[str], Counter], duration: Histogram, retryable: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """Observe the block's duration, then count its outcome: ``ok``, ``retry`` (``retryable``) or ``error``."""
    start = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    except retryable:
        outcome = "retry"
        raise
    finally:
        duration.observe(time.perf_counter() - start)
        outcomes(outcome).inc()
