"""The artifact reconciler: observe an artifact's compile Job, decide whether to start one, act, write status.

The Job is created once, under a deterministic name (a 409 means it exists), and
only while the artifact is not Ready: deleting a finished Job asks for a retry.
"""

from __future__ import annotations

from enum import Enum

from pydantic import ValidationError

from neuronfleet.operator import api, plan
from neuronfleet.operator.cluster.kube import (
    ARTIFACTS,
    CONFLICT,
    EVENTS,
    JOB_NAME_LABEL,
    JOBS,
    PODS,
    SERVICES_NIS,
    ApiError,
    Kube,
)
from neuronfleet.operator.metrics import OperatorMetrics
from neuronfleet.operator.policy.artifact_status import FAILED_CREATE, artifact_status, awaiting_pod
from neuronfleet.operator.policy.conditions import Event, Reason
from neuronfleet.operator.reconcilers.common import Emit, Obj, RetryLater, previous_status
from neuronfleet.operator.reconcilers.locks import KeyedLocks
from neuronfleet.operator.reconcilers.status_writer import StatusWriter


class CompileAction(Enum):
    """What to do with an artifact's compile Job."""

    #: No Job, and the artifact is not compiled: create it.
    START = "start"
    #: Its Job is being deleted (a retry was asked for): its deletion event brings the reconcile back.
    WAIT_FOR_DELETION = "wait for deletion"
    #: Mirror the Job (or, for a compiled artifact without one, the last status) into the status.
    FOLLOW = "follow"


def compile_action(job: Obj | None, previous: api.NeuronCompiledArtifactStatus) -> CompileAction:
    """Start a compile only when there is no Job and the artifact is not Ready yet."""
    if job is not None and job["metadata"].get("deletionTimestamp"):
        return CompileAction.WAIT_FOR_DELETION
    if job is None and previous.phase != "Ready":
        return CompileAction.START
    return CompileAction.FOLLOW


def owner_services(artifact: Obj) -> list[str]:
    """The names of the services that use an artifact (its owners)."""
    refs = artifact["metadata"].get("ownerReferences") or []
    return [ref["name"] for ref in refs if ref.get("kind") == SERVICES_NIS.kind]


class ArtifactReconciler:
    """Reconciles NeuronCompiledArtifacts; safe to call from many threads."""

    def __init__(
        self, kube: Kube, emit: Emit, status: StatusWriter, locks: KeyedLocks, metrics: OperatorMetrics
    ) -> None:
        self.kube = kube
        self.emit = emit
        self.status = status
        self.locks = locks
        self.metrics = metrics

    def reconcile(self, namespace: str, name: str) -> list[str]:
        """Run an artifact's compile Job once and mirror it into the artifact's status.

        Returns the services to reconcile now: its owners, when its status changed.
        """
        with self.locks.held(("artifact", namespace, name)), self.metrics.reconciling(ARTIFACTS.kind, (RetryLater,)):
            body = self.kube.get(ARTIFACTS, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self.metrics.forget(ARTIFACTS.kind, namespace, name)
                return []
            changed = self._reconcile(body)
        return owner_services(body) if changed else []

    def forget(self, artifact: Obj) -> list[str]:
        """A deleted artifact leaves the metrics; returns its services, to reconcile now (they create it again
        if they still want it)."""
        meta = artifact["metadata"]
        with self.locks.held(("artifact", meta["namespace"], meta["name"])):
            self.metrics.forget(ARTIFACTS.kind, meta["namespace"], meta["name"])
        return owner_services(artifact)

    def _reconcile(self, body: Obj) -> bool:
        # Observe: the spec, the status last written, the Job.
        meta = body["metadata"]
        namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation", 1))
        previous = previous_status(api.NeuronCompiledArtifactStatus, body)
        try:
            spec = api.parse_artifact_spec(body.get("spec") or {})
        except ValidationError as error:
            status = api.NeuronCompiledArtifactStatus(
                phase="Failed",
                reason=Reason.INVALID_SPEC,
                message=api.describe_errors(error),
                observed_generation=generation,
            )
            return self.status.write(ARTIFACTS, body, status, artifact_events(previous, status))
        owner = plan.Owner.of(body)
        job_name = plan.compile_job_name(name)
        job = self.kube.get(JOBS, namespace, job_name)
        # Decide.
        action = compile_action(job, previous)
        # Act: the configuration the Job reads, then the Job.
        self.kube.apply(plan.artifact_configmap(owner, namespace, spec))
        if action is CompileAction.WAIT_FOR_DELETION:
            return False
        if action is CompileAction.START:
            job = self._start(body, owner, spec, job_name)
        # The status mirrors the Job as it is now: its pods' states, and the pods the API server refused.
        pods = self.kube.list(PODS, namespace, f"{JOB_NAME_LABEL}={job_name}") if job is not None else []
        refusals: list[Obj] = []
        if job is not None and awaiting_pod(job):
            # A pod the API server refuses exists nowhere but in the Job controller's events.
            selector = f"involvedObject.uid={job['metadata']['uid']},reason={FAILED_CREATE}"
            refusals = self.kube.list(EVENTS, namespace, fields=selector)
        status = artifact_status(spec, job, pods, previous, generation, refusals)
        return self.status.write(ARTIFACTS, body, status, artifact_events(previous, status))

    def _start(self, body: Obj, owner: plan.Owner, spec: api.NeuronCompiledArtifactSpec, job_name: str) -> Obj | None:
        """The compile Job, created (or found, when another pass created it first)."""
        namespace = body["metadata"]["namespace"]
        try:
            job = self.kube.create(plan.compile_job(owner, namespace, spec))
        except ApiError as error:
            if error.status != CONFLICT:
                raise
            # Made by an earlier pass whose Job the view did not show yet: the server's is the one.
            return self.kube.fresh(JOBS, namespace, job_name)
        self.emit(body, Event("Normal", Reason.COMPILE_STARTED, f"started compile Job {job_name}"))
        return job


def artifact_events(
    previous: api.NeuronCompiledArtifactStatus, status: api.NeuronCompiledArtifactStatus
) -> list[Event]:
    """The event a phase change calls for (none while the phase holds)."""
    if previous.phase == status.phase and previous.observed_generation is not None:
        return []
    if status.phase == "Failed":
        return [Event("Warning", Reason.COMPILE_FAILED, f"{status.reason}: {status.message}")]
    reason = {"Ready": Reason.COMPILED, "Compiling": Reason.COMPILING, "Pending": Reason.PENDING}[status.phase]
    return [Event("Normal", reason, status.message or status.reason or status.phase)]
