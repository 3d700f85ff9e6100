"""Kopf wiring: which changes wake which reconciler (``neuronfleet.operator.reconcilers``). No logic lives here.

- A service's spec its status has not observed yet (a new generation), and every service on the first listing
  (a start, a new leader) -> the service reconciler.
- An artifact's creation, and every artifact on the first listing -> the artifact reconciler (its compile Job);
  its deletion -> its services.
- A compile Job's events -> its artifact, then its services when the artifact's status changed.
- A service's Deployment deleted or its rollout state moved (not a condition's time), a serving pod the scheduler
  cannot place, whose engine reported a device fault, or Ready while its service holds quarantined pods -> its
  service.
- A node whose Neuron fault appeared, changed or cleared -> the services with pods on it.
- A service's deletion -> its claims on artifacts dropped (the garbage collector would, later).
- A service whose canary is progressing -> the service, every few seconds (its analysis reads the engines): the
  drive's canary passes, over the services the cache holds.
- A periodic resync reconciles everything, behind the watches.
- Every watched kind feeds the reconcilers' cache (``neuronfleet.operator.cluster.cache``), before any handler runs.

Status writes never wake a handler: services are reconciled on a generation their status has not
observed, never on their own status. Every handler is an event handler, so kopf keeps no record of its
own on the objects (no last-handled spec, no progress annotations: one write less per change), and a
failed reconcile is retried by the drive. The handlers need no finalizer: children are owned and
garbage-collected by Kubernetes. What runs a reconcile
(worker threads, retries, the resync) is ``neuronfleet.operator.runtime.drive``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from neuronfleet.contract.names import GROUP, LABEL_ARTIFACT, LABEL_INSTANCE, LABEL_QUARANTINED, LABEL_SERVICE
from neuronfleet.operator import api, plan
from neuronfleet.operator.cluster.cache import WATCHED, ObjectCache
from neuronfleet.operator.cluster.kube import ARTIFACTS, PODS, SERVICES_NIS, Resource
from neuronfleet.operator.policy import health, rollout
from neuronfleet.operator.reconcilers import Manager
from neuronfleet.operator.runtime.drive import FOLLOW_UP, SPEC_CHANGE, Drive, Progressing

Obj = dict[str, Any]


class NoChangeDetection(kopf.DiffBaseStorage):
    """kopf's record of an object's last handled state, kept nowhere and built from nothing.

    kopf copies every event's whole body to diff it for change handlers (``on.create``, ``on.update``), even
    when there are none: here there are none, so each event would pay a deep copy of a Deployment or pod for
    nothing. A change handler would find no state to diff against: the registry has none (a test checks).
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        """Nothing: no handler diffs."""
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        """Nothing was stored."""
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing to store."""


def _owner_name(body: Obj, kind: str) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == kind:
            return str(ref["name"])
    return None


def _namespaced(namespace: str | None) -> str:
    # Both kinds are namespaced; kopf types the namespace optional for cluster-scoped ones.
    if namespace is None:
        raise kopf.PermanentError("expected a namespaced object")
    return namespace


def _is_unschedulable(body: kopf.Body, **_: Any) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in body.get("status", {}).get("conditions") or []
    )


def _is_troubled(body: kopf.Body, **_: Any) -> bool:
    return _is_unschedulable(body) or health.device_fault(dict(body)) is not None


def _holds_quarantine(cache: ObjectCache, namespace: str, service: str) -> bool:
    """Whether the service has quarantined pods, which a replacement turning Ready may let go."""
    selector = f"{plan.serving_pod_selector(service)},{LABEL_QUARANTINED}"
    return bool(cache.list(PODS, namespace, selector))


def _services_on(cache: ObjectCache, node: str) -> dict[tuple[str, str], None]:
    """The services whose serving pods, quarantined ones included, run on ``node``."""
    services: dict[tuple[str, str], None] = {}
    for pod in cache.list(PODS, None, LABEL_ARTIFACT):
        labels = pod["metadata"].get("labels") or {}
        service = labels.get(LABEL_SERVICE) or labels.get(LABEL_INSTANCE)
        if pod.get("spec", {}).get("nodeName") == node and service:
            services[pod["metadata"]["namespace"], service] = None
    return services


def _canaries_progressing(cache: ObjectCache) -> list[tuple[str, str]]:
    """The services whose canary is progressing, as the watch last delivered them."""
    return [
        (body["metadata"]["namespace"], body["metadata"]["name"])
        for body in cache.list(SERVICES_NIS, None)
        if ((body.get("status") or {}).get("canary") or {}).get("phase") == "Progressing"
    ]


def _is_deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


def _is_listed_or_added(type: str | None, **_: Any) -> bool:
    # kopf gives the first listing's objects (a start, a new leader, a watch listed again) type None.
    return type in (None, "ADDED")


def spec_unobserved(body: kopf.Body, type: str | None, **_: Any) -> bool:
    """Every service on the first listing; after it, a generation the status has not observed yet."""
    if type is None:
        return True
    observed = (body.get("status") or {}).get("observedGeneration")
    return type != "DELETED" and body.get("metadata", {}).get("generation") != observed


def _kopf_names(resource: Resource) -> tuple[str, ...]:
    # kopf names a core resource by version and plural alone.
    return (
        (resource.group, resource.version, resource.plural) if resource.group else (resource.version, resource.plural)
    )


def _feed(registry: kopf.OperatorRegistry, cache: ObjectCache, resource: Resource) -> None:
    """Keep ``resource``'s objects in ``cache`` as its watch delivers them."""
    names = _kopf_names(resource)

    # An index: kopf holds every handler back until each index has its kind's first list, so no
    # reconcile starts on a half-filled cache. It stores nothing itself (the cache holds the objects).
    @kopf.index(*names, id=f"cache_{resource.plural}", registry=registry)
    async def observe(body: kopf.Body, **_: Any) -> None:
        cache.observe(dict(body))

    # Registered before the other handlers, so theirs see the cache without the deleted object.
    @kopf.on.event(*names, id=f"cache_{resource.plural}_deleted", when=_is_deleted, registry=registry)
    async def forget(body: kopf.Body, **_: Any) -> None:
        cache.forget(dict(body))


def build_registry(
    manager: Manager,
    cache: ObjectCache,
    namespaces: Sequence[str] | None,
    resync_seconds: float,
    executor: concurrent.futures.ThreadPoolExecutor,
) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers drive ``manager``'s reconcilers on ``executor``'s threads, reading what
    they watch into ``cache``."""
    registry = kopf.OperatorRegistry()
    for resource in WATCHED:
        _feed(registry, cache, resource)
    drive = Drive(manager, namespaces, resync_seconds)
    _on_lifecycle(registry, drive, executor, functools.partial(_canaries_progressing, cache))
    _on_kinds(registry, drive)
    _on_children(registry, drive, cache)
    _on_nodes(registry, drive, cache)
    return registry


def _on_lifecycle(
    registry: kopf.OperatorRegistry,
    drive: Drive,
    executor: concurrent.futures.ThreadPoolExecutor,
    canaries: Progressing,
) -> None:
    """Settings, the resync and the canaries' passes at startup, their stop at cleanup, the resync's health in
    the liveness probe."""

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Only the children the operator made are watched, filtered by the API server.
        for resource, selector in WATCHED.items():
            if selector is not None:
                settings.watching.label_selectors[resource.group or resource.version, resource.plural] = selector
        settings.posting.level = logging.WARNING
        settings.persistence.diffbase_storage = NoChangeDetection()
        settings.execution.executor = executor
        drive.start(executor, canaries)

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        drive.stop()

    @kopf.on.probe(id="resync", registry=registry)
    def resync_probe(**_: Any) -> str:
        return drive.probe()


def _on_kinds(registry: kopf.OperatorRegistry, drive: Drive) -> None:
    """The operator's own kinds: a service's spec, an artifact's creation, and either's deletion."""
    manager = drive.manager

    # Event handlers: kopf only logs what they raise, so they retry through the drive's retries.

    @kopf.on.event(GROUP, api.VERSION, SERVICES_NIS.plural, when=spec_unobserved, registry=registry)
    async def service_spec(name: str, namespace: str | None, type: str | None, **_: Any) -> None:
        """A service created, its spec changed, or listed at start -> reconcile the service (a change first)."""
        priority = FOLLOW_UP if type is None else SPEC_CHANGE
        await drive.reconcile_service(_namespaced(namespace), name, priority)

    @kopf.on.event(GROUP, api.VERSION, ARTIFACTS.plural, when=_is_listed_or_added, registry=registry)
    async def artifact_created(name: str, namespace: str | None, **_: Any) -> None:
        """An artifact created or listed at start -> reconcile the artifact, then its services if its status
        changed."""
        await drive.reconcile_artifact(_namespaced(namespace), name)

    @kopf.on.event(GROUP, api.VERSION, SERVICES_NIS.plural, when=_is_deleted, registry=registry)
    async def service_deleted(body: kopf.Body, **_: Any) -> None:
        """A service deleted -> drop its claims on artifacts (delete those nobody else uses)."""
        # Its children go with it (owner references); its artifacts go now if nobody else uses them.
        service = dict(body)
        forget = functools.partial(drive.in_worker, manager.forget_service, service)
        await drive.retries.run(("deleted service", service["metadata"]["uid"]), forget)

    @kopf.on.event(GROUP, api.VERSION, ARTIFACTS.plural, when=_is_deleted, registry=registry)
    async def artifact_deleted(body: kopf.Body, **_: Any) -> None:
        """An artifact deleted -> forget it, and reconcile its owner services."""
        # Services that still want it create it again (the store keeps compiled files).
        artifact = dict(body)
        services = await drive.in_worker(manager.forget_artifact, artifact)
        await drive.reconcile_services(artifact["metadata"]["namespace"], services)


def _on_children(registry: kopf.OperatorRegistry, drive: Drive, cache: ObjectCache) -> None:
    """What the operator made: compile Jobs wake their artifact; serving Deployments and pods, their service."""

    @kopf.on.event("batch", "v1", "jobs", labels={LABEL_ARTIFACT: kopf.PRESENT}, registry=registry)
    async def compile_job(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        """A compile Job's event -> reconcile its artifact, then its services if the artifact's status changed."""
        artifact = _owner_name(dict(body), ARTIFACTS.kind)
        if artifact is not None:
            await drive.reconcile_artifact(_namespaced(namespace), artifact)

    # The rollout state each of a service's Deployments last showed, and those whose last event moved it.
    states: dict[tuple[str | None, str], str] = {}
    moved: set[tuple[str | None, str]] = set()

    @kopf.index(
        "apps", "v1", "deployments", id="rollout_states", labels={LABEL_SERVICE: kopf.PRESENT}, registry=registry
    )
    async def rollout_state(body: kopf.Body, namespace: str | None, name: str, **_: Any) -> None:
        state = rollout.rollout_state(dict(body))
        if states.get((namespace, name)) != state:
            states[namespace, name] = state
            moved.add((namespace, name))

    def rollout_moved(type: str | None, namespace: str | None, name: str, **_: Any) -> bool:
        # Evaluated after the index took the event in. A condition's time moving wakes nothing.
        return type == "DELETED" or (namespace, name) in moved

    @kopf.on.event(
        "apps", "v1", "deployments", labels={LABEL_SERVICE: kopf.PRESENT}, when=rollout_moved, registry=registry
    )
    async def serving_deployment(body: kopf.Body, type: str | None, namespace: str | None, name: str, **_: Any) -> None:
        """A service's Deployment deleted, or its rollout state moved -> reconcile its service."""
        moved.discard((namespace, name))
        if type == "DELETED":
            states.pop((namespace, name), None)
        service = _owner_name(dict(body), SERVICES_NIS.kind)
        if service is not None:
            await drive.reconcile_service(_namespaced(namespace), service)

    def wakes_its_service(body: kopf.Body, labels: Mapping[str, str], namespace: str | None, **_: Any) -> bool:
        # A Deployment's status may tell of a Ready replacement before the pod watch does: the pod's own
        # event then finds its quarantined predecessor to let go.
        return _is_troubled(body) or (
            health.is_ready(dict(body)) and _holds_quarantine(cache, _namespaced(namespace), labels[LABEL_SERVICE])
        )

    @kopf.on.event("v1", "pods", labels={LABEL_SERVICE: kopf.PRESENT}, when=wakes_its_service, registry=registry)
    async def serving_pod(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
        """A serving pod the scheduler cannot place, whose engine reported a device fault, or Ready while its service
        holds quarantined pods -> its service."""
        await drive.reconcile_service(_namespaced(namespace), labels[LABEL_SERVICE])


def _on_nodes(registry: kopf.OperatorRegistry, drive: Drive, cache: ObjectCache) -> None:
    """Nodes' Neuron faults: an index, so every handler waits until the first list of nodes is in (a pod kept off
    a faulty node must not be let go because its node's fault is not known yet); a change wakes the services
    with pods on the node."""
    nodes = drive.manager.nodes
    changed: set[str] = set()

    @kopf.index("v1", "nodes", id="node_health", registry=registry)
    async def node_health(body: kopf.Body, **_: Any) -> None:
        if nodes.observe(dict(body)):
            changed.add(body["metadata"]["name"])

    def fault_changed(body: kopf.Body, type: str | None, **_: Any) -> bool:
        # Evaluated after the index took the event in: only changes wake a handler (and its log line).
        return type == "DELETED" or body["metadata"]["name"] in changed

    @kopf.on.event("v1", "nodes", when=fault_changed, registry=registry)
    async def node_fault_changed(body: kopf.Body, type: str | None, **_: Any) -> None:
        """A node whose Neuron fault appeared, changed or cleared -> the services with pods on it."""
        name = body["metadata"]["name"]
        was_changed = nodes.forget(name) if type == "DELETED" else name in changed
        changed.discard(name)
        if was_changed:
            for namespace, service in _services_on(cache, name):
                await drive.reconcile_service(namespace, service)
