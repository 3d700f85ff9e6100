"""An artifact's status, pure: from its compile Job, the Job's pods and events."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from neuronfleet.operator import api, plan
from neuronfleet.operator.policy.conditions import Reason

Obj = dict[str, Any]


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
