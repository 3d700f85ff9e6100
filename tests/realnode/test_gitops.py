"""GitOps through a real Argo CD: every change is a commit, every check is Argo CD's own view.

Argo CD v3.2.11 (:mod:`neuronfleet.devcluster.addons.argocd`: its repo server and application controller as
processes of the rig, against the real cluster) syncs a local Git repository served as ``file://``. The
repository holds what a user's would: ``crds/``, ``charts/neuronfleet``, ``apps/`` (the Applications of
``argocd/applications.yaml``, pointed at the repository and at the real node) and ``services/``. One parent
Application (app of apps) syncs ``apps/``; its waves put the CRDs first, then the operator's chart, then the
services. Two ``device: sim`` services on the real node share one artifact: ``fleet`` (one replica, under load)
and ``fleet-b`` (autoscaled, no KEDA here: it serves its minimum). The operator runs in-cluster from its image,
artifacts in an ``s3://`` store on the node (:mod:`harness.fleet`).

Argo CD's state is polled all along (:class:`ArgoLog`) and printed with timestamps: sync, health and the
last operation of each Application, and the health our Lua checks give the services (persisted in the
Application's ``status.resources``). The tests run in order and share the services.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from harness.canary import GOOD_CANARY_LATENCY_LIMIT, latency_checks
from harness.cluster_fixtures import NodeImage
from harness.fleet import (
    AFTER_S,
    BUCKET,
    KEYS,
    NAME,
    POD_TIMEOUT_S,
    RATE,
    WRONG_KEYS,
    Fleet,
    Obj,
    create_secret,
    identity_hash,
    report,
    service_manifest,
)
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

from neuronfleet.contract.hardware import NEURON_TAINT_KEY
from neuronfleet.contract.model_shapes import served_name
from neuronfleet.contract.names import HTTP_PORT
from neuronfleet.devcluster.addons.argocd import ArgoCd
from neuronfleet.devcluster.addons.s3_server import S3Server
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode.node import NODE_IP, RealNode

APPS = (PARENT, CRDS_APP, OPERATOR_APP, SERVICES_APP)
SHARER = "fleet-b"
FIRST_BUCKETS, SECOND_BUCKETS, BROKEN_BUCKETS = [128, 256], [64, 256], [64, 128, 256]
#: Not ending at the limit (the last of the others): admission refuses it.
REFUSED_BUCKETS = [64, 128]


#: One step at half the traffic, with latency limits that decide: a fresh replica's first requests take several
#: times the stable's (3.9x seen), a device 6x slower 30x (``harness.canary``).
CANARY = {
    "steps": [{"weight": 50, "pauseSeconds": 3}],
    "analysis": {
        "minRequests": 6,
        "maxTtftP99Ratio": GOOD_CANARY_LATENCY_LIMIT,
        "maxItlP99Ratio": GOOD_CANARY_LATENCY_LIMIT,
    },
}


def in_progress(revision: str, reason: str | tuple[str, ...]) -> Callable[[Obj], Obj | bool]:
    """Synced to ``revision``, the Application Progressing, and fleet's health message saying ``reason`` (or one
    of them): that health."""
    return lambda s: (
        s.get("sync", {}).get("revision") == revision
        and s.get("health", {}).get("status") == "Progressing"
        and service_health(s, NAME).get("message", "").startswith(reason)
        and service_health(s, NAME)
    )


@dataclass
class WithFleet(GitOps):
    """The GitOps rig and the service under load, :mod:`harness.fleet`'s (``fleet``, one replica)."""

    fleet: Fleet | None = None

    @property
    def service(self) -> Fleet:
        """The fleet (always set by the fixture)."""
        assert self.fleet is not None
        return self.fleet


def answer_through_service(fleet: Fleet, name: str) -> Obj:
    """One completion through the service's Service, from the node; the body."""
    cluster_ip = fleet.get("service", name)["spec"]["clusterIP"]
    model = served_name(fleet.manifest["spec"]["model"]["uri"])
    body = json.dumps({"model": model, "prompt": "GitOps", "max_tokens": 8}).encode()
    script = (
        "import urllib.request\n"
        f"request = urllib.request.Request('http://{cluster_ip}:{HTTP_PORT}/v1/completions', data={body!r}, "
        "headers={'Content-Type': 'application/json'})\n"
        "print(urllib.request.urlopen(request, timeout=60).read().decode())\n"
    )
    answered = fleet.node.in_netns(["python3", "-I", "-c", script], timeout=90)
    assert answered.returncode == 0, answered.stderr
    return dict(json.loads(answered.stdout))


@pytest.fixture(scope="module")
def gitops(
    real_cluster: LocalCluster, real_node: RealNode, node_image: NodeImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WithFleet]:
    """Argo CD, the repository (nothing synced yet), the S3 store and the services' namespace with its keys."""
    workdir = tmp_path_factory.mktemp("gitops")
    engine, operator = node_image("engine"), node_image("operator")
    s3 = S3Server.start(workdir / "s3", host=NODE_IP, netns=real_node.netns)
    s3.create_bucket(BUCKET)
    suffix = uuid.uuid4().hex[:6]
    namespace, operator_namespace = f"gitops-{suffix}", f"gitops-op-{suffix}"
    assert real_cluster.kubectl("create", "namespace", namespace).returncode == 0
    argo = ArgoCd.start(real_cluster)
    print(f"==> Argo CD started in {argo.started_in:.1f} s", flush=True)
    log = ArgoLog(argo, APPS)
    try:
        keys = s3.credentials
        create_secret(real_cluster, namespace, KEYS, keys.access_key, keys.secret_key)
        create_secret(real_cluster, namespace, WRONG_KEYS, keys.access_key, f"revoked-{keys.secret_key[::-1]}")
        manifest = service_manifest(engine.name, s3.endpoint, FIRST_BUCKETS)
        manifest["spec"]["replicas"] = 1
        fleet = Fleet(real_cluster, real_node, namespace, operator_namespace, engine.name, s3, workdir, manifest)
        repository, tag = operator.name.rsplit(":", 1)
        chart = {
            "namespace": operator_namespace,
            "values": {
                # Imported into the node's containerd: there is no registry to pull from.
                "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
                "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
                "tolerations": [{"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "watchNamespaces": [namespace],
                "resyncSeconds": 5,
            },
        }
        services = {NAME: in_git(manifest, NAME), SHARER: sharer(manifest, SHARER)}
        repo = make_repository(workdir / "repo", lambda repo: applications(repo, namespace, chart), services)
        yield WithFleet(real_cluster, argo, repo, log, namespace, services, fleet)
    finally:
        log.stop()
        log.print("whole module", log.seen[0].at if log.seen else 0.0)
        argo.stop()
        for name in (namespace, operator_namespace):
            real_cluster.kubectl("delete", "namespace", name, "--wait=false")
        s3.stop()


def test_install_syncs_crds_then_the_chart_then_the_services(gitops: WithFleet) -> None:
    start = time.time()
    gitops.argo.apply(parent_application(gitops.repo))
    head = gitops.head()
    for name in APPS:
        gitops.wait_app(gitops.synced_healthy(head, name), f"Synced to {head[:8]} and Healthy", name, 2 * POD_TIMEOUT_S)
    done = time.time()
    gitops.log.print("install", start)
    print(f"    install took {done - start:.1f} s", flush=True)
    # The waves: each child Application was created once the wave before it was Healthy.
    created = {n: parsed((gitops.argo.application(n) or {})["metadata"]["creationTimestamp"]) for n in APPS}
    healthy = {n: parsed(gitops.app(n)["health"].get("lastTransitionTime")) for n in APPS}
    assert healthy[CRDS_APP] <= created[OPERATOR_APP], (created, healthy)
    assert healthy[OPERATOR_APP] <= created[SERVICES_APP], (created, healthy)
    # Our health check's message, as Argo CD ran it, for both services; the artifact shared by both.
    status = gitops.app()
    first = identity_hash(gitops.service.manifest)
    for name in (NAME, SHARER):
        assert service_health(status, name)["status"] == "Healthy"
        assert service_health(status, name)["message"].startswith("Ready: 1/1 replicas ready at revision "), status
    assert gitops.owners(first) == {NAME, SHARER}
    # Argo CD tracks what Git holds; the operator's children are not its resources.
    assert {r["kind"] for r in status["resources"]} == {"NeuronInferenceService"}
    assert gitops.service.rolled_out_to(first, replicas=1)
    assert answer_through_service(gitops.service, NAME)["usage"]["completion_tokens"] == 8


def test_a_bucket_change_in_git_earns_its_traffic_as_a_canary_and_rolls_out_without_a_failed_request(
    gitops: WithFleet,
) -> None:
    fleet = gitops.service
    old = fleet.status()["currentRevision"]
    plain = fleet.with_buckets(SECOND_BUCKETS)
    # fleet's change is a canary; fleet-b, unloaded, would never reach the analysis' minimum: it rolls out.
    changed = copy.deepcopy(plain)
    changed["spec"]["rollout"]["canary"] = CANARY
    new = identity_hash(changed)
    # Each request on its own connection: the Service (kube-proxy) picks either revision for each.
    with fleet.load("gitops-rollout", keep_alive=False) as load:
        revision, committed_at = gitops.commit(
            "fleet, fleet-b: prefill buckets 64, 256; fleet's as a canary",
            {NAME: in_git(changed, NAME), SHARER: sharer(plain, SHARER)},
        )
        # What later tests derive their changes from: without the canary.
        fleet.manifest = plain
        # A sim compile takes about 5 s: Argo CD may not compare the app within it, and next show the canary.
        compiling = gitops.wait_app(
            in_progress(revision, ("Compiling", "CanaryProgressing")), "Progressing while the new artifact compiles"
        )
        on_trial = gitops.wait_app(in_progress(revision, "CanaryProgressing"), "Progressing through the canary")
        trial_at = time.time()
        gitops.wait_app(gitops.synced_healthy(revision), "Synced and Healthy again", timeout=2 * POD_TIMEOUT_S)
        done_at = fleet.wait(lambda: fleet.rolled_out_to(new, replicas=1) and time.time(), f"{NAME} on {new}")
        # The measurement window after the rollout: every answer in it must come from the new revision.
        time.sleep(AFTER_S)
        result = load.stop()
    gitops.log.print("bucket change", committed_at)
    report("bucket change through Git", result, committed=committed_at, canary=trial_at, rolled_out=done_at)
    print(f"    Argo CD during the canary: {on_trial['message']}", flush=True)
    assert new in compiling["message"], compiling
    # Argo CD shows the operator's own account of the canary's step.
    assert on_trial["message"].startswith(f"CanaryProgressing: canary {new} at step 1/1 (50%)"), on_trial
    # Promoted by the analysis itself: its last figures within both latency limits.
    promoted = fleet.status()["canary"]
    print(f"    promoted on: {promoted.get('analysis')}", flush=True)
    assert promoted["phase"] == "Promoted"
    checks = latency_checks(promoted.get("analysis") or "")
    assert {name for name, _, _ in checks} == {"TTFT", "ITL"}, promoted
    assert all(ratio <= limit == GOOD_CANARY_LATENCY_LIMIT for _, ratio, limit in checks), promoted
    assert result.failed == {}, result.summary
    assert result.answers[0].sent_at < committed_at, "the load started after the commit"
    after = result.sent_between(done_at)
    assert len(after) >= RATE * AFTER_S * 0.8, len(after)
    assert {a.header for a in after} == {new}
    assert {a.header for a in result.answers} == {old, new}
    # Both services moved to one new artifact, compiled once; both keep the old one for a rollback.
    assert gitops.owners(new) == {NAME, SHARER}
    (job,) = fleet.compile_jobs(new)
    assert job["status"].get("succeeded") == 1
    fleet.wait(lambda: fleet.status().get("previousRevisions") == [old], f"{old} kept for a rollback")
    assert gitops.owners(old) == {NAME, SHARER}


def test_a_git_revert_rolls_back_onto_the_kept_artifact_at_once_without_a_failed_request(gitops: WithFleet) -> None:
    fleet = gitops.service
    serving = fleet.status()["currentRevision"]
    (previous,) = fleet.status()["previousRevisions"]
    (kept,) = [a for a in fleet.get("nca")["items"] if a["metadata"]["name"].endswith(previous)]
    phases: list[str] = []

    def rolled_back() -> float | bool:
        status = fleet.status()
        phases.append(status.get("phase", ""))
        return status.get("targetRevision") == previous and fleet.rolled_out_to(previous, replicas=1) and time.time()

    with fleet.load("gitops-revert") as load:
        revision, reverted_at = gitops.revert("HEAD")
        fleet.manifest = fleet.with_buckets(FIRST_BUCKETS)
        done_at = fleet.wait(rolled_back, f"{NAME} back on {previous}")
        gitops.wait_app(gitops.synced_healthy(revision), "Synced and Healthy on the revert")
        healthy_at = time.time()
        time.sleep(AFTER_S)
        result = load.stop()
    gitops.log.print("revert", reverted_at)
    report("git revert", result, reverted=reverted_at, rolled_out=done_at, synced_healthy=healthy_at)
    changes = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    print(f"    phases seen: {' -> '.join(changes)}", flush=True)
    assert result.failed == {}, result.summary
    assert {a.header for a in result.sent_between(done_at)} == {previous}
    # The kept artifact served again as it was: no new object, no compile Job, never Compiling.
    assert "Compiling" not in phases, phases
    (again,) = [a for a in fleet.get("nca")["items"] if a["metadata"]["name"].endswith(previous)]
    assert again["metadata"]["uid"] == kept["metadata"]["uid"]
    created = [parsed(job["metadata"]["creationTimestamp"]) for job in fleet.get("jobs")["items"]]
    assert all(at < int(reverted_at) for at in created), created
    assert fleet.status()["previousRevisions"] == [serving]


def test_a_failed_compile_is_degraded_while_the_old_revision_serves(gitops: WithFleet) -> None:
    fleet = gitops.service
    serving = fleet.status()["currentRevision"]
    good = gitops.services[NAME]
    # A new identity whose compile cannot upload: the Secret holds a revoked key.
    broken = in_git(fleet.with_buckets(BROKEN_BUCKETS, secret=WRONG_KEYS), NAME)
    failed_hash = identity_hash(broken)
    with fleet.load("gitops-failed-compile") as load:
        revision, committed_at = gitops.commit("fleet: buckets 64, 128, 256 (revoked keys)", {NAME: broken})
        degraded = gitops.wait_app(
            lambda s: (
                s.get("sync", {}).get("status") == "Synced"
                and s.get("sync", {}).get("revision") == revision
                and s.get("health", {}).get("status") == "Degraded"
                and service_health(s, NAME)
            ),
            "Degraded by the failed compile",
        )
        degraded_at = time.time()
        time.sleep(AFTER_S)
        result = load.stop()
    gitops.log.print("failed compile", committed_at)
    report("failed compile through Git", result, committed=committed_at, degraded=degraded_at)
    assert degraded["status"] == "Degraded"
    assert degraded["message"].startswith("BlockedByFailedCompile: compile of "), degraded
    assert failed_hash in degraded["message"]
    assert f"revision {serving} keeps serving" in degraded["message"]
    assert fleet.s3.credentials.secret_key not in json.dumps(gitops.app())
    assert result.failed == {}, result.summary
    assert len(result.sent_between(degraded_at)) >= RATE * AFTER_S * 0.8
    assert {a.header for a in result.answers} == {serving}
    # Git again names what serves: Healthy, nothing rolled.
    revision, _ = gitops.commit("fleet: back to the working spec", {NAME: good})
    gitops.wait_app(gitops.synced_healthy(revision), "Healthy on the working spec again")
    assert fleet.rolled_out_to(serving, replicas=1)


def test_a_refused_commit_fails_its_sync_within_seconds_and_the_next_commit_syncs(gitops: WithFleet) -> None:
    fleet = gitops.service
    serving = fleet.status()["currentRevision"]
    good = gitops.services[NAME]
    # The last prefill bucket below the limit: the CRD refuses it, as it would on every retry.
    refused = in_git(fleet.with_buckets(REFUSED_BUCKETS), NAME)
    revision, committed_at = gitops.commit("fleet: prefill buckets 64, 128 (refused)", {NAME: refused})

    def sync_failed(status: Obj) -> Obj | None:
        operation = status.get("operationState") or {}
        tried = (operation.get("operation") or {}).get("sync", {}).get("revision")
        return status if tried == revision and operation.get("phase") in {"Failed", "Error"} else None

    failed = gitops.wait_app(sync_failed, "the refused sync failed")
    failed_at = time.time()
    # What the sync says, and what a health wait alone would miss: the live object, untouched, is Healthy.
    told = json.dumps(failed["operationState"])
    assert f"must equal max_num_batched_tokens ({FIRST_BUCKETS[-1]}), got {REFUSED_BUCKETS[-1]}" in told, told
    assert (failed["sync"]["status"], failed["health"]["status"]) == ("OutOfSync", "Healthy")
    assert fleet.rolled_out_to(serving, replicas=1)
    fixed, fixed_at = gitops.commit("fleet: back to the working spec", {NAME: good})
    gitops.wait_app(gitops.synced_healthy(fixed), "Synced and Healthy on the fix")
    synced_at = time.time()
    gitops.log.print("refused commit", committed_at)
    print(
        f"    refused sync failed {failed_at - committed_at:.1f} s after the commit; "
        f"the fix synced {synced_at - fixed_at:.1f} s after its own; Argo CD said: "
        f"{failed['operationState'].get('phase')}: {failed['operationState'].get('message')}",
        flush=True,
    )
    assert fleet.status()["currentRevision"] == serving


def test_drift_is_healed_and_the_operators_fields_cause_no_drift(gitops: WithFleet) -> None:
    fleet = gitops.service
    head = gitops.head()
    # A hand edit to a field Git holds: self-heal puts it back.
    edited_at = time.time()
    fleet.kubectl("label", "nis", NAME, "team=hand-edited", "--overwrite")
    healed = gitops.wait_app(
        lambda s: (
            parsed((s.get("operationState") or {}).get("startedAt")) >= int(edited_at)
            and s["operationState"].get("phase") == "Succeeded"
            and fleet.get("nis", NAME)["metadata"]["labels"]["team"] == TEAM["team"]
            and s
        ),
        "the hand edit reverted by self-heal",
    )
    assert healed["operationState"]["operation"]["initiatedBy"].get("automated") is True
    scaled_at = time.time()
    # What the operator and the autoscaler write: status, the scale subresource of the autoscaled service
    # (as KEDA's HPA writes it), the children. A hard refresh after them compares everything again.
    fleet.kubectl("scale", "nis", SHARER, "--replicas=1")
    assert fleet.get("nis", SHARER)["spec"]["replicas"] == 1
    gitops.argo.refresh(SERVICES_APP)
    wait_for(lambda: gitops.argo.refreshed(SERVICES_APP), timeout=60, what="Argo CD compared again after the writes")
    # The write bumped the autoscaled service's generation: Progressing until the operator acts on it.
    status = gitops.wait_app(lambda s: gitops.synced_healthy(head)(s) and s, "Synced and Healthy after the writes")
    gitops.log.print("drift", edited_at)
    assert status["sync"] == {**status["sync"], "status": "Synced", "revision": head}, status["sync"]
    assert status["health"]["status"] == "Healthy"
    assert {r["kind"] for r in status["resources"]} == {"NeuronInferenceService"}
    # No sync ran for the operator's writes: the last operation is still the self-heal.
    assert status["operationState"]["startedAt"] == healed["operationState"]["startedAt"]
    diffs = [s for s in gitops.log.since(scaled_at) if s.sync != "Synced"]
    assert diffs == [], diffs


def test_deleting_a_service_from_git_prunes_it_and_keeps_the_shared_artifact(gitops: WithFleet) -> None:
    fleet = gitops.service
    serving = fleet.status()["currentRevision"]
    assert gitops.owners(serving) == {NAME, SHARER}
    revision, committed_at = gitops.commit(f"{SHARER}: removed", {SHARER: None})
    gitops.wait_app(gitops.synced_healthy(revision), f"{SHARER} pruned")
    fleet.wait(lambda: fleet.cluster.kubectl("get", "nis", SHARER, "-n", fleet.namespace).returncode != 0, "gone")
    gitops.log.print("prune", committed_at)
    status = gitops.app()
    assert {r["name"] for r in status["resources"]} == {NAME}
    # The artifact stays for the service still using it, which serves on.
    fleet.wait(lambda: gitops.owners(serving) == {NAME}, f"the artifact held by {NAME} alone")
    assert fleet.rolled_out_to(serving, replicas=1)
    assert answer_through_service(fleet, NAME)["usage"]["completion_tokens"] == 8
