"""REST paths of the thin client: core and named groups, namespaced and across namespaces."""

from __future__ import annotations

from neuronfleet.operator.kube import ARTIFACTS, CONFIGMAPS, DEPLOYMENTS, SERVICES_NIS


def test_core_and_group_paths() -> None:
    assert CONFIGMAPS.path("ns", "cm") == "/api/v1/namespaces/ns/configmaps/cm"
    assert DEPLOYMENTS.path("ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert SERVICES_NIS.path("ns", "svc", "status") == (
        "/apis/neuronfleet.io/v1alpha1/namespaces/ns/neuroninferenceservices/svc/status"
    )


def test_all_namespaces() -> None:
    assert ARTIFACTS.path(None) == "/apis/neuronfleet.io/v1alpha1/neuroncompiledartifacts"
    assert CONFIGMAPS.api_version == "v1"
    assert DEPLOYMENTS.api_version == "apps/v1"
