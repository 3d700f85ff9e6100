"""The real garbage collector removes what an owner owned."""

from __future__ import annotations

from kubernetes.client import AppsV1Api, CoreV1Api, V1Deployment

from neuronfleet.devcluster.process.waiting import WaitFor


def test_deleting_an_owner_collects_its_dependents(
    core: CoreV1Api, apps: AppsV1Api, namespace: str, wait_for: WaitFor
) -> None:
    apps.create_namespaced_deployment(
        namespace,
        V1Deployment.model_validate(
            {
                "metadata": {"name": "owner"},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "owner"}},
                    "template": {
                        "metadata": {"labels": {"app": "owner"}},
                        "spec": {"containers": [{"name": "main", "image": "example.invalid/x:1"}]},
                    },
                },
            }
        ),
    )
    wait_for(
        lambda: core.list_namespaced_pod(namespace, label_selector="app=owner").to_dict()["items"],
        lambda pods: len(pods) == 2,
        what="the Deployment's 2 pods",
    )
    [replica_set] = apps.list_namespaced_replica_set(namespace, label_selector="app=owner").to_dict()["items"]
    assert [owner["name"] for owner in replica_set["metadata"]["owner_references"]] == ["owner"]

    apps.delete_namespaced_deployment("owner", namespace, propagation_policy="Background")

    wait_for(
        lambda: (
            [rs["metadata"]["name"] for rs in apps.list_namespaced_replica_set(namespace).to_dict()["items"]],
            [p["metadata"]["name"] for p in core.list_namespaced_pod(namespace).to_dict()["items"]],
        ),
        lambda left: left == ([], []),
        what="the ReplicaSet and its pods to be garbage-collected",
    )
