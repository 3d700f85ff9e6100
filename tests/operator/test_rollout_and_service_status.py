"""Rollout decisions and service status, from observations alone."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from neuronfleet.operator import api
from neuronfleet.operator.policy.conditions import Reason
from neuronfleet.operator.policy.rollout import (
    ArtifactView,
    Decision,
    DeploymentView,
    Serve,
    decide,
    revision_history,
    rollout_state,
    serve,
)
from neuronfleet.operator.policy.service_status import (
    ServiceStatusInput,
    invalid_status,
    service_status,
    unschedulable_messages,
)

T0 = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)
SPEC = api.parse_service_spec({"model": {"uri": "hf://org/model"}, "replicas": 2})

CANARY_SPEC = api.parse_service_spec(
    {
        "model": {"uri": "hf://org/model"},
        "replicas": 2,
        "rollout": {"canary": {"steps": [{"weight": 10}, {"weight": 50}]}},
    }
)

NEW = ArtifactView("model-new", "new", "Ready")
OLD = "old"


def artifact(phase: api.ArtifactPhase, reason: str | None = None, message: str | None = None) -> ArtifactView:
    return ArtifactView("model-new", "new", phase, reason, message)


def deployment(artifact_hash: str = OLD, *, replicas: int = 2, ready: int = 2, **status: int) -> DeploymentView:
    values = {"total": replicas, "updated": replicas, "available": ready, "generation": 3, "observed_generation": 3}
    values.update(status)
    inputs = frozenset({f"svc-engine-{artifact_hash}"})
    return DeploymentView(artifact_hash=artifact_hash, pod_inputs=inputs, replicas=replicas, ready=ready, **values)


def status_of(
    target: ArtifactView,
    dep: DeploymentView | None,
    *,
    unschedulable: tuple[str, ...] = (),
    previous: api.NeuronInferenceServiceStatus | None = None,
    at: datetime.datetime = T0,
    trial: api.CanaryStatus | None = None,
    spec: api.NeuronInferenceServiceSpec | None = None,
) -> tuple[api.NeuronInferenceServiceStatus, list[Any]]:
    given = ServiceStatusInput(
        name="svc",
        generation=4,
        spec=spec or (CANARY_SPEC if trial is not None else SPEC),
        target=target,
        deployment=dep,
        unschedulable=unschedulable,
        decision=decide(target, dep, previous.current_revision if previous else None),
        canary=trial,
    )
    return service_status(given, previous or api.NeuronInferenceServiceStatus(), at)


def condition(status: api.NeuronInferenceServiceStatus, type_: str) -> tuple[str, str]:
    (found,) = [c for c in status.conditions if c.type == type_]
    return found.status, found.reason


# decide()


def test_nothing_is_served_before_the_first_artifact_is_ready() -> None:
    decision = decide(artifact("Compiling"), None, None)
    assert decision == Decision(Serve.NOTHING, frozenset({"new"}), frozenset(), None)


def test_a_ready_artifact_is_rolled_out() -> None:
    assert decide(NEW, None, None).serve is Serve.TARGET
    assert decide(NEW, deployment(OLD), OLD).serve is Serve.TARGET


@pytest.mark.parametrize("phase", ["Pending", "Compiling", "Failed"])
def test_the_serving_revision_is_kept_until_the_new_artifact_is_ready(phase: api.ArtifactPhase) -> None:
    decision = decide(artifact(phase), deployment(OLD), OLD)
    assert decision.serve is Serve.KEEP
    # Both stay claimed: the old one serves, the new one is wanted.
    assert decision.keep == frozenset({"new", OLD})


def test_nothing_is_released_while_a_rollout_is_in_flight() -> None:
    rolling = deployment("new", total=3, updated=1)
    decision = decide(NEW, rolling, OLD)
    assert decision.keep is None
    assert decision.current_revision == OLD


def test_a_finished_rollout_moves_the_current_revision() -> None:
    decision = decide(NEW, deployment("new"), OLD)
    assert decision.keep == frozenset({"new"})
    assert decision.keep_pod_inputs == frozenset({"svc-engine-new"})
    assert decision.current_revision == "new"


def test_a_finished_rollout_keeps_the_revision_it_replaced_for_a_rollback() -> None:
    decision = decide(NEW, deployment("new"), OLD, ["older"], history_limit=2)
    assert decision.previous_revisions == (OLD, "older")
    assert decision.keep == frozenset({"new", OLD, "older"})
    # Its engine ConfigMap goes all the same: a rollback applies it again.
    assert decision.keep_pod_inputs == frozenset({"svc-engine-new"})


@pytest.mark.parametrize(
    ("previous", "served", "current", "limit", "history"),
    [
        ((), None, "a", 2, ()),  # the first rollout: nothing served before
        ((), "a", "a", 2, ()),  # no change
        (("x",), "a", "b", 2, ("a", "x")),
        (("x", "y"), "a", "b", 2, ("a", "x")),  # the oldest falls out
        (("b", "x"), "a", "b", 2, ("a", "x")),  # a rollback to b: b serves again, out of the history
        (("x",), "a", "b", 0, ()),  # no history: every replaced artifact goes
        (("x", "y"), "a", "a", 1, ("x",)),  # a lower limit takes effect at once
    ],
)
def test_the_history_is_newest_first_without_the_current_revision(
    previous: tuple[str, ...], served: str | None, current: str, limit: int, history: tuple[str, ...]
) -> None:
    assert revision_history(previous, served, current, limit) == history


def test_the_history_stays_while_a_rollout_is_in_flight_and_without_a_deployment() -> None:
    rolling = decide(NEW, deployment("new", total=3, updated=1), OLD, ["x", "y"], history_limit=1)
    assert rolling.previous_revisions == ("x",)
    first = decide(NEW, None, None, ["x"], history_limit=2)
    assert (first.keep, first.previous_revisions) == (frozenset({"new", "x"}), ("x",))


def test_rolled_out_needs_the_controller_to_have_seen_the_latest_generation() -> None:
    assert deployment(observed_generation=3, generation=3).rolled_out
    assert not deployment(observed_generation=2, generation=3).rolled_out
    assert not deployment(total=3).rolled_out  # an old replica is still there
    assert not deployment(available=1).rolled_out


# service_status()


def test_first_compile() -> None:
    status, events = status_of(artifact("Compiling", "Running", "attempt 1 of 3"), None)
    assert status.phase == "Compiling"
    assert condition(status, "Validated") == ("True", "Valid")
    assert condition(status, "ArtifactReady") == ("False", "Compiling")
    assert condition(status, "Available") == ("False", "WaitingForArtifact")
    assert condition(status, "Ready") == ("False", "Compiling")
    assert (status.target_revision, status.current_revision) == ("new", None)
    assert status.artifact == api.ArtifactStatusRef(name="model-new", hash="new", phase="Compiling")
    assert status.observed_generation == 4
    assert status.selector == "neuronfleet.io/service=svc"
    assert [e.reason for e in events] == ["Valid", "Compiling"]


def test_a_compile_in_trouble_shows_its_reason_in_artifact_ready() -> None:
    refused = artifact("Compiling", "FailedCreate", "compile Job model-new-compile cannot create its pod: forbidden")
    status, _ = status_of(refused, None)
    (artifact_ready,) = [c for c in status.conditions if c.type == "ArtifactReady"]
    assert (artifact_ready.status, artifact_ready.reason, status.phase) == ("False", "Compiling", "Compiling")
    assert (
        artifact_ready.message
        == "model-new: FailedCreate: compile Job model-new-compile cannot create its pod: forbidden"
    )
    # A compile going as it should shows its progress alone.
    running, _ = status_of(artifact("Compiling", "Running", "attempt 1 of 3"), None)
    assert [c.message for c in running.conditions if c.type == "ArtifactReady"] == ["model-new: attempt 1 of 3"]


def test_rolling_out_then_ready() -> None:
    rolling, _ = status_of(NEW, deployment("new", ready=1, updated=1, total=2, available=1))
    assert rolling.phase == "RollingOut"
    assert condition(rolling, "Available") == ("True", "MinimumReplicasAvailable")
    ready, events = status_of(NEW, deployment("new"), previous=rolling, at=T1)
    assert ready.phase == "Ready"
    assert condition(ready, "Ready") == ("True", "Ready")
    assert (ready.ready_replicas, ready.updated_replicas, ready.current_revision) == (2, 2, "new")
    assert [e.reason for e in events] == ["Ready"]


def test_a_canary_is_progressing_beside_the_stable_revision_then_aborted_with_its_figures() -> None:
    trial = api.CanaryStatus(revision="new", phase="Progressing", weight=10, canary_replicas=1, stable_replicas=2)
    starting, _ = status_of(NEW, deployment(OLD), trial=trial)
    assert starting.phase == "Canary"
    assert condition(starting, "Ready") == ("False", "CanaryProgressing")
    ready = next(c for c in starting.conditions if c.type == "Ready")
    assert ready.message == (
        "canary new at step 1/2 (10%): 1 replicas beside 2 of revision old, starting: its pause begins with its "
        "replicas Ready"
    )
    # Behind a router, the step waits for the router pods too: one that cannot be scheduled holds it.
    routed = CANARY_SPEC.model_copy(update={"routing": api.Routing()})
    behind, _ = status_of(NEW, deployment(OLD), trial=trial, spec=routed)
    assert next(c for c in behind.conditions if c.type == "Ready").message.endswith(
        "starting: its pause begins with its replicas Ready and every router pod on its split"
    )
    assert starting.canary == trial
    assert starting.current_revision == OLD
    broken = "limits broken: TTFT p99 900 ms = 9.00x the stable's 100 ms (over 120 canary and 900 stable completions)"
    aborted_trial = trial.model_copy(update={"phase": "Aborted", "canary_replicas": 0, "analysis": broken})
    aborted, events = status_of(NEW, deployment(OLD), trial=aborted_trial, previous=starting, at=T1)
    assert aborted.phase == "CanaryAborted"
    assert condition(aborted, "Ready") == ("False", "CanaryAborted")
    (event,) = [e for e in events if e.reason == "CanaryAborted"]
    assert event.type == "Warning"
    assert event.message == f"Ready=False: canary new aborted: {broken}; revision old serves"


def test_a_promoted_canary_rolls_out_as_any_revision() -> None:
    trial = api.CanaryStatus(revision="new", phase="Promoted", step=2, weight=100)
    rolling, _ = status_of(NEW, deployment("new", ready=1, updated=1, total=2, available=1), trial=trial)
    assert rolling.phase == "RollingOut"
    assert rolling.canary == trial


def test_a_new_compile_keeps_the_old_revision_serving() -> None:
    status, _ = status_of(artifact("Compiling"), deployment(OLD), previous=api.NeuronInferenceServiceStatus())
    assert status.phase == "Compiling"
    assert condition(status, "Available") == ("True", "MinimumReplicasAvailable")
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert "revision old keeps serving" in ready.message
    assert status.updated_replicas == 0


def test_a_failed_compile_blocks_but_the_old_revision_serves() -> None:
    failed = artifact("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    status, events = status_of(failed, deployment(OLD))
    assert status.phase == "Blocked"
    assert condition(status, "Ready") == ("False", "BlockedByFailedCompile")
    assert condition(status, "ArtifactReady") == ("False", "CompileFailed")
    assert condition(status, "Available") == ("True", "MinimumReplicasAvailable")
    blocked = next(c for c in status.conditions if c.type == "Ready")
    assert "BackoffLimitExceeded" in blocked.message
    assert {e.type for e in events if e.reason in {"CompileFailed", "BlockedByFailedCompile"}} == {"Warning"}


def test_a_failed_first_compile_has_nothing_to_serve() -> None:
    status, _ = status_of(artifact("Failed", "DeadlineExceeded", "Job was active longer than specified"), None)
    assert status.phase == "CompileFailed"
    assert condition(status, "Ready") == ("False", "CompileFailed")
    assert condition(status, "Available") == ("False", "CompileFailed")


def test_unschedulable_pods_say_insufficient_neuron_capacity() -> None:
    message = "pod svc-1 unschedulable: 0/5 nodes are available: 2 Insufficient aws.amazon.com/neuron"
    status, events = status_of(NEW, deployment("new", ready=0, available=0), unschedulable=(message,))
    assert status.phase == "Unschedulable"
    assert condition(status, "Ready") == ("False", "InsufficientNeuronCapacity")
    assert condition(status, "Available") == ("False", "InsufficientNeuronCapacity")
    assert any(e.type == "Warning" and message in e.message for e in events)


def test_losing_availability_is_a_warning_but_starting_up_is_not_noise() -> None:
    serving, _ = status_of(NEW, deployment("new"))
    down, events = status_of(NEW, deployment("new", ready=0, available=0), previous=serving, at=T1)
    assert condition(down, "Available") == ("False", "NoReplicasReady")
    assert ("Warning", "NoReplicasReady") in [(e.type, e.reason) for e in events]


def test_transition_times_move_only_when_the_status_flips() -> None:
    first, _ = status_of(artifact("Compiling"), None, at=T0)
    again, events = status_of(artifact("Compiling"), None, previous=first, at=T1)
    assert again == first
    assert events == []
    ready, _ = status_of(NEW, deployment("new"), previous=first, at=T1)
    times = {c.type: c.last_transition_time for c in ready.conditions}
    assert times == {"Validated": T0, "ArtifactReady": T1, "Available": T1, "Ready": T1}


def test_invalid_spec_keeps_what_serves_and_says_why() -> None:
    serving, _ = status_of(NEW, deployment("new"))
    message = "spec.engine.num_seqs_buckets: Last bucket in num_seqs_buckets must equal max_num_seqs (8), got 4"
    status, events = invalid_status(message, Reason.INVALID_BUCKETS, 5, serving, T1)
    assert status.phase == "Invalid"
    assert condition(status, "Validated") == ("False", "InvalidBuckets")
    assert next(c for c in status.conditions if c.type == "Validated").message == message
    assert (status.ready_replicas, status.current_revision, status.observed_generation) == (2, "new", 5)
    assert [(e.type, e.reason) for e in events] == [("Warning", "InvalidBuckets")]


def test_unschedulable_messages_come_from_the_scheduler() -> None:
    pods = [
        {
            "metadata": {"name": "a"},
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/5 nodes"}
                ]
            },
        },
        {"metadata": {"name": "b"}, "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}},
        {
            "metadata": {"name": "c", "deletionTimestamp": "2026-11-30T00:00:00Z"},
            "status": {"conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]},
        },
    ]
    assert unschedulable_messages(pods) == ("pod a unschedulable: 0/5 nodes",)


def test_the_rollout_is_decided_on_the_artifact_and_whether_a_deployment_exists() -> None:
    assert serve(NEW, None) is Serve.TARGET
    assert serve(NEW, deployment(OLD)) is Serve.TARGET
    assert serve(artifact("Compiling"), deployment(OLD)) is Serve.KEEP
    assert serve(artifact("Failed"), None) is Serve.NOTHING


def test_a_deployments_rollout_state_moves_with_its_generation_and_counts_not_its_conditions_times() -> None:
    def deployment(generation: int, ready: int, updated_at: str) -> dict[str, Any]:
        condition = {
            "type": "Progressing",
            "status": "True",
            "lastUpdateTime": updated_at,
            "reason": "ReplicaSetUpdated",
        }
        return {
            "metadata": {"name": "llama", "generation": generation},
            "status": {"observedGeneration": generation, "readyReplicas": ready, "conditions": [condition]},
        }

    state = rollout_state(deployment(2, 1, "12:00:00"))
    # The controller stamping its progress again: nothing a reconcile reads.
    assert rollout_state(deployment(2, 1, "12:00:05")) == state
    # A replica Ready, or a new template or replica count (the generation): the service must look.
    assert rollout_state(deployment(2, 2, "12:00:05")) != state
    assert rollout_state(deployment(3, 1, "12:00:00")) != state
