"""An artifact's status from its compile Job, and condition bookkeeping."""

from __future__ import annotations

import datetime
from typing import Any

from neuronfleet.operator import api
from neuronfleet.operator.policy.artifact_status import artifact_status, awaiting_pod
from neuronfleet.operator.policy.conditions import ConditionType, Reason, condition, merge_conditions, transitions
from neuronfleet.operator.reconcilers.status_writer import merge_patch

SPEC = api.NeuronCompiledArtifactSpec.model_validate(
    {
        "model": {"uri": "hf://org/model", "revision": "abc"},
        "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 512, "max_model_len": 512},
        "target": "trn2",
        "image": "neuronfleet/engine:0.1.0",
        "compile": {"artifactStore": "s3://neff-bucket/prod", "backoffLimit": 2},
    }
)
EMPTY = api.NeuronCompiledArtifactStatus()
T0 = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC)


def job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "model-x-compile"}, "status": status}


def failed_pod(message: str | None, finished: str) -> dict[str, Any]:
    terminated = {"exitCode": 1, "reason": "Error", "finishedAt": finished}
    if message:
        terminated["message"] = message
    return {"status": {"containerStatuses": [{"name": "compile", "state": {"terminated": terminated}}]}}


def test_no_job_yet_is_pending_with_every_bucket_listed() -> None:
    status = artifact_status(SPEC, None, [], EMPTY, 1)
    assert status.phase == "Pending"
    assert [(b.kind, b.size) for b in status.buckets] == [
        ("prefill", 128),
        ("prefill", 256),
        ("prefill", 512),
        ("decode", 1),
        ("decode", 2),
        ("decode", 4),
    ]
    assert status.location == f"s3://neff-bucket/prod/{SPEC.hash()}"
    assert status.hash == SPEC.hash()


def test_a_running_job_is_compiling_and_counts_attempts() -> None:
    status = artifact_status(SPEC, job(active=1, failed=1, startTime="2026-11-30T12:00:00Z"), [], EMPTY, 1)
    assert (status.phase, status.reason, status.attempts) == ("Compiling", "Running", 2)
    assert status.message == "compile Job model-x-compile: attempt 2 of 3"
    assert status.started_at == T0


def test_a_complete_job_makes_the_artifact_ready() -> None:
    done = job(
        succeeded=1,
        completionTime="2026-11-30T12:05:00Z",
        conditions=[{"type": "Complete", "status": "True"}],
    )
    status = artifact_status(SPEC, done, [], EMPTY, 1)
    assert status.phase == "Ready"
    assert {b.state for b in status.buckets} == {"Compiled"}
    assert status.completed_at == T0 + datetime.timedelta(minutes=5)


def test_a_failed_job_carries_its_reason_and_the_compilers_last_words() -> None:
    failed = job(
        failed=3,
        conditions=[
            {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
                "lastTransitionTime": "2026-11-30T12:10:00Z",
            }
        ],
    )
    pods = [failed_pod("bucket 512: out of memory", "2026-11-30T12:09:00Z"), failed_pod(None, "2026-11-30T12:01:00Z")]
    status = artifact_status(SPEC, failed, pods, EMPTY, 1)
    assert (status.phase, status.reason, status.attempts) == ("Failed", "BackoffLimitExceeded", 3)
    assert status.message == "Job has reached the specified backoff limit; last compile pod: bucket 512: out of memory"


def waiting_pod(reason: str, message: str) -> dict[str, Any]:
    waiting = {"reason": reason, "message": message}
    statuses = [{"state": {"waiting": waiting}}]
    return {"metadata": {"name": "model-x-compile-abc"}, "status": {"containerStatuses": statuses}}


def test_a_compile_pod_that_cannot_start_says_why() -> None:
    missing = waiting_pod("CreateContainerConfigError", 'secret "neff-keys" not found')
    status = artifact_status(SPEC, job(active=1), [missing], EMPTY, 1)
    assert (status.phase, status.reason) == ("Compiling", "CreateContainerConfigError")
    assert status.message == 'compile pod model-x-compile-abc cannot start: secret "neff-keys" not found'
    # A container merely being created is no reason to worry.
    creating = waiting_pod("ContainerCreating", "")
    assert artifact_status(SPEC, job(active=1), [creating], EMPTY, 1).reason == "Running"


REFUSED = (
    'Error creating: pods "model-x-compile-abc" is forbidden: error looking up service account '
    'llm/neff-writer: serviceaccount "neff-writer" not found'
)


def refusal(job_uid: str, last: str) -> dict[str, Any]:
    """The Job controller's event for a pod the API server refused."""
    return {
        "reason": "FailedCreate",
        "type": "Warning",
        "message": REFUSED,
        "involvedObject": {"kind": "Job", "name": "model-x-compile", "uid": job_uid},
        "lastTimestamp": last,
    }


def pod_created(at: str) -> dict[str, Any]:
    return {"metadata": {"name": "model-x-compile-def", "creationTimestamp": at}, "status": {}}


def test_a_compile_job_whose_pod_is_refused_says_why() -> None:
    refused_job = job(startTime="2026-11-30T12:00:00Z")
    refused_job["metadata"]["uid"] = "job-1"
    events = [refusal("job-1", "2026-11-30T12:00:05Z")]
    status = artifact_status(SPEC, refused_job, [], EMPTY, 1, events)
    assert (status.phase, status.reason) == ("Compiling", "FailedCreate")
    assert status.message == f"compile Job model-x-compile cannot create its pod: {REFUSED}"
    # An earlier Job of the same name, deleted for a retry, left its events behind: they are not this Job's.
    assert artifact_status(SPEC, refused_job, [], EMPTY, 1, [refusal("job-0", "2026-11-30T12:00:05Z")]).reason == (
        "Starting"
    )
    # Mended (the ServiceAccount now exists): a pod made since the refusal, and the Job goes on.
    mended = artifact_status(SPEC, refused_job, [pod_created("2026-11-30T12:00:05Z")], EMPTY, 1, events)
    assert mended.reason == "Starting"
    # A refusal after the last pod (a retry's pod refused, e.g. by a quota) counts again.
    again = artifact_status(SPEC, refused_job, [pod_created("2026-11-30T12:00:00Z")], EMPTY, 1, events)
    assert again.reason == "FailedCreate"


def test_events_are_asked_for_only_while_a_job_has_no_pod_running() -> None:
    assert awaiting_pod(job(startTime="2026-11-30T12:00:00Z"))
    assert awaiting_pod(job(failed=1))  # between a failed attempt and the next pod
    assert not awaiting_pod(job(active=1))
    assert not awaiting_pod(job(failed=1, conditions=[{"type": "Failed", "status": "True"}]))
    assert not awaiting_pod(job(succeeded=1, conditions=[{"type": "Complete", "status": "True"}]))


def test_a_ready_artifact_stays_ready_when_its_job_is_deleted() -> None:
    ready = artifact_status(SPEC, job(succeeded=1, conditions=[{"type": "Complete", "status": "True"}]), [], EMPTY, 1)
    assert artifact_status(SPEC, None, [], ready, 1) == ready


def test_a_failed_artifact_whose_job_is_deleted_goes_back_to_pending() -> None:
    failed = api.NeuronCompiledArtifactStatus(phase="Failed", reason="BackoffLimitExceeded")
    assert artifact_status(SPEC, None, [], failed, 1).phase == "Pending"


def test_merge_keeps_order_and_transition_times() -> None:
    old = [
        condition(ConditionType.READY, False, Reason.COMPILING, "", 1, T0),
        condition(ConditionType.VALIDATED, True, Reason.VALID, "", 1, T0),
    ]
    later = T0 + datetime.timedelta(hours=1)
    merged = merge_conditions(old, [condition(ConditionType.VALIDATED, True, Reason.VALID, "", 2, later)])
    assert [c.type for c in merged] == ["Validated", "Ready"]
    assert merged[0].last_transition_time == T0
    assert merged[0].observed_generation == 2


def test_transitions_post_each_new_reason_once() -> None:
    before = [condition(ConditionType.READY, False, Reason.COMPILING, "", 1, T0)]
    after = [
        condition(ConditionType.ARTIFACT_READY, False, Reason.COMPILE_FAILED, "oom", 1, T0),
        condition(ConditionType.READY, False, Reason.COMPILE_FAILED, "oom", 1, T0),
    ]
    events = transitions(before, after)
    assert [(e.type, e.reason, e.message) for e in events] == [("Warning", "CompileFailed", "ArtifactReady=False: oom")]


def test_the_status_patch_removes_what_is_gone_at_any_depth() -> None:
    old = {"phase": "Canary", "canary": {"step": 0, "stepStartedAt": "2026-12-05T06:08:48Z"}, "selector": "a=b"}
    new = {"phase": "Canary", "canary": {"step": 1, "weight": 50}}
    patch = merge_patch(old, new)
    assert patch == {"selector": None, "phase": "Canary", "canary": {"stepStartedAt": None, "step": 1, "weight": 50}}
    assert applied(old, patch) == new


def applied(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies a merge patch."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            before = result.get(key)
            result[key] = applied(before if isinstance(before, dict) else {}, value)
        else:
            result[key] = value
    return result
