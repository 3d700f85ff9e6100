"""The manager: one reconciler per kind, the locks, status writer and claims they share, and the resync."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence

from neuronfleet.operator import plan
from neuronfleet.operator.cluster.kube import ARTIFACTS, SERVICES_NIS, ApiError, Kube
from neuronfleet.operator.metrics import OperatorMetrics
from neuronfleet.operator.reconcilers.artifact import ArtifactReconciler
from neuronfleet.operator.reconcilers.autoscaling import Autoscaler
from neuronfleet.operator.reconcilers.claims import ArtifactClaims
from neuronfleet.operator.reconcilers.common import Emit, Obj, RetryLater
from neuronfleet.operator.reconcilers.devices import NeuronDevices
from neuronfleet.operator.reconcilers.locks import KeyedLocks
from neuronfleet.operator.reconcilers.node_health import NodeHealth
from neuronfleet.operator.reconcilers.routing import Router
from neuronfleet.operator.reconcilers.scale_in import ScaleIn
from neuronfleet.operator.reconcilers.service import DEFAULT_ARTIFACT_HISTORY_LIMIT, ServiceReconciler
from neuronfleet.operator.reconcilers.status_writer import StatusWriter

log = logging.getLogger(__name__)

#: The longest a resync waits between two objects for event-driven reconciles to finish.
EVENTS_FIRST_TIMEOUT_S = 1.0


class Manager:
    """What the handlers drive: each kind's reconciler, and the periodic resync of all; safe from many threads."""

    def __init__(
        self,
        kube: Kube,
        emit: Emit,
        metrics: OperatorMetrics | None = None,
        prometheus: str | None = None,
        *,
        router_images: plan.RouterImages | None = None,
        artifact_history_limit: int = DEFAULT_ARTIFACT_HISTORY_LIMIT,
        devices: NeuronDevices | None = None,
        start_time_scale: float = 1.0,
        events_first_timeout: float = EVENTS_FIRST_TIMEOUT_S,
    ) -> None:
        self.kube = kube
        self.metrics = metrics if metrics is not None else OperatorMetrics()
        # One reconcile per object at a time: triggers from several watches may overlap.
        self.locks = KeyedLocks()
        #: The Neuron faults nodes carry, fed by the node watch.
        self.nodes = NodeHealth()
        status = StatusWriter(kube, emit, self.metrics)
        self.services = ServiceReconciler(
            kube,
            status,
            ArtifactClaims(kube, emit),
            Autoscaler(kube, prometheus),
            Router(kube, router_images or plan.RouterImages()),
            self.locks,
            self.metrics,
            self.nodes,
            artifact_history_limit=artifact_history_limit,
            devices=devices,
            scale_in=ScaleIn(kube, prometheus),
            start_time_scale=start_time_scale,
        )
        self.artifacts = ArtifactReconciler(kube, emit, status, self.locks, self.metrics)
        # Event-driven reconciles running now: a resync lets them finish before its next object.
        self._events = 0
        self._events_done = threading.Condition()
        self._events_first_timeout = events_first_timeout

    def reconcile_service(self, namespace: str, name: str) -> None:
        """Bring one NeuronInferenceService's artifact, children and status to what its spec asks."""
        with self._event():
            self.services.reconcile(namespace, name)

    def forget_service(self, service: Obj) -> None:
        """A deleted service's claims on artifacts, dropped now (the garbage collector would, later)."""
        with self._event():
            self.services.forget(service)

    def reconcile_artifact(self, namespace: str, name: str) -> list[str]:
        """Run an artifact's compile Job once and mirror it into its status; the services to reconcile now."""
        with self._event():
            return self.artifacts.reconcile(namespace, name)

    def forget_artifact(self, artifact: Obj) -> list[str]:
        """A deleted artifact leaves the metrics; its services, to reconcile now."""
        with self._event():
            return self.artifacts.forget(artifact)

    def resync(self, namespaces: Sequence[str] | None, between: Callable[[], None] = lambda: None) -> int:
        """Reconcile everything in ``namespaces`` (all when ``None``): the safety net behind the watches.

        An object whose reconcile fails is left for the next pass; a list that fails ends the pass
        (:class:`ApiError`). Artifacts go first, so their services see what changed in the same pass.
        Events go before the pass: before each object it calls ``between`` (the operator's lets its event
        loop take the watch events in), then waits until no event-driven reconcile runs (at most
        ``events_first_timeout``), so a change never waits for a pass over a thousand services.
        Returns how many objects it reconciled.
        """
        with self.metrics.resyncing():
            return self._resync(namespaces, between)

    @contextlib.contextmanager
    def _event(self) -> Iterator[None]:
        with self._events_done:
            self._events += 1
        try:
            yield
        finally:
            with self._events_done:
                self._events -= 1
                self._events_done.notify_all()

    def _events_first(self, between: Callable[[], None]) -> None:
        between()
        with self._events_done:
            self._events_done.wait_for(lambda: self._events == 0, timeout=self._events_first_timeout)

    def _resync(self, namespaces: Sequence[str] | None, between: Callable[[], None]) -> int:
        count = 0
        # Objects counted before the lists and missing from them were deleted unseen (e.g. in a watch gap).
        counted = {kind: self.metrics.tracked(kind, namespaces) for kind in (ARTIFACTS.kind, SERVICES_NIS.kind)}
        listed: dict[str, set[tuple[str, str]]] = {ARTIFACTS.kind: set(), SERVICES_NIS.kind: set()}
        for namespace in namespaces if namespaces is not None else [None]:
            # Behind a cache, a fresh list first: it drops objects whose deletion a watch gap hid.
            self.kube.relist(namespace)
            for artifact in self.kube.list(ARTIFACTS, namespace):
                meta = artifact["metadata"]
                listed[ARTIFACTS.kind].add((meta["namespace"], meta["name"]))
                self._events_first(between)
                count += self._resynced(self.artifacts.reconcile, meta["namespace"], meta["name"])
            for service in self.kube.list(SERVICES_NIS, namespace):
                meta = service["metadata"]
                listed[SERVICES_NIS.kind].add((meta["namespace"], meta["name"]))
                self._events_first(between)
                count += self._resynced(self.services.reconcile, meta["namespace"], meta["name"])
        for kind, keys in counted.items():
            for namespace, name in keys - listed[kind]:
                self.metrics.forget(kind, namespace, name)
        return count

    def _resynced(self, reconcile: Callable[[str, str], object], namespace: str, name: str) -> int:
        """1 once ``reconcile`` succeeded, counted as it happens (as event-driven reconciles are); 0 if it failed."""
        try:
            reconcile(namespace, name)
        except (ApiError, RetryLater) as error:
            log.warning("resync of %s/%s failed, retried next pass: %s", namespace, name, error)
            return 0
        self.metrics.resync_objects.inc()
        return 1
