"""Kopf wiring: which changes wake which reconciler. No logic lives here.

- A service's spec (create, update, resume after a restart) -> reconcile it.
- An artifact's creation or resume -> run its compile Job; its deletion -> its services.
- A compile Job's events -> its artifact (which tells its services when it changes).
- A serving Deployment's events, and a serving pod the scheduler cannot place -> its service.
- A service's deletion -> drop its claims on artifacts (the garbage collector would, later).
- A periodic resync reconciles everything, behind the watches.

Status writes never wake a handler: services and artifacts are reconciled on
spec changes (``field="spec"``), never on their own status. The handlers need no
finalizer: children are owned and garbage-collected by Kubernetes.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from neuronfleet.operator import api, plan
from neuronfleet.operator.kube import ARTIFACTS, SERVICES_NIS
from neuronfleet.operator.reconcile import Reconciler, RetryLater

Obj = dict[str, Any]

#: kopf's own bookkeeping (handler progress, last-handled spec) under the operator's prefix.
ANNOTATION_PREFIX = "neuronfleet.io"
FINALIZER = "neuronfleet.io/finalizer"
#: Logged after each full resync.
RESYNC_DONE = "resync done"

log = logging.getLogger(__name__)


def _retrying(error: RetryLater) -> kopf.TemporaryError:
    return kopf.TemporaryError(str(error), delay=2)


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


def build_registry(
    reconciler: Reconciler, namespaces: Sequence[str] | None, resync_seconds: float
) -> kopf.OperatorRegistry:
    """A kopf registry whose handlers drive ``reconciler``."""
    registry = kopf.OperatorRegistry()
    state: dict[str, Any] = {"last_resync": None}

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        # Only the children the operator made are watched, filtered by the API server.
        settings.watching.label_selectors["apps", "deployments"] = plan.LABEL_SERVICE
        settings.watching.label_selectors["v1", "pods"] = plan.LABEL_SERVICE
        settings.watching.label_selectors["batch", "jobs"] = plan.LABEL_ARTIFACT
        settings.posting.level = logging.WARNING
        settings.execution.max_workers = 8
        state["resync"] = asyncio.create_task(resync_forever())

    async def resync_forever() -> None:
        while True:
            await asyncio.sleep(resync_seconds)
            try:
                count = await asyncio.to_thread(reconciler.resync, namespaces)
            except Exception:  # the loop must outlive any one failure; the next pass retries
                log.exception("resync failed")
            else:
                state["last_resync"] = datetime.datetime.now(datetime.UTC)
                log.info("%s: %d objects reconciled", RESYNC_DONE, count)

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        task = state.get("resync")
        if task is not None:
            task.cancel()

    @kopf.on.probe(id="resync", registry=registry)
    def resync_probe(**_: Any) -> str:
        last = state["last_resync"]
        if last is not None and datetime.datetime.now(datetime.UTC) - last > datetime.timedelta(
            seconds=5 * resync_seconds
        ):
            raise RuntimeError(f"no successful resync since {last.isoformat()}")
        return last.isoformat() if last is not None else "pending"

    @kopf.on.resume(api.GROUP, api.VERSION, SERVICES_NIS.plural, registry=registry)
    @kopf.on.create(api.GROUP, api.VERSION, SERVICES_NIS.plural, registry=registry)
    @kopf.on.update(api.GROUP, api.VERSION, SERVICES_NIS.plural, field="spec", registry=registry)
    def service_spec(name: str, namespace: str | None, **_: Any) -> None:
        try:
            reconciler.reconcile_service(_namespaced(namespace), name)
        except RetryLater as error:
            raise _retrying(error) from None

    @kopf.on.event(
        api.GROUP, api.VERSION, SERVICES_NIS.plural, when=lambda type, **_: type == "DELETED", registry=registry
    )
    def service_deleted(body: kopf.Body, **_: Any) -> None:
        # Its children go with it (owner references); its artifacts go now if nobody else uses them.
        reconciler.forget_service(dict(body))

    @kopf.on.resume(api.GROUP, api.VERSION, ARTIFACTS.plural, registry=registry)
    @kopf.on.create(api.GROUP, api.VERSION, ARTIFACTS.plural, registry=registry)
    def artifact_created(name: str, namespace: str | None, **_: Any) -> None:
        reconciler.reconcile_artifact(_namespaced(namespace), name)

    @kopf.on.event(
        api.GROUP, api.VERSION, ARTIFACTS.plural, when=lambda type, **_: type == "DELETED", registry=registry
    )
    def artifact_deleted(body: kopf.Body, **_: Any) -> None:
        # Services that still want it create it again (the store keeps compiled files).
        reconciler.forget_artifact(dict(body))

    @kopf.on.event("batch", "v1", "jobs", labels={plan.LABEL_ARTIFACT: kopf.PRESENT}, registry=registry)
    def compile_job(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        artifact = _owner_name(dict(body), ARTIFACTS.kind)
        if artifact is not None:
            reconciler.reconcile_artifact(_namespaced(namespace), artifact)

    @kopf.on.event("apps", "v1", "deployments", labels={plan.LABEL_SERVICE: kopf.PRESENT}, registry=registry)
    def serving_deployment(body: kopf.Body, namespace: str | None, **_: Any) -> None:
        service = _owner_name(dict(body), SERVICES_NIS.kind)
        if service is not None:
            reconciler.reconcile_service(_namespaced(namespace), service)

    @kopf.on.event("v1", "pods", labels={plan.LABEL_SERVICE: kopf.PRESENT}, when=_is_unschedulable, registry=registry)
    def unschedulable_pod(labels: Mapping[str, str], namespace: str | None, **_: Any) -> None:
        reconciler.reconcile_service(_namespaced(namespace), labels[plan.LABEL_SERVICE])

    return registry
