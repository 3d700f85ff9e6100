"""Level-triggered reconciliation: read, plan, apply, write status. The only I/O besides kopf.

Both reconcilers start from what is in the cluster now, not from the event that
woke them, so any trigger (a spec change, a child's event, a restart, the
periodic resync) converges to the same state, and running one twice does nothing
the second time: children are server-side applied or created under
deterministic names, and status is written only when it changed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from neuronfleet.engine.names import LABEL_ARTIFACT, LABEL_SERVICE
from neuronfleet.operator import api, decide, plan, scaling
from neuronfleet.operator.kube import (
    ARTIFACTS,
    CONFIGMAPS,
    CONFLICT,
    DEPLOYMENTS,
    EVENTS,
    FORBIDDEN,
    JOBS,
    NOT_FOUND,
    PODS,
    SCALED_OBJECTS,
    SERVICES_NIS,
    ApiError,
    Kube,
    Resource,
)
from neuronfleet.operator.metrics import OperatorMetrics
from neuronfleet.operator.status import (
    FAILED_CREATE,
    ConditionType,
    Event,
    Reason,
    artifact_status,
    awaiting_pod,
    now,
)

Obj = dict[str, Any]
M = TypeVar("M", bound=api.K8sModel)
Emit = Callable[[Obj, Event], None]

log = logging.getLogger(__name__)

#: Label the Job controller puts on a Job's pods.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
#: Optimistic-concurrency retries for ownerReference updates racing another service.
CONFLICT_RETRIES = 5


class RetryLater(Exception):
    """The cluster is mid-change (e.g. an object is being deleted); try again."""


class KeyedLocks:
    """One lock per key, kept only while someone holds or waits for it (so the map never grows)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        # key -> (lock, holders and waiters)
        self._locks: dict[Hashable, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def held(self, key: Hashable) -> Iterator[None]:
        """Hold ``key``'s lock for the block."""
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        with self._guard:
            return len(self._locks)


class Reconciler:
    """Reconciles services and artifacts; safe to call from many threads."""

    def __init__(
        self, kube: Kube, emit: Emit, metrics: OperatorMetrics | None = None, prometheus: str | None = None
    ) -> None:
        self.kube = kube
        self.emit = emit
        self.metrics = metrics if metrics is not None else OperatorMetrics()
        #: The Prometheus URL KEDA's triggers query (``None``: autoscaling is not set up).
        self.prometheus = prometheus
        # One reconcile per object at a time: triggers from several watches may overlap.
        self.locks = KeyedLocks()

    def _locked(self, kind: str, namespace: str, name: str) -> contextlib.AbstractContextManager[None]:
        return self.locks.held((kind, namespace, name))

    # Services

    def reconcile_service(self, namespace: str, name: str) -> None:
        """Bring one NeuronInferenceService's artifact, children and status to what its spec asks."""
        with self._locked("service", namespace, name), self.metrics.reconciling(SERVICES_NIS.kind, (RetryLater,)):
            body = self.kube.get(SERVICES_NIS, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self.metrics.forget(SERVICES_NIS.kind, namespace, name)
                return
            self._reconcile_service(body)

    def _reconcile_service(self, body: Obj) -> None:
        meta = body["metadata"]
        namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation", 1))
        previous = _previous(api.NeuronInferenceServiceStatus, body)
        try:
            spec = api.parse_service_spec(body.get("spec") or {})
        except ValidationError as error:
            reason = Reason.INVALID_BUCKETS if api.is_bucket_error(error) else Reason.INVALID_SPEC
            status, events = decide.invalid_status(api.describe_errors(error), reason, generation, previous, now())
            self._write_status(SERVICES_NIS, body, status, events)
            return
        owner = plan.Owner.of(body)
        identity = spec.identity()
        artifact_body = self._ensure_artifact(body, plan.artifact(owner, namespace, spec))
        target = decide.ArtifactView.of(artifact_body, identity.hash())
        deployment_body = self.kube.get(DEPLOYMENTS, namespace, name)
        deployment = decide.DeploymentView.of(deployment_body) if deployment_body else None
        decision = decide.decide(target, deployment, previous.current_revision)

        keep_configmaps: set[str] = set()
        if decision.serve is decide.Serve.TARGET:
            served = plan.ServedArtifact(
                target.name, target.hash, api.parse_artifact_spec(artifact_body["spec"]).compile
            )
            for obj in plan.serving_objects(owner, namespace, spec, served):
                applied = self.kube.apply(obj)
                if obj["kind"] == "Deployment":
                    deployment_body = applied
                elif obj["kind"] == "ConfigMap":
                    keep_configmaps.add(obj["metadata"]["name"])
        elif (
            decision.serve is decide.Serve.KEEP
            and deployment is not None
            and deployment.replicas != spec.desired_replicas
        ):
            # The serving revision's template stays as it is until the new artifact is Ready.
            deployment_body = self.kube.merge_patch(
                DEPLOYMENTS, namespace, name, {"spec": {"replicas": spec.desired_replicas}}
            )
        if deployment_body is not None:
            deployment = decide.DeploymentView.of(deployment_body)
            # Decide again on what was just applied: it may have finished rolling out since the
            # first read, and the status must not say Ready without naming the current revision.
            decision = decide.decide(target, deployment, previous.current_revision)
        keep_configmaps |= decision.keep_configmaps
        scaling_state = self._autoscale(owner, namespace, spec, previous, serving=deployment is not None)

        if decision.keep is not None:
            self._release(body, decision.keep, keep_configmaps)
        pods = self.kube.list(PODS, namespace, f"{LABEL_SERVICE}={name}") if deployment is not None else []
        given = decide.ServiceStatusInput(
            name=name,
            generation=generation,
            spec=spec,
            target=target,
            deployment=deployment,
            unschedulable=decide.unschedulable_messages(pods),
            decision=decision,
            autoscaling_state=scaling_state,
        )
        status, events = decide.service_status(given, previous, now())
        self._write_status(SERVICES_NIS, body, status, events)

    def _autoscale(
        self,
        owner: plan.Owner,
        namespace: str,
        spec: api.NeuronInferenceServiceSpec,
        previous: api.NeuronInferenceServiceStatus,
        *,
        serving: bool,
    ) -> scaling.ScalingState | None:
        """Start the service at minReplicas (if spec.replicas is unset) and apply its ScaledObject (paused while
        no revision serves); or delete a ScaledObject it no longer wants."""
        if spec.autoscaling is None:
            # The condition says a ScaledObject may exist; without it there is nothing to ask the API server.
            if any(c.type == ConditionType.AUTOSCALING for c in previous.conditions):
                try:
                    self.kube.delete(SCALED_OBJECTS, namespace, owner.name)
                except ApiError as error:
                    if error.status != FORBIDDEN:
                        raise
                    # The condition goes with this pass, so nothing asks again: say what is left behind.
                    log.warning(
                        "%s/%s: may not delete its ScaledObject (chart without autoscaling.enabled); delete it by hand",
                        namespace,
                        owner.name,
                    )
            return None
        if self.prometheus is None:
            return scaling.ScalingState(
                problem=(
                    "the operator has no Prometheus address: install the chart with autoscaling.enabled=true "
                    "and autoscaling.prometheus.address"
                )
            )
        desired = scaling.scaled_object(owner, namespace, spec.autoscaling, self.prometheus, paused=not serving)
        may_not = scaling.ScalingState(
            problem=(
                "the operator may not scale services or manage ScaledObjects: "
                "install the chart with autoscaling.enabled=true"
            )
        )
        if spec.replicas is None:
            # The scale subresource cannot be read without spec.replicas, and KEDA reads it first: the
            # service starts at minReplicas, written where a scaler writes.
            scale = {"spec": {"replicas": spec.desired_replicas}}
            try:
                self.kube.merge_patch(SERVICES_NIS, namespace, owner.name, scale, subresource="scale")
            except ApiError as error:
                if error.status == FORBIDDEN:
                    return may_not
                raise
        try:
            self.kube.apply(desired)
        except ApiError as error:
            # Here, unlike from the scale patch (a deleted service), a 404 means the kind is unknown.
            if error.status == NOT_FOUND:
                return scaling.ScalingState(problem="KEDA is not installed: the cluster serves no keda.sh ScaledObject")
            if error.status == FORBIDDEN:
                return may_not
            raise
        return scaling.ScalingState(paused=not serving)

    def forget_service(self, service: Obj) -> None:
        """A deleted service's claims on artifacts, dropped now (the garbage collector would, later)."""
        meta = service["metadata"]
        with self._locked("service", meta["namespace"], meta["name"]):
            # Under the lock: a reconcile that read it before the delete has written its phase by now.
            self.metrics.forget(SERVICES_NIS.kind, meta["namespace"], meta["name"])
            # By owner uid only: a new service of the same name keeps its ConfigMaps (the GC takes the old ones).
            self._release(service, frozenset(), frozenset(), deleted=True)

    def _ensure_artifact(self, service: Obj, desired: Obj) -> Obj:
        """The artifact, created or with this service added to its owners (services share it)."""
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        uid = service["metadata"]["uid"]
        for _ in range(CONFLICT_RETRIES):
            existing = self.kube.get(ARTIFACTS, namespace, name)
            if existing is None:
                try:
                    created = self.kube.create(desired)
                except ApiError as error:
                    if error.status == CONFLICT:
                        continue
                    raise
                self.emit(service, Event("Normal", Reason.ARTIFACT_CREATED, f"created {name} to compile"))
                return created
            if existing["metadata"].get("deletionTimestamp"):
                raise RetryLater(f"{name} is being deleted")
            refs = existing["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                return existing
            patch = {
                "metadata": {
                    "resourceVersion": existing["metadata"]["resourceVersion"],
                    "ownerReferences": [*refs, *desired["metadata"]["ownerReferences"]],
                }
            }
            try:
                shared = self.kube.merge_patch(ARTIFACTS, namespace, name, patch)
            except ApiError as error:
                if error.status == CONFLICT:
                    continue
                raise
            self.emit(service, Event("Normal", Reason.ARTIFACT_SHARED, f"using existing artifact {name}"))
            return shared
        raise RetryLater(f"{name} kept changing under concurrent updates")

    def _release(
        self, service: Obj, keep: frozenset[str], keep_configmaps: Collection[str], *, deleted: bool = False
    ) -> None:
        """Drop this service's claim on artifacts (and engine ConfigMaps) it no longer needs.

        An artifact no service owns any more is deleted; its files stay in the store,
        so compiling the same identity again finds them.
        """
        meta = service["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        for artifact in self.kube.list(ARTIFACTS, namespace):
            art_meta = artifact["metadata"]
            refs = art_meta.get("ownerReferences") or []
            if (art_meta.get("labels") or {}).get(LABEL_ARTIFACT) in keep or all(r.get("uid") != uid for r in refs):
                continue
            remaining = [r for r in refs if r.get("uid") != uid]
            try:
                if remaining:
                    patch = {"metadata": {"resourceVersion": art_meta["resourceVersion"], "ownerReferences": remaining}}
                    self.kube.merge_patch(ARTIFACTS, namespace, art_meta["name"], patch)
                    event = Event("Normal", Reason.ARTIFACT_RELEASED, f"no longer uses {art_meta['name']}")
                else:
                    self._delete_unowned(artifact)
                    event = Event("Normal", Reason.ARTIFACT_DELETED, f"deleted {art_meta['name']}: no service uses it")
                if not deleted:
                    self.emit(service, event)
            except ApiError as error:
                if error.status == NOT_FOUND:
                    continue  # the garbage collector deleted it first: nothing left to release
                if error.status != CONFLICT:
                    raise
                log.info(
                    "artifact %s/%s changed while releasing it; the next pass retries", namespace, art_meta["name"]
                )
        if deleted:
            return
        for configmap in self.kube.list(CONFIGMAPS, namespace, f"{LABEL_SERVICE}={name}"):
            if configmap["metadata"]["name"] not in keep_configmaps:
                self.kube.delete(CONFIGMAPS, namespace, configmap["metadata"]["name"])

    def _delete_unowned(self, artifact: Obj) -> None:
        # The precondition fails (409) if another service claimed it meanwhile.
        meta = artifact["metadata"]
        self.kube.request(
            "DELETE",
            ARTIFACTS.path(meta["namespace"], meta["name"]),
            body={
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "propagationPolicy": "Background",
                "preconditions": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
            },
        )

    # Artifacts

    def reconcile_artifact(self, namespace: str, name: str) -> list[str]:
        """Run an artifact's compile Job once and mirror it into the artifact's status.

        Returns the services to reconcile now: its owners, when its status changed.
        """
        with self._locked("artifact", namespace, name), self.metrics.reconciling(ARTIFACTS.kind, (RetryLater,)):
            body = self.kube.get(ARTIFACTS, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self.metrics.forget(ARTIFACTS.kind, namespace, name)
                return []
            changed = self._reconcile_artifact(body)
        return owner_services(body) if changed else []

    def _reconcile_artifact(self, body: Obj) -> bool:
        meta = body["metadata"]
        namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation", 1))
        previous = _previous(api.NeuronCompiledArtifactStatus, body)
        try:
            spec = api.parse_artifact_spec(body.get("spec") or {})
        except ValidationError as error:
            status = api.NeuronCompiledArtifactStatus(
                phase="Failed",
                reason=Reason.INVALID_SPEC,
                message=api.describe_errors(error),
                observed_generation=generation,
            )
            return self._write_status(ARTIFACTS, body, status, self._artifact_events(previous, status))
        owner = plan.Owner.of(body)
        self.kube.apply(plan.artifact_configmap(owner, namespace, spec))
        job_name = plan.compile_job_name(name)
        job = self.kube.get(JOBS, namespace, job_name)
        if job is not None and job["metadata"].get("deletionTimestamp"):
            return False  # a retry was asked for: its deletion event brings us back
        if job is None and previous.phase != "Ready":
            try:
                job = self.kube.create(plan.compile_job(owner, namespace, spec))
            except ApiError as error:
                if error.status != CONFLICT:
                    raise
                job = self.kube.get(JOBS, namespace, job_name)
            else:
                self.emit(body, Event("Normal", Reason.COMPILE_STARTED, f"started compile Job {job_name}"))
        pods = self.kube.list(PODS, namespace, f"{JOB_NAME_LABEL}={job_name}") if job is not None else []
        refusals: list[Obj] = []
        if job is not None and awaiting_pod(job):
            # A pod the API server refuses exists nowhere but in the Job controller's events.
            selector = f"involvedObject.uid={job['metadata']['uid']},reason={FAILED_CREATE}"
            refusals = self.kube.list(EVENTS, namespace, fields=selector)
        status = artifact_status(spec, job, pods, previous, generation, refusals)
        return self._write_status(ARTIFACTS, body, status, self._artifact_events(previous, status))

    @staticmethod
    def _artifact_events(
        previous: api.NeuronCompiledArtifactStatus, status: api.NeuronCompiledArtifactStatus
    ) -> list[Event]:
        if previous.phase == status.phase and previous.observed_generation is not None:
            return []
        if status.phase == "Failed":
            return [Event("Warning", Reason.COMPILE_FAILED, f"{status.reason}: {status.message}")]
        reason = {"Ready": Reason.COMPILED, "Compiling": Reason.COMPILING, "Pending": Reason.PENDING}[status.phase]
        return [Event("Normal", reason, status.message or status.reason or status.phase)]

    def forget_artifact(self, artifact: Obj) -> list[str]:
        """A deleted artifact leaves the metrics; returns its services, to reconcile now (they create it again
        if they still want it)."""
        meta = artifact["metadata"]
        with self._locked("artifact", meta["namespace"], meta["name"]):
            self.metrics.forget(ARTIFACTS.kind, meta["namespace"], meta["name"])
        return owner_services(artifact)

    # Shared

    def _write_status(self, resource: Resource, body: Obj, status: api.K8sModel, events: Sequence[Event]) -> bool:
        """Write status if it changed (so the operator's own writes settle), then post the events."""
        new = status.model_dump(mode="json", exclude_none=True)
        old = body.get("status") or {}
        changed = new != old
        meta = body["metadata"]
        if changed:
            patch = {**{key: None for key in old if key not in new}, **new}
            self.kube.merge_patch(resource, meta["namespace"], meta["name"], {"status": patch}, subresource="status")
        self.metrics.status_written(resource.kind, meta["namespace"], meta["name"], old, new)
        for event in events:
            self.emit(body, event)
        return changed

    def resync(self, namespaces: Sequence[str] | None) -> int:
        """Reconcile everything in ``namespaces`` (all when ``None``): the safety net behind the watches.

        An object whose reconcile fails is left for the next pass; a list that fails ends the pass
        (:class:`ApiError`). Artifacts go first, so their services see what changed in the same pass.
        Returns how many objects it reconciled.
        """
        with self.metrics.resyncing():
            count = self._resync(namespaces)
            # Inside: a reader that sees the pass counted sees its objects too.
            self.metrics.resync_objects.inc(count)
        return count

    def _resync(self, namespaces: Sequence[str] | None) -> int:
        count = 0
        # Objects counted before the lists and missing from them were deleted unseen (e.g. in a watch gap).
        counted = {kind: self.metrics.tracked(kind, namespaces) for kind in (ARTIFACTS.kind, SERVICES_NIS.kind)}
        listed: dict[str, set[tuple[str, str]]] = {ARTIFACTS.kind: set(), SERVICES_NIS.kind: set()}
        for namespace in namespaces if namespaces is not None else [None]:
            for artifact in self.kube.list(ARTIFACTS, namespace):
                meta = artifact["metadata"]
                listed[ARTIFACTS.kind].add((meta["namespace"], meta["name"]))
                count += self._safely(self.reconcile_artifact, meta["namespace"], meta["name"])
            for service in self.kube.list(SERVICES_NIS, namespace):
                meta = service["metadata"]
                listed[SERVICES_NIS.kind].add((meta["namespace"], meta["name"]))
                count += self._safely(self.reconcile_service, meta["namespace"], meta["name"])
        for kind, keys in counted.items():
            for namespace, name in keys - listed[kind]:
                self.metrics.forget(kind, namespace, name)
        return count

    @staticmethod
    def _safely(reconcile: Callable[[str, str], object], namespace: str, name: str) -> int:
        try:
            reconcile(namespace, name)
        except (ApiError, RetryLater) as error:
            log.warning("resync of %s/%s failed, retried next pass: %s", namespace, name, error)
            return 0
        return 1


def owner_services(artifact: Obj) -> list[str]:
    """The names of the services that use an artifact (its owners)."""
    refs = artifact["metadata"].get("ownerReferences") or []
    return [ref["name"] for ref in refs if ref.get("kind") == SERVICES_NIS.kind]


def _previous(model: type[M], body: Obj) -> M:
    """The status last written, or an empty one if it is missing or unreadable."""
    try:
        return model.model_validate(body.get("status") or {})
    except ValidationError:
        return model.model_validate({})
