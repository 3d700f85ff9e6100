"""Kopf wiring: which changes wake which reconciler (``neuronfleet.operator.reconcilers``). No logic lives here.

- A service's spec (create, update, resume after a restart) -> the service reconciler.
- An artifact's creation or resume -> the artifact reconciler (its compile Job); its deletion -> its services.
- A compile Job's events -> its artifact, then its services when the artifact's status changed.
- A serving Deployment's events, a serving pod the scheduler cannot place, whose engine reported a device
  fault, or Ready while its service holds quarantined pods -> its service.
- A node whose Neuron fault appeared, changed or cleared -> the services with pods on it.
- A service's deletion -> its claims on artifacts dropped (the garbage collector would, later).
- A periodic resync reconciles everything, behind the watches.
- Every watched kind feeds the reconcilers' cache (``neuronfleet.operator.cache``), before any handler runs.

Status writes never wake a handler: services and artifacts are reconciled on
spec changes (``field="spec"``), never on their own status. The handlers need no
finalizer: children are owned and garbage-collected by Kubernetes. Every handler
retries what fails retryably (``neuronfleet.operator.retries``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import kopf

from neuronfleet.engine.names import GROUP, LABEL_ARTIFACT, LABEL_QUARANTINED, LABEL_SERVICE
from neuronfleet.operator import api, health, plan
from neuronfleet.operator.cache import WATCHED, ObjectCache
from neuronfleet.operator.kube import ARTIFACTS, PODS, SERVICES_NIS, Resource
from neuronfleet.operator.reconcilers import Manager
from neuronfleet.operator.retries import Retries, or_temporary_error

Obj = dict[str, Any]
T = TypeVar("T")

#: kopf's own bookkeeping (handler progress, last-handled spec) under the operator's prefix, its API group.
ANNOTATION_PREFIX = GROUP

log = logging.getLogger(__name__)

#: The longest a resync waits, between two objects, for the event loop to take one turn.
RESYNC_YIELD_TIMEOUT_S = 1.0


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


def _is_ready(body: kopf.Body) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in body.get("status", {}).get("conditions") or []
    )


def _holds_quarantine(cache: ObjectCache, namespace: str, service: str) -> bool:
    """Whether the service has quarantined pods, which a replacement turning Ready may let go."""
    selector = f"{plan.serving_pod_selector(service)},{LABEL_QUARANTINED}"
    return bool(cache.list(PODS, namespace, selector))


def _services_on(cache: ObjectCache, node: str) -> dict[tuple[str, str], None]:
    """The services whose serving pods, quarantined ones included, run on ``node``."""
    services: dict[tuple[str, str], None] = {}
    for pod in cache.list(PODS, None, LABEL_ARTIFACT):
        labels = pod["metadata"].get("labels") or {}
        service = labels.get(LABEL_SERVICE) or labels.get("app.kubernetes.io/instance")
        if pod.get("spec", {}).get("nodeName") == node and service:
            services[pod["metadata"]["namespace"], service] = None
    return services


def _is_deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


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
    manager: Manager, cache: ObjectCache, namespaces: Sequence[str] | None, resync_seconds: float
) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers drive ``manager``'s reconcilers, reading what they watch into ``cache``."""
    registry = kopf.OperatorRegistry()
    for resource in WATCHED:
        _feed(registry, cache, resource)
    state: dict[str, Any] = {"last_resync": None}
    retries = Retries()

    async def in_worker(call: Callable[..., T], *args: Any) -> T:
        # On kopf's worker threads (settings.execution.max_workers), where its sync handlers run.
        return await asyncio.get_running_loop().run_in_executor(state["executor"], functools.partial(call, *args))

    async def reconcile_service(namespace: str, name: str) -> None:
        reconcile = functools.partial(in_worker, manager.reconcile_service, namespace, name)
        await retries.run(("service", namespace, name), reconcile)

    async def reconcile_services(namespace: str, names: Sequence[str]) -> None:
        # Each on its own: one that fails is retried alone.
        for name in names:
            await reconcile_service(namespace, name)

    async def reconcile_artifact(namespace: str, name: str) -> None:
        async def run() -> None:
            await reconcile_services(namespace, await in_worker(manager.reconcile_artifact, namespace, name))

        await retries.run(("artifact", namespace, name), run)

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        # Only the children the operator made are watched, filtered by the API server.
        for resource, selector in WATCHED.items():
            if selector is not None:
                settings.watching.label_selectors[resource.group or resource.version, resource.plural] = selector
        settings.posting.level = logging.WARNING
        settings.execution.max_workers = 8
        state["executor"] = settings.execution.executor
        state["resync"] = asyncio.create_task(resync_forever())

    async def resync_forever() -> None:
        # Every resync_seconds -> reconcile every artifact, then every service.
        loop = asyncio.get_running_loop()

        def one_turn_of_the_loop() -> None:
            # The pass's thread waits while the loop takes in what the watches delivered meanwhile: without
            # it the loop would fight the pass for the GIL, and a change would wait out the whole pass.
            # Bounded, and a closed loop passed over: the pass must not outlive the operator's stop.
            with contextlib.suppress(RuntimeError, TimeoutError):
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=RESYNC_YIELD_TIMEOUT_S)

        while True:
            await asyncio.sleep(resync_seconds)
            try:
                count = await asyncio.to_thread(manager.resync, namespaces, one_turn_of_the_loop)
            except Exception:  # the loop must outlive any one failure; the next pass retries
                log.exception("resync failed")
            else:
                state["last_resync"] = datetime.datetime.now(datetime.UTC)
                log.info("resync done: %d objects reconciled", count)
            # What the cache holds now is long-lived: out of the cyclic collector's way, whose full passes over
            # a thousand services' objects would otherwise stall the event loop for a tenth of a second. Collected
            # first, so no garbage cycle is frozen for good; that pass covers only what the last freeze left.
            gc.collect()
            gc.freeze()

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        task = state.get("resync")
        if task is not None:
            task.cancel()
        retries.cancel()

    @kopf.on.probe(id="resync", registry=registry)
    def resync_probe(**_: Any) -> str:
        last = state["last_resync"]
        if last is not None and datetime.datetime.now(datetime.UTC) - last > datetime.timedelta(
            seconds=5 * resync_seconds
        ):
            raise RuntimeError(f"no successful resync since {last.isoformat()}")
        return last.isoformat() if last is not None else "pending"

    # Change handlers: kopf retries what they raise, after the delay they name.

    @kopf.on.resume(GROUP, api.VERSION, SERVICES_NIS.plural, registry=registry)
    @kopf.on.create(GROUP, api.VERSION, SERVICES_NIS.plural, registry=registry)
    @kopf.on.update(GROUP, api.VERSION, SERVICES_NIS.plural, field="spec", registry=registry)
    async def service_spec(name: str, namespace: str | None, **_: Any) -> None:
        """A service created, its spec updated, or resumed after a restart -> reconcile the service."""
        await or_temporary_error(in_worker(manager.reconcile_service, _namespaced(namespace), name))

    @kopf.on.resume(GROUP, api.VERSION, ARTIFACTS.plural, registry=registry)
    @kopf.on.create(GROUP, api.VERSION, ARTIFACTS.plural, registry=registry)
    async def artifact_created(name: str, namespace: str | None, **_: Any) -> None:
        """An artifact created or resumed -> reconcile the artifact, then its services if its status changed."""
        namespace = _namespaced(namespace)
        services = await or_temporary_error(in_worker(manager.reconcile_artifact, namespace, name))
        await reconcile_services(namespace, services)

    # Event handlers: kopf only logs what they raise, so they retry through `retries`.

    @kopf.on.event(GROUP, api.VERSION, SERVICES_NIS.plural, when=_is_deleted, registry=registry)
    async def service_deleted(body: kopf.Body, **_: Any) -> None:
        """A service deleted -> drop its claims on artifacts (delete those nobody else uses)."""
        # Its children go with it (owner references); its artifacts go now if nobody else uses them.
        service = dict(body)
        forget = functools.partial(in_worker, manager.forget_service, service)
        await retries.run(("deleted service", service["metadata"]["uid"]), forget)

    @kopf.on.event(GROUP, api.VERSION, ARTIFACTS.plural, when=_is_deleted, registry=registry)
    async def artifact_deleted(body: kopf.Body, **_: Any) -> None:
        """An artifact deleted -> forget it, and reconcile its owner services."""
        # Services that still want it create it again (the store keeps compiled files).
        artifact = dict(body)
        services = await in_worker(manager.forget_artifact, artifact)
        await reconcile_services(artifact["metadata"]["namespace"], services)

    @kopf.on.event("batch", "v1", "jobs", labels={LABEL_ARTIFACT: kopf.PRESENT}, registry=registry)
    async def compile_job(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        """A compile Job's event -> reconcile its artifact, then its services if the artifact's status changed."""
        artifact = _owner_name(dict(body), ARTIFACTS.kind)
        if artifact is not None:
            await reconcile_artifact(_namespaced(namespace), artifact)

    @kopf.on.event("apps", "v1", "deployments", labels={LABEL_SERVICE: kopf.PRESENT}, registry=registry)
    async def serving_deployment(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        """A serving Deployment's event -> reconcile its service."""
        service = _owner_name(dict(body), SERVICES_NIS.kind)
        if service is not None:
            await reconcile_service(_namespaced(namespace), service)

    def _wakes_its_service(body: kopf.Body, labels: Mapping[str, str], namespace: str | None, **_: Any) -> bool:
        # A Deployment's status may tell of a Ready replacement before the pod watch does: the pod's own
        # event then finds its quarantined predecessor to let go.
        return _is_troubled(body) or (
            _is_ready(body) and _holds_quarantine(cache, _namespaced(namespace), labels[LABEL_SERVICE])
        )

    @kopf.on.event("v1", "pods", labels={LABEL_SERVICE: kopf.PRESENT}, when=_wakes_its_service, registry=registry)
    async def serving_pod(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
        """A serving pod the scheduler cannot place, whose engine reported a device fault, or Ready while its service
        holds quarantined pods -> its service."""
        await reconcile_service(_namespaced(namespace), labels[LABEL_SERVICE])

    # Nodes' Neuron faults: an index, so every handler waits until the first list of nodes is in (a pod kept off
    # a faulty node must not be let go because its node's fault is not known yet).
    changed_nodes: set[str] = set()

    @kopf.index("v1", "nodes", id="node_health", registry=registry)
    async def node_health(body: kopf.Body, **_: Any) -> None:
        if manager.nodes.observe(dict(body)):
            changed_nodes.add(body["metadata"]["name"])

    def _fault_changed(body: kopf.Body, type: str | None, **_: Any) -> bool:
        # Evaluated after the index took the event in: only changes wake a handler (and its log line).
        return type == "DELETED" or body["metadata"]["name"] in changed_nodes

    @kopf.on.event("v1", "nodes", when=_fault_changed, registry=registry)
    async def node_fault_changed(body: kopf.Body, type: str | None, **_: Any) -> None:
        """A node whose Neuron fault appeared, changed or cleared -> the services with pods on it."""
        name = body["metadata"]["name"]
        changed = manager.nodes.forget(name) if type == "DELETED" else name in changed_nodes
        changed_nodes.discard(name)
        if changed:
            for namespace, service in _services_on(cache, name):
                await reconcile_service(namespace, service)

    return registry
