"""Pure status helpers: metav1.Conditions, and an artifact's status from its compile Job."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from neuronfleet.operator import api, plan

Obj = dict[str, Any]


class ConditionType(StrEnum):
    """The conditions of a NeuronInferenceService, in the order they are shown."""

    VALIDATED = "Validated"
    ARTIFACT_READY = "ArtifactReady"
    AVAILABLE = "Available"
    READY = "Ready"
    #: The InferencePool, and with spec.routing the Endpoint Picker in front of it.
    ROUTING = "Routing"
    #: Only on services with spec.autoscaling.
    AUTOSCALING = "Autoscaling"
    #: Serving pods out of service for a Neuron fault (``neuronfleet.operator.health``).
    DEGRADED = "Degraded"


class Reason(StrEnum):
    """Every reason the operator writes: of a service's conditions, of an artifact's status, of its events."""

    # Validated
    VALID = "Valid"
    INVALID_BUCKETS = "InvalidBuckets"
    INVALID_SPEC = "InvalidSpec"
    # ArtifactReady (and the artifact's own events)
    COMPILED = "Compiled"
    COMPILING = "Compiling"
    COMPILE_FAILED = "CompileFailed"
    # Available
    MINIMUM_REPLICAS_AVAILABLE = "MinimumReplicasAvailable"
    WAITING_FOR_ARTIFACT = "WaitingForArtifact"
    NO_REPLICAS_READY = "NoReplicasReady"
    SCALED_TO_ZERO = "ScaledToZero"
    INSUFFICIENT_NEURON_CAPACITY = "InsufficientNeuronCapacity"
    # Ready
    READY = "Ready"
    ROLLING_OUT = "RollingOut"
    BLOCKED_BY_FAILED_COMPILE = "BlockedByFailedCompile"
    CANARY_PROGRESSING = "CanaryProgressing"
    CANARY_ABORTED = "CanaryAborted"
    # Autoscaling
    SCALING = "Scaling"
    SCALING_PAUSED = "ScalingPaused"
    AUTOSCALING_UNAVAILABLE = "AutoscalingUnavailable"
    # Routing
    POOL_READY = "PoolReady"
    POOL_UNAVAILABLE = "InferencePoolUnavailable"
    ROUTING_UNAVAILABLE = "RoutingUnavailable"
    PICKER_STARTING = "PickerStarting"
    PICKER_READY = "PickerReady"
    # Degraded
    HEALTHY = "Healthy"
    NEURON_DEVICE_FAULT = "NeuronDeviceFault"
    NEURON_NODE_FAULT = "NeuronNodeFault"
    FAULTY_NODE_AVOIDED = "FaultyNodeAvoided"
    # An artifact's status.reason (a failed Job's own reason is passed through)
    JOB_PENDING = "JobPending"
    JOB_STARTING = "Starting"
    JOB_RUNNING = "Running"
    JOB_FAILED = "JobFailed"
    # Events that are no condition's transition
    PENDING = "Pending"
    ARTIFACT_CREATED = "ArtifactCreated"
    ARTIFACT_SHARED = "ArtifactShared"
    ARTIFACT_RELEASED = "ArtifactReleased"
    ARTIFACT_DELETED = "ArtifactDeleted"
    COMPILE_STARTED = "CompileStarted"
    REPLICA_QUARANTINED = "ReplicaQuarantined"
    QUARANTINE_RELEASED = "QuarantineReleased"
    CANARY_STEPPED = "CanaryStepped"
    CANARY_PROMOTED = "CanaryPromoted"


#: Reasons that mean something needs a human: posted as Warning events.
WARNING_REASONS = frozenset(
    {
        Reason.INVALID_BUCKETS,
        Reason.INVALID_SPEC,
        Reason.COMPILE_FAILED,
        Reason.BLOCKED_BY_FAILED_COMPILE,
        Reason.INSUFFICIENT_NEURON_CAPACITY,
        Reason.NO_REPLICAS_READY,
        Reason.AUTOSCALING_UNAVAILABLE,
        Reason.ROUTING_UNAVAILABLE,
        Reason.NEURON_DEVICE_FAULT,
        Reason.NEURON_NODE_FAULT,
        Reason.REPLICA_QUARANTINED,
        Reason.CANARY_ABORTED,
    }
)

#: Reasons told in the status only, never as events: the pool's, on every service, where nobody asked for routing.
QUIET_REASONS = frozenset({Reason.POOL_READY, Reason.POOL_UNAVAILABLE})


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post about an object."""

    type: str
    reason: str
    message: str


def now() -> datetime.datetime:
    """The current time, in UTC, to the second (as the API server stores it)."""
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def condition(
    type_: ConditionType, status: bool, reason: Reason, message: str, generation: int, at: datetime.datetime
) -> api.Condition:
    """A condition at ``at``."""
    return api.Condition(
        type=type_,
        status="True" if status else "False",
        reason=reason,
        message=message,
        last_transition_time=at,
        observed_generation=generation,
    )


def merge_conditions(previous: Sequence[api.Condition], updates: Iterable[api.Condition]) -> list[api.Condition]:
    """Apply ``updates`` over ``previous``, keeping a condition's transition time while its status holds."""
    merged = {c.type: c for c in previous}
    for update in updates:
        old = merged.get(update.type)
        if old is not None and old.status == update.status:
            update = update.model_copy(update={"last_transition_time": old.last_transition_time})
        merged[update.type] = update
    known = [merged.pop(t) for t in ConditionType if t in merged]
    return known + sorted(merged.values(), key=lambda c: c.type)


def transitions(previous: Sequence[api.Condition], current: Sequence[api.Condition]) -> list[Event]:
    """One event per condition whose status or reason changed; a reason already told is not told twice.

    ``Available`` only speaks when it is lost after having held (an outage): while a
    service starts, ``Ready`` tells the story. ``Degraded`` is quiet when it first appears healthy. The pool's
    reasons (:data:`QUIET_REASONS`) never speak.
    """
    before = {c.type: (c.status, c.reason) for c in previous}
    events: list[Event] = []
    told: set[str] = set()
    for c in current:
        if before.get(c.type) == (c.status, c.reason) or c.reason in told or c.reason in QUIET_REASONS:
            continue
        if c.type == ConditionType.AVAILABLE and not (before.get(c.type, ("",))[0] == "True" and c.status == "False"):
            continue
        if c.type == ConditionType.DEGRADED and c.type not in before and c.reason == Reason.HEALTHY:
            continue
        told.add(c.reason)
        kind = "Warning" if c.reason in WARNING_REASONS else "Normal"
        events.append(
            Event(kind, c.reason, f"{c.type}={c.status}: {c.message}" if c.message else f"{c.type}={c.status}")
        )
    return events


# Artifact status


def _job_condition(job: Obj, type_: str) -> Obj | None:
    for c in job.get("status", {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return dict(c)
    return None


def _parse_time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str):
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def last_pod_failure(pods: Sequence[Obj]) -> str | None:
    """The newest compile pod's termination message (its logs' tail when it wrote none)."""
    failures: list[tuple[str, str]] = []
    for pod in pods:
        for container in pod.get("status", {}).get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            if terminated and terminated.get("exitCode", 0) != 0:
                text = (terminated.get("message") or terminated.get("reason") or "").strip()
                if text:
                    failures.append((terminated.get("finishedAt") or "", text))
    return max(failures)[1] if failures else None


#: Why a container cannot start that no wait mends: the pod needs a fix (a Secret or ConfigMap it names,
#: an image it can get). The Job would wait for its deadline (hours) without a word.
STUCK_WAITING_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"}
)


def stuck_pod(pods: Sequence[Obj]) -> tuple[str, str] | None:
    """The reason and message of a compile container that cannot start (``STUCK_WAITING_REASONS``), if any."""
    for pod in pods:
        for container in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in STUCK_WAITING_REASONS:
                detail = (waiting.get("message") or "").strip()
                name = pod["metadata"]["name"]
                return waiting["reason"], f"compile pod {name} cannot start: {detail or waiting['reason']}"
    return None


#: The Job controller's event reason when the API server refuses the pod it makes (admission: a missing
#: ServiceAccount, a quota, a policy). The Job records nothing of it in its status.
FAILED_CREATE = "FailedCreate"


def awaiting_pod(job: Obj) -> bool:
    """Whether a compile Job is unfinished with no pod running: the only time its pod creation can be refused."""
    status = job.get("status", {})
    finished = _job_condition(job, "Complete") or _job_condition(job, "Failed")
    return finished is None and not int(status.get("active") or 0)


def _event_time(event: Obj) -> datetime.datetime | None:
    # The core/v1 recorder sets lastTimestamp; the events.k8s.io one, eventTime and series.
    series = event.get("series") or {}
    return _parse_time(event.get("lastTimestamp") or series.get("lastObservedTime") or event.get("eventTime"))


def refused_pod(job: Obj, events: Sequence[Obj], pods: Sequence[Obj]) -> tuple[str, str] | None:
    """The reason and message of the Job controller's newest refused pod creation (``FAILED_CREATE``) for this
    Job, unless a pod was made since (the refusal was mended)."""
    uid = job["metadata"].get("uid")
    refusals = [
        (at, event)
        for event in events
        if event.get("reason") == FAILED_CREATE
        and (event.get("involvedObject") or {}).get("uid") == uid
        and (at := _event_time(event)) is not None
    ]
    if not refusals:
        return None
    at, newest = max(refusals, key=lambda refusal: refusal[0])
    created = [t for pod in pods if (t := _parse_time(pod["metadata"].get("creationTimestamp"))) is not None]
    if created and max(created) >= at:
        return None
    detail = (newest.get("message") or "").strip() or FAILED_CREATE
    return FAILED_CREATE, f"compile Job {job['metadata']['name']} cannot create its pod: {detail}"


def bucket_progress(spec: api.NeuronCompiledArtifactSpec, state: api.BucketState) -> list[api.BucketProgress]:
    """Every compiled shape, all in one state (the Job reports completion as a whole)."""
    engine = spec.engine
    return [
        *(api.BucketProgress(kind="prefill", size=s, state=state) for s in engine.effective_num_batched_tokens_buckets),
        *(api.BucketProgress(kind="decode", size=s, state=state) for s in engine.effective_num_seqs_buckets),
        *(
            api.BucketProgress(kind="decode", size=s, context=context, state=state)
            for context in engine.decode_context_length_buckets or ()
            for s in engine.effective_num_seqs_buckets
        ),
    ]


def artifact_status(
    spec: api.NeuronCompiledArtifactSpec,
    job: Obj | None,
    pods: Sequence[Obj],
    previous: api.NeuronCompiledArtifactStatus,
    generation: int,
    job_events: Sequence[Obj] = (),
) -> api.NeuronCompiledArtifactStatus:
    """What the compile Job (its pods, and its events while it has none running) says about the artifact.

    A Ready artifact stays Ready when its finished Job is deleted; a Failed one
    whose Job is deleted goes back to Pending, and a new Job retries it.
    """
    artifact_hash = spec.hash()
    base = {
        "hash": artifact_hash,
        "location": plan.store_location(spec.compile, artifact_hash),
        "observed_generation": generation,
    }
    if job is None:
        if previous.phase == "Ready":
            return previous.model_copy(update=base)
        return api.NeuronCompiledArtifactStatus(
            phase="Pending", reason=Reason.JOB_PENDING, buckets=bucket_progress(spec, "Pending"), **base
        )
    status = job.get("status", {})
    attempts = sum(int(status.get(k) or 0) for k in ("active", "succeeded", "failed"))
    common = {
        **base,
        "job": job["metadata"]["name"],
        "attempts": attempts,
        "started_at": _parse_time(status.get("startTime")),
    }
    complete = _job_condition(job, "Complete")
    if complete is not None:
        return api.NeuronCompiledArtifactStatus(
            phase="Ready",
            reason=Reason.COMPILED,
            message=f"compiled {len(bucket_progress(spec, 'Compiled'))} buckets",
            buckets=bucket_progress(spec, "Compiled"),
            completed_at=_parse_time(status.get("completionTime")) or _parse_time(complete.get("lastTransitionTime")),
            **common,
        )
    failed = _job_condition(job, "Failed")
    if failed is not None:
        reason = failed.get("reason") or Reason.JOB_FAILED
        detail = failed.get("message") or ""
        last_words = last_pod_failure(pods)
        message = "; ".join(part for part in (detail, f"last compile pod: {last_words}" if last_words else "") if part)
        return api.NeuronCompiledArtifactStatus(
            phase="Failed",
            reason=reason,
            message=message or reason,
            buckets=bucket_progress(spec, "Pending"),
            completed_at=_parse_time(failed.get("lastTransitionTime")),
            **common,
        )
    stuck = stuck_pod(pods) or refused_pod(job, job_events, pods)
    if stuck is not None:
        # Still Compiling (the Job goes on once the pod is fixed), but the reason says what to fix.
        reason, message = stuck
        return api.NeuronCompiledArtifactStatus(
            phase="Compiling", reason=reason, message=message, buckets=bucket_progress(spec, "Pending"), **common
        )
    running = int(status.get("active") or 0) > 0
    return api.NeuronCompiledArtifactStatus(
        phase="Compiling",
        reason=Reason.JOB_RUNNING if running else Reason.JOB_STARTING,
        message=(
            f"compile Job {job['metadata']['name']}: attempt {max(attempts, 1)} of {spec.compile.backoff_limit + 1}"
        ),
        buckets=bucket_progress(spec, "Pending"),
        **common,
    )
