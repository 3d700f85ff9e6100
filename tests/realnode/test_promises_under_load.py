"""The operator's promises, kept on real pods under load: rollout, failed compile, drain, operator restart, scale.

One ``device: sim`` service with two replicas on the real node, rolled out by the operator running
in-cluster from its image (installed by the chart), its artifacts in an ``s3://`` store: a real S3
server inside the node's network namespace, which compile pods upload to and serving pods download
from. Each test sends completions through the Service's ClusterIP for its whole length (the open-loop
load tool, from the node's network namespace) and checks every response: its status, and the
``X-Neuronfleet-Artifact`` header that says which revision answered.

The service and its helpers are :mod:`harness.fleet`. The tests run in order and share the service:
each leaves it Ready with two replicas.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator

import pytest
from harness.cluster_fixtures import NodeImage
from harness.fleet import (
    AFTER_S,
    BUCKET,
    DRAIN_TOKENS,
    NAME,
    POD_TIMEOUT_S,
    RATE,
    WRONG_KEYS,
    Fleet,
    identity_hash,
    pod_ready,
    ready_condition,
    report,
    started,
)

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.realnode.node import RealNode
from neuronfleet.engine.names import LABEL_ARTIFACT


@pytest.fixture(scope="module")
def fleet(
    real_cluster: LocalCluster, real_node: RealNode, node_image: NodeImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """The service Ready with two replicas, rolled out by the in-cluster operator, artifacts in S3 on the node."""
    with started(real_cluster, real_node, node_image, tmp_path_factory.mktemp("fleet")) as service:
        yield service


def test_a_bucket_change_rolls_out_without_a_failed_request(fleet: Fleet) -> None:
    old = fleet.status()["currentRevision"]
    changed = fleet.with_buckets([64, 256])
    new = identity_hash(changed)
    with fleet.load("rollout") as load:
        applied_at = fleet.apply(changed)
        fleet.wait(lambda: (fleet.status().get("artifact") or {}).get("hash") == new, f"artifact {new} requested")
        compiled_at = fleet.wait(
            lambda: (fleet.status().get("artifact") or {}).get("phase") == "Ready" and time.time(),
            f"artifact {new} compiled",
        )
        done_at = fleet.wait(
            lambda: fleet.rolled_out_to(new) and time.time(), f"every replica on {new}", timeout=2 * POD_TIMEOUT_S
        )
        # The measurement window after the rollout: every answer in it must come from the new revision.
        time.sleep(AFTER_S)
        result = load.stop()
    report("rollout", result, applied=applied_at, compiled=compiled_at, rolled_out=done_at)
    assert result.failed == {}, result.summary
    assert result.answers[0].sent_at < applied_at, "the load started after the change"
    # While the new artifact compiled (and until its first pod was Ready), the old revision answered.
    during_compile = result.sent_between(applied_at, compiled_at)
    assert during_compile
    assert {a.header for a in during_compile} == {old}
    after = result.sent_between(done_at)
    assert len(after) >= RATE * AFTER_S * 0.8, len(after)
    assert {a.header for a in after} == {new}
    assert {a.header for a in result.answers} == {old, new}
    # One compile Job for the new identity, run once.
    (job,) = fleet.compile_jobs(new)
    assert job["status"].get("succeeded") == 1


def test_a_failed_compile_blocks_while_the_old_pods_keep_serving(fleet: Fleet) -> None:
    serving = fleet.status()["currentRevision"]
    before = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"] for p in fleet.pods()}
    good = copy.deepcopy(fleet.manifest)
    # A new identity whose compile cannot upload: the Secret holds a revoked key.
    broken = fleet.with_buckets([64, 128, 256], secret=WRONG_KEYS)
    failed_hash = identity_hash(broken)
    with fleet.load("failed-compile") as load:
        applied_at = fleet.apply(broken)
        blocked = fleet.wait(
            lambda: (s := fleet.status()).get("phase") == "Blocked" and s,
            f"{NAME} blocked by the failed compile of {failed_hash}",
        )
        blocked_at = time.time()
        # The old revision goes on serving once the service is blocked.
        time.sleep(AFTER_S)
        result = load.stop()
    report("failed compile", result, applied=applied_at, blocked=blocked_at)
    assert ready_condition({"status": blocked})["reason"] == "BlockedByFailedCompile"
    assert blocked["artifact"] == {"name": blocked["artifact"]["name"], "hash": failed_hash, "phase": "Failed"}
    assert result.failed == {}, result.summary
    assert len(result.sent_between(blocked_at)) >= RATE * AFTER_S * 0.8, "too few requests after the block"
    assert {a.header for a in result.answers} == {serving}
    # The serving pods were not touched: the same pods, never restarted.
    after = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"] for p in fleet.pods()}
    assert after == before
    artifact = fleet.get("nca", blocked["artifact"]["name"])["status"]
    assert artifact["phase"] == "Failed"
    # The engine's own refusal reaches the artifact's status, and no secret does.
    assert f"s3://{BUCKET}/fleet" in artifact["message"], artifact
    assert fleet.s3.credentials.secret_key[::-1] not in json.dumps(artifact)
    assert fleet.s3.credentials.secret_key not in fleet.kubectl("describe", "nis", NAME)
    # Back to the working spec: the service is Ready on what it serves, with nothing rolled.
    fleet.apply(good)
    fleet.wait(lambda: fleet.rolled_out_to(serving), f"{NAME} Ready again on {serving}")


def test_the_operator_killed_mid_rollout_converges_without_duplicate_jobs(fleet: Fleet) -> None:
    changed = fleet.with_buckets([32, 256])
    new = identity_hash(changed)
    killed = fleet.operator_pod()
    with fleet.load("operator-killed") as load:
        fleet.apply(changed)
        (job,) = fleet.wait(lambda: fleet.compile_jobs(new), f"the compile Job of {new}")
        # The rollout is in flight once a pod of the new revision exists: kill the operator then.
        fleet.wait(
            lambda: any(p["metadata"]["labels"][LABEL_ARTIFACT] == new for p in fleet.pods()),
            f"a pod of revision {new}",
        )
        killed_at = time.time()
        fleet.cluster.kubectl(
            "delete", "pod", killed["metadata"]["name"], "--namespace", fleet.operator_namespace, "--wait=false"
        )
        restarted = fleet.wait(
            lambda: (p := fleet.operator_pod())["metadata"]["uid"] != killed["metadata"]["uid"] and pod_ready(p) and p,
            "the operator restarted by its Deployment",
        )
        done_at = fleet.wait(
            lambda: fleet.rolled_out_to(new) and time.time(), f"every replica on {new}", timeout=2 * POD_TIMEOUT_S
        )
        time.sleep(AFTER_S)
        result = load.stop()
    report("operator killed mid-rollout", result, killed=killed_at, rolled_out=done_at)
    assert killed_at < done_at
    assert restarted["spec"]["nodeName"] == REAL_NODE
    assert result.failed == {}, result.summary
    assert {a.header for a in result.sent_between(done_at)} == {new}
    # The same one Job, never made again by the restarted operator, and its one pod.
    (after,) = fleet.compile_jobs(new)
    assert after["metadata"]["uid"] == job["metadata"]["uid"]
    assert after["status"].get("succeeded") == 1
    assert not after["status"].get("failed")


def test_a_deleted_pod_finishes_its_requests_and_none_fails(fleet: Fleet) -> None:
    serving = fleet.status()["currentRevision"]
    victim = fleet.pods()[0]
    name = victim["metadata"]["name"]
    grace = victim["spec"]["terminationGracePeriodSeconds"]
    # Longer completions, more often, so that some are on the pod when it is deleted.
    with fleet.load("drain", rate=2 * RATE, max_tokens=DRAIN_TOKENS) as load:
        fleet.wait(lambda: fleet.running_requests(victim) > 0, f"a request running on {name}", timeout=60)
        deleted_at = time.time()
        fleet.kubectl("delete", "pod", name, "--wait=false")
        fleet.wait(lambda: name not in {p["metadata"]["name"] for p in fleet.pods()}, f"pod {name} gone", grace + 30)
        gone_at = time.time()
        time.sleep(AFTER_S)
        result = load.stop()
    report("drain", result, deleted=deleted_at, gone=gone_at)
    # Requests were on the way when the pod was deleted, and every one was answered; none got a 503:
    # the preStop sleep keeps the pod serving until the Service no longer sends it anything new.
    in_flight = result.in_flight_at(deleted_at)
    assert in_flight, "no request was in flight at the deletion"
    assert all(a.ok for a in in_flight)
    assert result.failed == {}, result.summary
    assert result.sent_between(deleted_at, gone_at), "nothing was sent during the drain"
    assert {a.header for a in result.answers} == {serving}
    fleet.wait(lambda: fleet.rolled_out_to(serving), "the replacement pod Ready")


def test_kubectl_scale_moves_the_replicas_under_load(fleet: Fleet) -> None:
    serving = fleet.status()["currentRevision"]
    with fleet.load("scale") as load:
        fleet.kubectl("scale", "nis", NAME, "--replicas=1")
        fleet.wait(lambda: fleet.rolled_out_to(serving, replicas=1), "one replica")
        assert fleet.get("deployment", NAME)["spec"]["replicas"] == 1
        fleet.kubectl("scale", "nis", NAME, "--replicas=2")
        fleet.wait(lambda: fleet.rolled_out_to(serving, replicas=2), "two replicas again")
        result = load.stop()
    report("scale", result)
    assert result.failed == {}, result.summary
    status = fleet.status()
    assert (status["replicas"], status["readyReplicas"]) == (2, 2)
