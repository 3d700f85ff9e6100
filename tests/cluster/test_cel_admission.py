"""CRD admission runs CEL rules and answers with the rule's message."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient, ApiextensionsV1Api, CustomObjectsApi, V1CustomResourceDefinition
from kubernetes.client.exceptions import ApiException

from neuronfleet.devcluster.process.waiting import WaitFor


@pytest.fixture
def bucket_crd(kube: ApiClient, namespace: str, wait_for: WaitFor) -> Iterator[tuple[str, str]]:
    """A namespaced CRD whose ``spec.buckets`` must ascend (a CEL rule); yields (group, plural)."""
    extensions = ApiextensionsV1Api(kube)
    group = f"{namespace}.test.neuronfleet.io"
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "buckets": {
                        "type": "array",
                        "maxItems": 16,
                        "items": {"type": "integer"},
                        "x-kubernetes-validations": [
                            {"rule": "self.isSorted()", "message": "buckets must be in ascending order"}
                        ],
                    }
                },
            }
        },
    }
    crd = V1CustomResourceDefinition.model_validate(
        {
            "metadata": {"name": f"bucketsets.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": "bucketsets", "singular": "bucketset", "kind": "BucketSet"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
            },
        }
    )
    extensions.create_custom_resource_definition(crd)
    wait_for(
        lambda: extensions.read_custom_resource_definition(f"bucketsets.{group}").to_dict()["status"]["conditions"],
        lambda conditions: any(c["type"] == "Established" and c["status"] == "True" for c in conditions or []),
        what="the CRD to be Established",
    )
    try:
        yield group, "bucketsets"
    finally:
        extensions.delete_custom_resource_definition(f"bucketsets.{group}")


def test_cel_rule_rejects_an_invalid_object_with_its_message(
    kube: ApiClient, namespace: str, bucket_crd: tuple[str, str], wait_for: WaitFor
) -> None:
    group, plural = bucket_crd
    custom = CustomObjectsApi(kube)

    def create(name: str, buckets: list[int]) -> object:
        body = {
            "apiVersion": f"{group}/v1",
            "kind": "BucketSet",
            "metadata": {"name": name},
            "spec": {"buckets": buckets},
        }
        return custom.create_namespaced_custom_object(group, "v1", namespace, plural, body)

    # The first create may race discovery of the new type; a valid object shows when it is served.
    wait_for(lambda: create("good", [1, 2, 4]), what="a valid BucketSet to be accepted")
    with pytest.raises(ApiException) as rejected:
        create("bad", [4, 2, 1])
    assert rejected.value.status == 422
    message = json.loads(rejected.value.body or "{}")["message"]
    assert "spec.buckets: Invalid value" in message
    assert "buckets must be in ascending order" in message
