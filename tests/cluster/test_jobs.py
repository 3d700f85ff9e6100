"""Job pods run to completion (or failure) on the fake CPU pool, driven by the real Job controller."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kubernetes.client import BatchV1Api, CoreV1Api, V1Job

from neuronfleet.devcluster.controlplane.fleet import POOL_LABEL
from neuronfleet.devcluster.controlplane.kwok import COMPLETE_AFTER_ANNOTATION, FAIL_ANNOTATION
from neuronfleet.devcluster.process.waiting import WaitFor


def job(name: str, *, annotations: dict[str, str], backoff_limit: int = 0) -> V1Job:
    return V1Job.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "backoffLimit": backoff_limit,
                "template": {
                    "metadata": {"annotations": annotations},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "compile",
                                "image": "example.invalid/compile:1",
                                "resources": {"requests": {"cpu": "2"}},
                            }
                        ],
                    },
                },
            },
        }
    )


def condition(status: dict[str, Any], kind: str) -> tuple[str, str | None] | None:
    found = [c for c in status["conditions"] or [] if c["type"] == kind and c["status"] == "True"]
    return (found[0]["type"], found[0]["reason"]) if found else None


def job_status(batch: BatchV1Api, namespace: str, name: str) -> Callable[[], dict[str, Any]]:
    return lambda: batch.read_namespaced_job_status(name, namespace).to_dict()["status"]


def job_pods(core: CoreV1Api, namespace: str, name: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").to_dict()[
        "items"
    ]
    return pods


def test_job_completes_after_the_annotated_delay(
    core: CoreV1Api, batch: BatchV1Api, namespace: str, wait_for: WaitFor
) -> None:
    batch.create_namespaced_job(namespace, job("compile", annotations={COMPLETE_AFTER_ANNOTATION: "3s"}))

    status = wait_for(
        job_status(batch, namespace, "compile"),
        lambda status: condition(status, "Complete") is not None,
        timeout=60,
        what="the Job to complete",
    )

    assert status["succeeded"] == 1
    assert not status["failed"]
    [pod] = job_pods(core, namespace, "compile")
    assert pod["status"]["phase"] == "Succeeded"
    assert core.read_node(pod["spec"]["node_name"]).to_dict()["metadata"]["labels"][POOL_LABEL] == "cpu"
    terminated = pod["status"]["container_statuses"][0]["state"]["terminated"]
    assert terminated["exit_code"] == 0
    # Whole-second timestamps: the 3 s delay shows as at least 2.
    assert terminated["finished_at"] - terminated["started_at"] >= timedelta(seconds=2)


def test_failing_job_fails_after_its_backoff_limit(
    core: CoreV1Api, batch: BatchV1Api, namespace: str, wait_for: WaitFor
) -> None:
    batch.create_namespaced_job(namespace, job("broken", annotations={FAIL_ANNOTATION: "true"}, backoff_limit=1))

    # The Job controller waits ~10 s before the retry: the second pod fails too, and the Job gives up.
    status = wait_for(
        job_status(batch, namespace, "broken"),
        lambda status: condition(status, "Failed") is not None,
        timeout=60,
        what="the Job to fail",
    )

    assert condition(status, "Failed") == ("Failed", "BackoffLimitExceeded")
    assert status["failed"] == 2
    assert not status["succeeded"]
    pods = job_pods(core, namespace, "broken")
    assert [p["status"]["phase"] for p in pods] == ["Failed", "Failed"]
    assert {p["status"]["container_statuses"][0]["state"]["terminated"]["exit_code"] for p in pods} == {1}
