"""RBAC is enforced: a ServiceAccount gets exactly what a Role grants it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes.client import (
    ApiClient,
    AuthenticationV1TokenRequest,
    Configuration,
    CoreV1Api,
    RbacAuthorizationV1Api,
    V1ConfigMap,
    V1Role,
    V1RoleBinding,
    V1ServiceAccount,
)
from kubernetes.client.exceptions import ApiException

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.process.waiting import WaitFor


@pytest.fixture
def token_client(cluster: LocalCluster, core: CoreV1Api, namespace: str) -> Iterator[ApiClient]:
    """A client authenticated as ServiceAccount ``reader`` (which starts with no rights)."""
    core.create_namespaced_service_account(namespace, V1ServiceAccount.model_validate({"metadata": {"name": "reader"}}))
    request = AuthenticationV1TokenRequest.model_validate({"spec": {"audiences": [], "expirationSeconds": 600}})
    token = core.create_namespaced_service_account_token("reader", namespace, request).to_dict()["status"]["token"]
    configuration = Configuration(
        host=cluster.server,
        ssl_ca_cert=str(cluster.state.workdir / "pki" / "ca.crt"),
        api_key={"BearerToken": token},
        api_key_prefix={"BearerToken": "Bearer"},
    )
    with ApiClient(configuration) as client:
        yield client


def test_rbac_denies_a_service_account_without_rights(
    kube: ApiClient, token_client: ApiClient, namespace: str, wait_for: WaitFor
) -> None:
    as_reader = CoreV1Api(token_client)
    with pytest.raises(ApiException) as denied:
        as_reader.list_namespaced_config_map(namespace)
    assert denied.value.status == 403
    assert f"system:serviceaccount:{namespace}:reader" in json.loads(denied.value.body or "{}")["message"]

    # Granting the verb makes the same call succeed: the token was good, the authorizer said no.
    rbac = RbacAuthorizationV1Api(kube)
    rbac.create_namespaced_role(
        namespace,
        V1Role.model_validate(
            {
                "metadata": {"name": "read-configmaps"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
            }
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        V1RoleBinding.model_validate(
            {
                "metadata": {"name": "reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
            }
        ),
    )
    wait_for(lambda: as_reader.list_namespaced_config_map(namespace), what="the granted list to be allowed")
    with pytest.raises(ApiException) as still_denied:
        as_reader.create_namespaced_config_map(namespace, V1ConfigMap.model_validate({"metadata": {"name": "x"}}))
    assert still_denied.value.status == 403
