"""Routing on a real control plane with fake nodes: the InferencePool of every service, the optional CRD,
the Endpoint Picker's objects that ``spec.routing`` adds and its removal takes away, and a canary's pool,
picker and split behind the router.

The picker and Envoy themselves run in ``tests/realnode/test_routing.py``; here the pods are KWOK's.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.services import Services

from neuronfleet.contract.names import HTTP_PORT, LABEL_ARTIFACT, LABEL_TRACK, TRACK_CANARY
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.addons.routing import install_gie_crds, remove_gie_crds
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.kwok import READY_AFTER_ANNOTATION
from neuronfleet.devcluster.controlplane.status import condition, phase_of
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator import plan
from neuronfleet.operator.cluster.kube import (
    CONFIGMAPS,
    DEPLOYMENTS,
    INFERENCE_POOLS,
    PDBS,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    SERVICES,
    SERVICES_NIS,
    Kube,
    Resource,
)

pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]
SPEC: Obj = {
    "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
    "engine": {"max_num_seqs": 8, "tensor_parallel_size": 4},
    "replicas": 1,
    "compile": {"artifactStore": "s3://neuronfleet-test/neff", "resources": {"cpu": "10m", "memory": "64Mi"}},
}
#: What the router of service "llama" is made of.
ROUTER = (
    (SERVICE_ACCOUNTS, "llama-epp"),
    (ROLES, "llama-epp"),
    (ROLE_BINDINGS, "llama-epp"),
    (CONFIGMAPS, "llama-router"),
    (DEPLOYMENTS, "llama-router"),
    (PDBS, "llama-router"),
    (SERVICES, "llama-router"),
    (SERVICES, "llama-epp"),
)


def resyncing_operator(
    cluster: LocalCluster, namespace: str, wait_for: WaitFor, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator, resyncing every 5 s (the pool's kinds are listed at each resync, not watched)."""
    running = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path, resync_seconds=5.0)
    running.start(wait_for)
    try:
        yield running
    finally:
        running.stop()
        print(f"--- operator log ---\n{running.tail(60)}")


@pytest.fixture
def router_operator(
    cluster: LocalCluster, namespace: str, crds: Path, wait_for: WaitFor, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator, started before GIE's CRDs are served."""
    yield from resyncing_operator(cluster, namespace, wait_for, tmp_path)


@pytest.fixture
def pools_operator(
    cluster: LocalCluster, namespace: str, crds: Path, wait_for: WaitFor, tmp_path: Path, gie_crds: None
) -> Iterator[OperatorProcess]:
    """The operator, started once GIE's CRDs are served."""
    install_gie_crds(cluster)
    yield from resyncing_operator(cluster, namespace, wait_for, tmp_path)


@pytest.fixture
def gie_crds(cluster: LocalCluster) -> Iterator[None]:
    """GIE's CRDs, served for one test (installed by the test itself, when it is ready for them)."""
    try:
        yield
    finally:
        remove_gie_crds(cluster)


def routing(body: Obj) -> tuple[str, str, str]:
    found = condition(body, "Routing")
    return found.get("status", ""), found.get("reason", ""), found.get("message", "")


def existing(api: Kube, namespace: str, objects: tuple[tuple[Resource, str], ...]) -> list[str]:
    return [f"{resource.kind}/{name}" for resource, name in objects if api.get(resource, namespace, name) is not None]


def test_a_service_serves_without_the_pool_crd_and_gets_its_pool_once_the_cluster_serves_it(
    cluster: LocalCluster,
    services: Services,
    router_operator: OperatorProcess,
    api: Kube,
    namespace: str,
    wait_for: WaitFor,
    gie_crds: None,
) -> None:
    services.create("llama", SPEC)
    ready = services.wait("llama", lambda b: phase_of(b) == "Ready" and routing(b)[0] != "", "Ready", timeout=90)
    status, reason, message = routing(ready)
    assert (status, reason) == ("False", "InferencePoolUnavailable")
    assert "serves no InferencePool (inference.networking.k8s.io/v1)" in message

    # Installed while the operator runs: its next resync lists the kind and applies the pool.
    install_gie_crds(cluster)
    pooled = services.wait("llama", lambda b: routing(b)[1] == "PoolReady", "Routing=True PoolReady", timeout=60)
    assert phase_of(pooled) == "Ready"
    pool = api.get(INFERENCE_POOLS, namespace, "llama")
    assert pool is not None
    assert pool["spec"]["selector"]["matchLabels"] == plan.routing.serving_pods("llama")
    assert pool["spec"]["targetPorts"] == [{"number": HTTP_PORT}]
    assert pool["metadata"]["ownerReferences"][0]["name"] == "llama"

    # Deleted by hand: no watch tells the operator, its next resync does, and the pool comes back.
    uid = pool["metadata"]["uid"]
    assert api.delete(INFERENCE_POOLS, namespace, "llama")
    back = wait_for(
        lambda: api.get(INFERENCE_POOLS, namespace, "llama") or {},
        lambda found: found.get("metadata", {}).get("uid") not in (None, uid),
        what="the pool re-applied by a resync",
        timeout=60,
    )
    assert back["spec"] == pool["spec"]


def test_spec_routing_runs_a_picker_and_its_removal_takes_the_picker_away(
    services: Services,
    api: Kube,
    namespace: str,
    wait_for: WaitFor,
    pools_operator: OperatorProcess,
) -> None:
    services.create("llama", {**SPEC, "routing": {"replicas": 1}})
    picked = services.wait(
        "llama", lambda b: phase_of(b) == "Ready" and routing(b)[1] == "PickerReady", "Ready, PickerReady", 90
    )
    assert routing(picked)[0] == "True"
    assert "send requests to Service llama-router" in routing(picked)[2]
    assert existing(api, namespace, ROUTER) == [f"{r.kind}/{n}" for r, n in ROUTER]
    router = api.get(DEPLOYMENTS, namespace, "llama-router")
    assert router is not None
    assert router["status"]["readyReplicas"] == 1
    assert router["metadata"]["ownerReferences"][0]["name"] == "llama"
    # The engine's Service still selects the engines only.
    engine_service = api.get(SERVICES, namespace, "llama")
    assert engine_service is not None
    assert engine_service["spec"]["selector"] == plan.service_labels("llama")

    # spec.routing removed: the router goes, the pool stays for a Gateway.
    api.merge_patch(SERVICES_NIS, namespace, "llama", {"spec": {"routing": None}})
    services.wait("llama", lambda b: routing(b)[1] == "PoolReady", "Routing=True PoolReady", timeout=60)
    gone = wait_for(
        lambda: existing(api, namespace, ROUTER),
        lambda left: left == [],
        what="the router's objects deleted",
        timeout=60,
    )
    assert gone == []
    assert api.get(INFERENCE_POOLS, namespace, "llama") is not None


def router_pods(api: Kube, namespace: str) -> list[Obj]:
    selector = ",".join(f"{key}={value}" for key, value in plan.routing.router_pods("llama").items())
    return api.list(PODS, namespace, selector)


def split_of(body: Obj) -> str | None:
    template = body["spec"].get("template", body)
    return (template["metadata"].get("annotations") or {}).get(plan.SPLIT_ANNOTATION)


def test_a_canary_behind_the_router_gets_a_pool_and_a_picker_and_its_step_waits_for_the_routers_split(
    services: Services,
    api: Kube,
    namespace: str,
    wait_for: WaitFor,
    pools_operator: OperatorProcess,
) -> None:
    """The wiring (the split itself, measured under load, runs on the real node)."""
    trial = {"steps": [{"weight": 10, "pauseSeconds": 600}, {"weight": 50}]}
    manifest = {
        **SPEC,
        "replicas": 2,
        "podAnnotations": {READY_AFTER_ANNOTATION: "1s"},
        "routing": {"replicas": 1},
        "rollout": {"canary": trial},
    }
    services.create("llama", manifest)
    first = services.wait(
        "llama", lambda b: phase_of(b) == "Ready" and routing(b)[1] == "PickerReady", "Ready, PickerReady", 90
    )
    old = first["status"]["currentRevision"]
    # No canary yet: one pool of every revision, a router without a split; the canary's pool stands empty.
    assert (api.get(INFERENCE_POOLS, namespace, "llama") or {})["spec"]["selector"]["matchLabels"] == (
        plan.routing.serving_pods("llama")
    )
    assert split_of(api.get(DEPLOYMENTS, namespace, "llama-router") or {}) is None
    canary_pool = api.get(INFERENCE_POOLS, namespace, "llama-canary") or {}
    assert canary_pool["spec"]["selector"]["matchLabels"][LABEL_TRACK] == TRACK_CANARY

    services.patch_spec("llama", {"engine": {"num_seqs_buckets": [2, 8]}})
    started = services.wait(
        "llama",
        lambda b: (b.get("status", {}).get("canary") or {}).get("stepStartedAt") is not None,
        "the first step started",
        timeout=90,
    )
    new = started["status"]["canary"]["revision"]
    # The stable pool holds to the stable revision; every router pod routes by the step's split.
    pool = api.get(INFERENCE_POOLS, namespace, "llama") or {}
    assert pool["spec"]["selector"]["matchLabels"][LABEL_ARTIFACT] == old
    router = api.get(DEPLOYMENTS, namespace, "llama-router") or {}
    assert split_of(router) == f"stable {old} 90%, canary 10%"
    assert [c["name"] for c in router["spec"]["template"]["spec"]["containers"]] == ["epp", "epp-canary", "envoy"]
    pods = router_pods(api, namespace)
    assert [split_of(p) for p in pods] == [f"stable {old} 90%, canary 10%"]
    # The step's pause began only once the router pod made for its split was Ready.
    (made_ready,) = [c["lastTransitionTime"] for c in pods[0]["status"]["conditions"] if c["type"] == "Ready"]
    assert made_ready <= started["status"]["canary"]["stepStartedAt"]
    canary_replicas = api.get(DEPLOYMENTS, namespace, plan.canary_name("llama")) or {}
    assert canary_replicas["spec"]["replicas"] == 1
    assert "0 of the 100 completions the canary needs" in condition(started, "Ready")["message"]

    # Without the canary section the new revision rolls out; the router drops the split first, and the
    # canary's replicas go only once no router pod made for it is left.
    services.patch_spec("llama", {"rollout": {"canary": None}})
    wait_for(
        lambda: api.get(DEPLOYMENTS, namespace, plan.canary_name("llama")),
        lambda found: found is None,
        what="the canary's replicas deleted",
        timeout=90,
    )
    assert [split_of(p) for p in router_pods(api, namespace)] == [None]
    done = services.wait(
        "llama", lambda b: phase_of(b) == "Ready" and b["status"]["currentRevision"] == new, "the new revision", 90
    )
    assert done["status"].get("canary") is None
    pool = api.get(INFERENCE_POOLS, namespace, "llama") or {}
    assert pool["spec"]["selector"]["matchLabels"] == plan.routing.serving_pods("llama")
    assert api.get(INFERENCE_POOLS, namespace, "llama-canary") is None
