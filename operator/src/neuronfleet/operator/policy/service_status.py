"""A service's status, pure: its conditions, phase and events from what one reconcile observed and decided."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from neuronfleet.operator import api, plan
from neuronfleet.operator.policy import health, scaling
from neuronfleet.operator.policy.conditions import (
    ConditionType,
    Event,
    Reason,
    condition,
    merge_conditions,
    transitions,
)
from neuronfleet.operator.policy.rollout import ArtifactView, Decision, DeploymentView

Obj = dict[str, Any]


@dataclass(frozen=True)
class RoutingState:
    """What became of a service's routing this pass."""

    #: Whether the cluster serves InferencePools (its CRD is installed).
    pool_served: bool
    #: Ready router pods, with spec.routing.
    ready: int = 0


@dataclass(frozen=True)
class ServiceStatusInput:
    """Everything the status of a valid service is computed from."""

    name: str
    generation: int
    spec: api.NeuronInferenceServiceSpec
    target: ArtifactView
    deployment: DeploymentView | None
    unschedulable: tuple[str, ...]
    decision: Decision
    #: What became of spec.autoscaling this pass; ``None`` without it.
    autoscaling_state: scaling.ScalingState | None = None
    #: What became of the pool and spec.routing this pass; ``None``: not looked at (no condition).
    routing_state: RoutingState | None = None
    #: The serving pods' Neuron health this pass; ``None``: nothing serves (no condition).
    health: health.HealthPlan | None = None
    #: The target revision's canary (spec.rollout.canary), while it runs and after.
    canary: api.CanaryStatus | None = None


#: An artifact's reasons while its compile goes as it should; any other names a trouble to fix.
_ROUTINE_COMPILE_REASONS = frozenset({Reason.JOB_PENDING, Reason.JOB_STARTING, Reason.JOB_RUNNING})


def _artifact_condition(target: ArtifactView) -> tuple[bool, Reason, str]:
    if target.phase == "Ready":
        return True, Reason.COMPILED, f"{target.name} is compiled"
    if target.phase == "Failed":
        return False, Reason.COMPILE_FAILED, f"{target.name}: {target.reason}: {target.message}"
    if target.reason and target.reason not in _ROUTINE_COMPILE_REASONS:
        # Still compiling (a fix lets the Job go on), but the trouble's own reason is shown: FailedCreate, ...
        return False, Reason.COMPILING, f"{target.name}: {target.reason}: {target.message or target.reason}"
    return False, Reason.COMPILING, f"{target.name}: {target.message or target.reason or 'waiting for the compile Job'}"


def _available_condition(given: ServiceStatusInput) -> tuple[bool, Reason, str]:
    deployment, spec = given.deployment, given.spec
    if deployment is None:
        if given.target.phase == "Failed":
            return False, Reason.COMPILE_FAILED, "nothing to serve: the compile failed"
        return False, Reason.WAITING_FOR_ARTIFACT, f"no replicas until {given.target.name} is compiled"
    if spec.desired_replicas == 0:
        return True, Reason.SCALED_TO_ZERO, "0 replicas requested"
    if deployment.ready > 0:
        return True, Reason.MINIMUM_REPLICAS_AVAILABLE, f"{deployment.ready}/{spec.desired_replicas} replicas ready"
    if given.unschedulable:
        return False, Reason.INSUFFICIENT_NEURON_CAPACITY, given.unschedulable[0]
    return False, Reason.NO_REPLICAS_READY, f"0/{spec.desired_replicas} replicas ready"


def _canary_condition(
    trial: api.CanaryStatus, spec: api.NeuronInferenceServiceSpec, serving: str | None
) -> tuple[bool, Reason, str] | None:
    """The Ready condition while a canary runs or after it was aborted; None once promoted."""
    steps = spec.rollout.canary.steps if spec.rollout.canary is not None else []
    if trial.phase == "Aborted":
        return (
            False,
            Reason.CANARY_ABORTED,
            f"canary {trial.revision} aborted: {trial.analysis}; revision {serving} serves",
        )
    if trial.phase != "Progressing":
        return None
    where = (
        f"canary {trial.revision} at step {trial.step + 1}/{len(steps)} ({trial.weight}%): {trial.canary_replicas} "
        f"replicas beside {trial.stable_replicas} of revision {serving}"
    )
    if trial.step_started_at is None:
        # What the step's pause waits for: a router pod that cannot be scheduled holds it (docs/operator.md).
        waits = "its replicas Ready" + (" and every router pod on its split" if spec.routing is not None else "")
        return False, Reason.CANARY_PROGRESSING, f"{where}, starting: its pause begins with {waits}"
    return False, Reason.CANARY_PROGRESSING, f"{where}; {trial.analysis or 'no canary replica answered yet'}"


def _ready_condition(given: ServiceStatusInput) -> tuple[bool, Reason, str]:
    target, deployment, spec = given.target, given.deployment, given.spec
    serving = deployment.artifact_hash if deployment is not None and deployment.ready > 0 else None
    if target.phase == "Failed":
        failure = f"compile of {target.name} failed: {target.reason}: {target.message}"
        if serving is not None and serving != target.hash:
            return False, Reason.BLOCKED_BY_FAILED_COMPILE, f"{failure}; revision {serving} keeps serving"
        return False, Reason.COMPILE_FAILED, failure
    if target.phase != "Ready":
        if serving is not None and serving != target.hash:
            return False, Reason.COMPILING, f"{target.name} is compiling; revision {serving} keeps serving"
        return False, Reason.COMPILING, f"{target.name} is compiling"
    trial = given.canary
    if trial is not None and trial.revision == target.hash and serving != target.hash:
        during = _canary_condition(trial, spec, serving)
        if during is not None:
            return during
    if given.unschedulable:
        return False, Reason.INSUFFICIENT_NEURON_CAPACITY, given.unschedulable[0]
    if (
        deployment is not None
        and deployment.rolled_out
        and deployment.artifact_hash == target.hash
        and deployment.replicas == spec.desired_replicas
        and deployment.ready >= spec.desired_replicas
    ):
        return (
            True,
            Reason.READY,
            f"{spec.desired_replicas}/{spec.desired_replicas} replicas ready at revision {target.hash}",
        )
    updated = deployment.updated if deployment is not None and deployment.artifact_hash == target.hash else 0
    ready = deployment.ready if deployment is not None else 0
    return (
        False,
        Reason.ROLLING_OUT,
        f"{updated}/{spec.desired_replicas} replicas at revision {target.hash}, {ready} ready",
    )


def _autoscaling_condition(autoscaling: api.Autoscaling, state: scaling.ScalingState) -> tuple[bool, Reason, str]:
    if state.problem is not None:
        return False, Reason.AUTOSCALING_UNAVAILABLE, state.problem
    bounds = f"between {autoscaling.min_replicas} and {autoscaling.max_replicas} replicas"
    if state.paused:
        return False, Reason.SCALING_PAUSED, f"paused until a revision is compiled and serving ({bounds})"
    return True, Reason.SCALING, f"KEDA scales {bounds} on {scaling.signals(autoscaling)}"


def _routing_condition(name: str, routing: api.Routing | None, state: RoutingState) -> tuple[bool, Reason, str]:
    if not state.pool_served:
        missing = "the cluster serves no InferencePool (inference.networking.k8s.io/v1): install its CRD"
        if routing is not None:
            return False, Reason.ROUTING_UNAVAILABLE, f"{missing} to run the Endpoint Picker; Service {name} serves"
        return False, Reason.POOL_UNAVAILABLE, f"{missing} to route through a Gateway's Endpoint Picker"
    if routing is None:
        return (
            True,
            Reason.POOL_READY,
            f"InferencePool {name} selects the serving pods: a Gateway's HTTPRoute can use it",
        )
    pods = f"{state.ready}/{routing.replicas} router pods ready"
    if state.ready >= routing.replicas:
        return (
            True,
            Reason.PICKER_READY,
            f"send requests to Service {plan.router_name(name)}: the picker chooses ({pods})",
        )
    return False, Reason.PICKER_STARTING, f"the Endpoint Picker and its Envoy are starting ({pods})"


#: A valid service's phase, by its Ready condition's reason.
_PHASES: dict[Reason, api.ServicePhase] = {
    Reason.READY: "Ready",
    Reason.COMPILING: "Compiling",
    Reason.COMPILE_FAILED: "CompileFailed",
    Reason.BLOCKED_BY_FAILED_COMPILE: "Blocked",
    Reason.INSUFFICIENT_NEURON_CAPACITY: "Unschedulable",
    Reason.ROLLING_OUT: "RollingOut",
    Reason.CANARY_PROGRESSING: "Canary",
    Reason.CANARY_ABORTED: "CanaryAborted",
}


def service_status(
    given: ServiceStatusInput, previous: api.NeuronInferenceServiceStatus, at: datetime.datetime
) -> tuple[api.NeuronInferenceServiceStatus, list[Event]]:
    """The status of a valid service, and the events its transitions call for."""
    generation = given.generation
    ready = _ready_condition(given)
    updates = [
        condition(ConditionType.VALIDATED, True, Reason.VALID, "the spec passed validation", generation, at),
        condition(ConditionType.ARTIFACT_READY, *_artifact_condition(given.target), generation, at),
        condition(ConditionType.AVAILABLE, *_available_condition(given), generation, at),
        condition(ConditionType.READY, *ready, generation, at),
    ]
    autoscaling = given.spec.autoscaling
    if autoscaling is not None and given.autoscaling_state is not None:
        state = _autoscaling_condition(autoscaling, given.autoscaling_state)
        updates.append(condition(ConditionType.AUTOSCALING, *state, generation, at))
    if given.routing_state is not None:
        routing = _routing_condition(given.name, given.spec.routing, given.routing_state)
        updates.append(condition(ConditionType.ROUTING, *routing, generation, at))
    if given.health is not None:
        updates.append(health.degraded_condition(given.health, generation, at))
    conditions = merge_conditions(previous.conditions, updates)
    if autoscaling is None:
        conditions = [c for c in conditions if c.type != ConditionType.AUTOSCALING]
    deployment = given.deployment
    status = api.NeuronInferenceServiceStatus(
        phase=_PHASES[ready[1]],
        conditions=conditions,
        observed_generation=generation,
        artifact=api.ArtifactStatusRef(name=given.target.name, hash=given.target.hash, phase=given.target.phase),
        desired_replicas=given.spec.desired_replicas,
        replicas=deployment.total if deployment else 0,
        ready_replicas=deployment.ready if deployment else 0,
        updated_replicas=deployment.updated if deployment and deployment.artifact_hash == given.target.hash else 0,
        current_revision=given.decision.current_revision,
        target_revision=given.target.hash,
        previous_revisions=list(given.decision.previous_revisions),
        selector=",".join(f"{k}={v}" for k, v in plan.service_labels(given.name).items()),
        canary=given.canary,
    )
    return status, transitions(previous.conditions, conditions)


def invalid_status(
    message: str,
    reason: Reason,
    generation: int,
    previous: api.NeuronInferenceServiceStatus,
    at: datetime.datetime,
) -> tuple[api.NeuronInferenceServiceStatus, list[Event]]:
    """Validated=False with the exact validation message; what serves (if anything) is left alone."""
    updates = [
        condition(ConditionType.VALIDATED, False, reason, message, generation, at),
        condition(ConditionType.READY, False, reason, message, generation, at),
    ]
    conditions = merge_conditions(previous.conditions, updates)
    status = previous.model_copy(
        update={"phase": "Invalid", "conditions": conditions, "observed_generation": generation}
    )
    return status, transitions(previous.conditions, conditions)


def unschedulable_messages(pods: list[Obj]) -> tuple[str, ...]:
    """The scheduler's reasons for serving pods it cannot place (not enough Neuron devices or nodes)."""
    messages = []
    for pod in pods:
        if pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        for c in pod.get("status", {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
                messages.append(f"pod {pod['metadata']['name']} unschedulable: {c.get('message', '')}".strip())
    return tuple(sorted(messages))
