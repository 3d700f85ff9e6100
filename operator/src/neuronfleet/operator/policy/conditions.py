"""The vocabulary of every status: metav1.Conditions, their types and reasons, and the events their changes post."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from neuronfleet.operator import api


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
    #: Serving pods out of service for a Neuron fault (``neuronfleet.operator.policy.health``).
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
