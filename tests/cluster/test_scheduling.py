"""The fake Neuron nodes behave like real ones for the scheduler: capacity, taints, labels."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kubernetes.client import AppsV1Api, CoreV1Api, V1Deployment

from neuronfleet.contract.hardware import INSTANCE_TYPE_LABEL, NEURON_DEVICE_RESOURCE, NEURON_TAINT_KEY
from neuronfleet.devcluster.controlplane.fleet import POOL_LABEL
from neuronfleet.devcluster.controlplane.kwok import FAIL_ANNOTATION, READY_AFTER_ANNOTATION
from neuronfleet.devcluster.process.waiting import WaitFor

NEURON_TOLERATION = {"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}


def deployment(
    name: str,
    *,
    replicas: int = 1,
    neuron_devices: int = 0,
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
) -> V1Deployment:
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    if neuron_devices:
        resources["limits"] = {NEURON_DEVICE_RESOURCE: str(neuron_devices)}
    return V1Deployment.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}, "annotations": annotations or {}},
                    "spec": {
                        "containers": [{"name": "main", "image": "example.invalid/serve:1", "resources": resources}],
                        "tolerations": [NEURON_TOLERATION] if neuron_devices else [],
                        "nodeSelector": node_selector or {},
                    },
                },
            },
        }
    )


Pod = dict[str, Any]


def pods_of(core: CoreV1Api, namespace: str, app: str) -> Callable[[], list[Pod]]:
    return lambda: core.list_namespaced_pod(namespace, label_selector=f"app={app}").to_dict()["items"]


def condition(obj: Pod, kind: str) -> Pod | None:
    return next((c for c in obj["status"]["conditions"] or [] if c["type"] == kind), None)


def is_ready(pod: Pod) -> bool:
    ready = condition(pod, "Ready")
    return ready is not None and ready["status"] == "True"


def summary(pods: list[Pod]) -> list[tuple[str, str | None, str | None, bool]]:
    return [(p["metadata"]["name"], p["spec"]["node_name"], p["status"]["phase"], is_ready(p)) for p in pods]


def node_of(core: CoreV1Api, pod: Pod) -> Pod:
    return core.read_node(pod["spec"]["node_name"]).to_dict()


def test_neuron_deployment_runs_on_trn2_nodes(
    core: CoreV1Api, apps: AppsV1Api, namespace: str, wait_for: WaitFor
) -> None:
    apps.create_namespaced_deployment(
        namespace,
        deployment("serve", replicas=2, neuron_devices=8, node_selector={INSTANCE_TYPE_LABEL: "trn2.48xlarge"}),
    )

    pods: list[Pod] = wait_for(
        pods_of(core, namespace, "serve"),
        lambda pods: len(pods) == 2 and all(p["status"]["phase"] == "Running" and is_ready(p) for p in pods),
        what="2 Running, Ready pods",
        show=summary,
    )

    for pod in pods:
        node = node_of(core, pod)
        assert node["metadata"]["labels"][INSTANCE_TYPE_LABEL] == "trn2.48xlarge"
        assert node["status"]["allocatable"][NEURON_DEVICE_RESOURCE] == "16"
        assert node["status"]["allocatable"]["aws.amazon.com/neuroncore"] == "64"
    wait_for(
        lambda: apps.read_namespaced_deployment(namespace=namespace, name="serve").to_dict()["status"],
        lambda status: status["ready_replicas"] == 2,
        what="the Deployment to report 2 ready replicas",
    )


def test_inf2_node_offers_its_twelve_devices(
    core: CoreV1Api, apps: AppsV1Api, namespace: str, wait_for: WaitFor
) -> None:
    selector = {INSTANCE_TYPE_LABEL: "inf2.48xlarge"}
    apps.create_namespaced_deployment(namespace, deployment("inf", neuron_devices=12, node_selector=selector))

    pod: Pod = wait_for(
        pods_of(core, namespace, "inf"),
        lambda pods: len(pods) == 1 and pods[0]["status"]["phase"] == "Running",
        what="a Running pod",
        show=summary,
    )[0]

    node = node_of(core, pod)
    assert node["metadata"]["labels"][POOL_LABEL] == "inf2"
    assert node["status"]["allocatable"][NEURON_DEVICE_RESOURCE] == "12"
    assert node["status"]["allocatable"]["aws.amazon.com/neuroncore"] == "24"
    assert [t["key"] for t in node["spec"]["taints"]] == [NEURON_TAINT_KEY]


def test_more_devices_than_any_node_stays_pending(
    core: CoreV1Api, apps: AppsV1Api, namespace: str, wait_for: WaitFor
) -> None:
    apps.create_namespaced_deployment(namespace, deployment("huge", neuron_devices=17))

    pod: Pod = wait_for(
        pods_of(core, namespace, "huge"),
        lambda pods: len(pods) == 1 and (condition(pods[0], "PodScheduled") or {}).get("reason") == "Unschedulable",
        what="the pod to be marked Unschedulable",
        show=lambda pods: [p["status"] for p in pods],
    )[0]

    scheduled = condition(pod, "PodScheduled")
    assert scheduled is not None
    assert scheduled["status"] == "False"
    assert f"Insufficient {NEURON_DEVICE_RESOURCE}" in scheduled["message"]
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["node_name"] is None


def test_pods_without_neuron_requests_stay_off_neuron_nodes(
    core: CoreV1Api, apps: AppsV1Api, namespace: str, wait_for: WaitFor
) -> None:
    apps.create_namespaced_deployment(namespace, deployment("plain", replicas=4))

    pods: list[Pod] = wait_for(
        pods_of(core, namespace, "plain"),
        lambda pods: len(pods) == 4 and all(p["spec"]["node_name"] for p in pods),
        what="4 scheduled pods",
        show=summary,
    )

    pools = {node_of(core, p)["metadata"]["labels"][POOL_LABEL] for p in pods}
    assert pools == {"cpu"}, "the aws.amazon.com/neuron NoSchedule taint must keep them off trn2 and inf2"


def test_ready_after_annotation_delays_readiness(
    core: CoreV1Api, apps: AppsV1Api, namespace: str, wait_for: WaitFor
) -> None:
    apps.create_namespaced_deployment(namespace, deployment("slow", annotations={READY_AFTER_ANNOTATION: "3s"}))

    pod: Pod = wait_for(
        pods_of(core, namespace, "slow"),
        lambda pods: len(pods) == 1 and is_ready(pods[0]),
        what="the pod to turn Ready",
        show=summary,
    )[0]

    ready = condition(pod, "Ready")
    assert ready is not None
    # Timestamps have whole-second resolution.
    assert ready["last_transition_time"] - pod["status"]["start_time"] >= timedelta(seconds=2)


def test_failing_serving_pod_crash_loops(core: CoreV1Api, apps: AppsV1Api, namespace: str, wait_for: WaitFor) -> None:
    apps.create_namespaced_deployment(namespace, deployment("crash", annotations={FAIL_ANNOTATION: "true"}))

    pod: Pod = wait_for(
        pods_of(core, namespace, "crash"),
        lambda pods: (
            len(pods) == 1
            and bool(pods[0]["status"]["container_statuses"])
            and pods[0]["status"]["container_statuses"][0]["state"]["waiting"] is not None
        ),
        what="the container to be waiting",
        show=lambda pods: [p["status"]["container_statuses"] for p in pods],
    )[0]

    status = pod["status"]["container_statuses"][0]
    assert status["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert status["last_state"]["terminated"]["exit_code"] == 1
    assert status["restart_count"] == 1
    assert pod["status"]["phase"] == "Running"
    assert not is_ready(pod)
