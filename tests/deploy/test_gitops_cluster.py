"""GitOps through a real Argo CD on the local control plane with fake Neuron nodes (KWOK plays the kubelet).

Argo CD v3.2.11 (:mod:`neuronfleet.devcluster.addons.argocd`) syncs a ``file://`` repository
(:mod:`harness.gitops`): an app of apps whose waves apply the CRDs, then the operator's chart, then the
services. The chart's pod runs on a KWOK node, where nothing runs in it: the operator that acts is a process
beside it, for the services' namespace (``tests/realnode/test_gitops.py`` runs the chart's pod for real, and
sends load through the rollouts). Every change is a commit; every check is Argo CD's own state: the
Applications' sync, health and last operation, and the health our Lua checks give each service.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from harness.gitops import (
    CRDS_APP,
    OPERATOR_APP,
    PARENT,
    SERVICES_APP,
    TEAM,
    ArgoLog,
    GitOps,
    applications,
    in_git,
    make_repository,
    parent_application,
    parsed,
    service_health,
    sharer,
)

from neuronfleet.devcluster.addons.argocd import ArgoCd
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.kwok import COMPLETE_AFTER_ANNOTATION, FAIL_ANNOTATION
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.operator.api import API_VERSION, SERVICE_KIND

Obj = dict[str, Any]
APPS = (PARENT, CRDS_APP, OPERATOR_APP, SERVICES_APP)
NAME, SHARER = "llama", "llama-b"
DECODE_A, DECODE_B, DECODE_BROKEN = [1, 2, 4, 8], [2, 8], [4, 8]
#: Long enough for Argo CD to be seen reporting the compile.
COMPILE_S = "6s"
TIMEOUT_S = 120


def service(decode: list[int], **compile_extra: Any) -> Obj:
    """A small service (TP 4, two replicas on the trn2 KWOK nodes) whose compile takes :data:`COMPILE_S`."""
    return {
        "apiVersion": API_VERSION,
        "kind": SERVICE_KIND.kind,
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
            "engine": {"max_num_seqs": 8, "num_seqs_buckets": decode, "tensor_parallel_size": 4},
            "replicas": 2,
            "compile": {
                "artifactStore": "s3://neuronfleet-test/neff",
                "resources": {"cpu": "1", "memory": "1Gi"},
                "backoffLimit": 0,
                "podAnnotations": {COMPLETE_AFTER_ANNOTATION: COMPILE_S},
                **compile_extra,
            },
            "drain": {"preStopSeconds": 1, "drainTimeoutSeconds": 5},
        },
    }


@dataclass
class WithOperator(GitOps):
    """The GitOps rig and the operator process, started once the CRDs' wave is Healthy."""

    operator: OperatorProcess | None = None


def artifact_hash(gitops: GitOps, name: str) -> str:
    """The artifact a service serves (its current revision)."""
    return str(gitops.get("nis", name)["status"]["currentRevision"])


@pytest.fixture(scope="module")
def gitops(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WithOperator]:
    """Argo CD, the operator for the services' namespace, and the repository (nothing synced yet)."""
    workdir = tmp_path_factory.mktemp("gitops")
    suffix = uuid.uuid4().hex[:6]
    namespace, operator_namespace = f"gitops-{suffix}", f"gitops-op-{suffix}"
    # Before the chart's wave, which binds the operator's Role in each watched namespace.
    assert cluster.kubectl("create", "namespace", namespace).returncode == 0
    argo = ArgoCd.start(cluster)
    print(f"==> Argo CD started in {argo.started_in:.1f} s", flush=True)
    log = ArgoLog(argo, APPS)
    operator = OperatorProcess(cluster.kubeconfig, [namespace], workdir, resync_seconds=5)
    try:
        services = {NAME: in_git(service(DECODE_A), NAME), SHARER: sharer(service(DECODE_A), SHARER)}
        chart = {"namespace": operator_namespace, "values": {"watchNamespaces": [namespace], "resyncSeconds": 5}}
        repo = make_repository(workdir / "repo", lambda repo: applications(repo, namespace, chart), services)
        yield WithOperator(cluster, argo, repo, log, namespace, services, operator)
    finally:
        log.stop()
        log.print("whole module", log.seen[0].at if log.seen else 0.0)
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(30)}")
        argo.stop()
        for name in (namespace, operator_namespace):
            cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_install_applies_the_crds_then_the_services_and_argo_cd_runs_our_health_check(gitops: WithOperator) -> None:
    start = time.time()
    gitops.argo.apply(parent_application(gitops.repo))
    head = gitops.head()
    gitops.wait_app(gitops.synced_healthy(head, CRDS_APP), "the CRDs applied", CRDS_APP, TIMEOUT_S)
    assert gitops.operator is not None
    gitops.operator.start(wait_for)
    for name in APPS:
        gitops.wait_app(gitops.synced_healthy(head, name), f"Synced to {head[:8]} and Healthy", name, TIMEOUT_S)
    gitops.log.print("install", start)
    created = {n: parsed((gitops.argo.application(n) or {})["metadata"]["creationTimestamp"]) for n in APPS}
    healthy = {n: parsed(gitops.app(n)["health"].get("lastTransitionTime")) for n in APPS}
    assert healthy[CRDS_APP] <= created[OPERATOR_APP], (created, healthy)
    assert healthy[OPERATOR_APP] <= created[SERVICES_APP], (created, healthy)
    # The chart as Argo CD rendered it (helm template, skipCrds), into a namespace that enforces restricted.
    chart = {(r["kind"], r["name"]) for r in gitops.app(OPERATOR_APP)["resources"]}
    assert ("Deployment", "neuronfleet") in chart, chart
    assert not any(kind == "CustomResourceDefinition" for kind, _ in chart), chart
    status = gitops.app()
    for name in (NAME, SHARER):
        assert service_health(status, name)["status"] == "Healthy"
    assert service_health(status, NAME)["message"].startswith("Ready: 2/2 replicas ready at revision "), status
    assert {r["kind"] for r in status["resources"]} == {"NeuronInferenceService"}
    assert gitops.owners(artifact_hash(gitops, NAME)) == {NAME, SHARER}
    # Progressing, with our message, while the first compile ran.
    assert compiling(gitops, start), gitops.log.since(start)


def compiling(gitops: GitOps, start: float) -> list[str]:
    """What Argo CD said of the service while it compiled, from ``start`` on."""
    prefix = f"{NAME}: Progressing: Compiling"
    return [line for s in gitops.log.since(start) for line in s.services if line.startswith(prefix)]


def test_a_bucket_change_in_git_is_progressing_while_it_compiles_then_healthy(gitops: GitOps) -> None:
    old = artifact_hash(gitops, NAME)
    revision, committed_at = gitops.commit(
        "llama, llama-b: decode buckets 2, 8",
        {NAME: in_git(service(DECODE_B), NAME), SHARER: sharer(service(DECODE_B), SHARER)},
    )
    gitops.wait_app(gitops.synced_healthy(revision), "Synced and Healthy on the new revision", timeout=TIMEOUT_S)
    gitops.log.print("bucket change", committed_at)
    new = wait_for(lambda: artifact_hash(gitops, NAME), lambda h: h != old, timeout=TIMEOUT_S, what="the rollout")
    messages = compiling(gitops, committed_at)
    assert messages, gitops.log.since(committed_at)
    assert any(new in m for m in messages), messages
    assert gitops.owners(new) == {NAME, SHARER}


def test_a_failed_compile_in_git_is_degraded_with_its_reason(gitops: GitOps) -> None:
    serving = artifact_hash(gitops, NAME)
    good = gitops.services[NAME]
    broken = in_git(service(DECODE_BROKEN, podAnnotations={FAIL_ANNOTATION: "true"}), NAME)
    revision, committed_at = gitops.commit("llama: decode buckets 4, 8 (its compile fails)", {NAME: broken})
    degraded = gitops.wait_app(
        lambda s: (
            s.get("sync", {}).get("revision") == revision
            and s.get("health", {}).get("status") == "Degraded"
            and service_health(s, NAME)
        ),
        "Degraded by the failed compile",
        timeout=TIMEOUT_S,
    )
    gitops.log.print("failed compile", committed_at)
    assert gitops.app()["sync"]["status"] == "Synced"
    assert degraded["status"] == "Degraded"
    assert degraded["message"].startswith("BlockedByFailedCompile: compile of "), degraded
    assert f"revision {serving} keeps serving" in degraded["message"]
    assert artifact_hash(gitops, NAME) == serving
    revision, _ = gitops.commit("llama: back to decode buckets 2, 8", {NAME: good})
    gitops.wait_app(gitops.synced_healthy(revision), "Healthy on the working spec again", timeout=TIMEOUT_S)


def test_drift_is_healed_and_the_operators_writes_cause_none(gitops: GitOps) -> None:
    head = gitops.head()
    edited_at = time.time()
    done = gitops.cluster.kubectl("label", "nis", NAME, "team=hand-edited", "--overwrite", "-n", gitops.namespace)
    assert done.returncode == 0, done.stderr
    healed = gitops.wait_app(
        lambda s: (
            parsed((s.get("operationState") or {}).get("startedAt")) >= int(edited_at)
            and s["operationState"].get("phase") == "Succeeded"
            and gitops.get("nis", NAME)["metadata"]["labels"]["team"] == TEAM["team"]
            and s
        ),
        "the hand edit reverted by self-heal",
        timeout=TIMEOUT_S,
    )
    assert healed["operationState"]["operation"]["initiatedBy"].get("automated") is True
    scaled_at = time.time()
    # The scale subresource of the autoscaled service, written as KEDA's HPA writes it.
    scaled = gitops.cluster.kubectl("scale", "nis", SHARER, "--replicas=1", "-n", gitops.namespace)
    assert scaled.returncode == 0, scaled.stderr
    assert gitops.get("nis", SHARER)["spec"]["replicas"] == 1
    gitops.argo.refresh(SERVICES_APP)
    wait_for(lambda: gitops.argo.refreshed(SERVICES_APP), timeout=60, what="Argo CD compared again after the writes")
    # The write bumped the autoscaled service's generation: Progressing until the operator acts on it.
    status = gitops.wait_app(lambda s: gitops.synced_healthy(head)(s) and s, "Synced and Healthy after the writes")
    gitops.log.print("drift", edited_at)
    assert (status["sync"]["status"], status["sync"]["revision"]) == ("Synced", head)
    assert status["health"]["status"] == "Healthy"
    assert {r["kind"] for r in status["resources"]} == {"NeuronInferenceService"}
    assert status["operationState"]["startedAt"] == healed["operationState"]["startedAt"]
    assert [s for s in gitops.log.since(scaled_at) if s.sync != "Synced"] == []


def test_deleting_a_service_from_git_prunes_it_and_keeps_the_shared_artifact(gitops: GitOps) -> None:
    serving = artifact_hash(gitops, NAME)
    assert gitops.owners(serving) == {NAME, SHARER}
    revision, committed_at = gitops.commit(f"{SHARER}: removed", {SHARER: None})
    gitops.wait_app(gitops.synced_healthy(revision), f"{SHARER} pruned", timeout=TIMEOUT_S)
    gitops.log.print("prune", committed_at)
    assert {r["name"] for r in gitops.app()["resources"]} == {NAME}
    gone = gitops.cluster.kubectl("get", "nis", SHARER, "-n", gitops.namespace)
    assert gone.returncode != 0
    wait_for(lambda: gitops.owners(serving), lambda o: o == {NAME}, timeout=TIMEOUT_S, what="the artifact kept")
    assert artifact_hash(gitops, NAME) == serving
