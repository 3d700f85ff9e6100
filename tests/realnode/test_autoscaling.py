"""Autoscaling on real pods: a real Prometheus scraping the engines, KEDA and the HPA on the scale subresource.

One autoscaled ``device: sim`` service on the real node (:mod:`harness.fleet`), its operator installed by the
chart with autoscaling on, and the rig of :mod:`neuronfleet.devcluster.addons.autoscaling_rig`. Load through the
Service raises ``vllm:num_requests_waiting``; the tests record waiting requests, replicas asked for and
ready, and the pods' revisions every two seconds, and every serving pod the API server reports (a watch:
its revision, when it was created, when its deletion began and when it was gone), and assert on those
timelines, not only on the end state.
"""

from __future__ import annotations

import copy
import datetime
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from harness.cluster_fixtures import NodeImage
from harness.fleet import NAME, POD_TIMEOUT_S, Fleet, identity_hash, pod_ready, report, started
from harness.node_load import NodeLoad

from neuronfleet.contract.names import LABEL_ARTIFACT
from neuronfleet.devcluster.addons.autoscaling_rig import AutoscalingRig, AutoscalingRigError
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.realnode.node import RealNode
from neuronfleet.operator import plan
from neuronfleet.operator.policy import scaling

Obj = dict[str, Any]

#: The service's autoscaling: quick to act, so the test sees it within minutes. Two replicas a step: one
#: step takes the service from one to three, both new pods starting side by side.
AUTOSCALING: Obj = {
    "minReplicas": 1,
    "maxReplicas": 3,
    "waitingRequestsPerReplica": 2,
    "pollingIntervalSeconds": 2,
    "scaleUpReplicas": 2,
    "scaleUpPeriodSeconds": 10,
    "scaleDownStabilizationSeconds": 10,
}
#: One sequence at a time per replica: the simulated device answers 200 tokens in about 0.25 s (0.8 ms a
#: decode step of the tiny shape on trn2's calibrated clock, and vLLM's own time), so four at a time would
#: keep up with any rate the load tool sends on two cores.
MAX_NUM_SEQS = 1
SCALE_TOKENS = 200
#: On top of the steady load, a burst one replica cannot keep up with (it answers about 4 requests a
#: second): requests queue on it (vllm:num_requests_waiting) while the replicas KEDA adds are loading,
#: about 2 more a second. Requests queued on a replica stay there, so the margin is small: the last of
#: them is answered well within the client's 60 s.
BURST_RATE = 5.0
#: The load that goes on while replicas are removed: one replica serves it with nothing waiting.
STEADY_RATE = 1.0


@dataclass(frozen=True)
class Moment:
    """One sample of the autoscaling timeline."""

    at: float
    waiting: float | None
    wanted: int | None
    ready: int
    artifacts: tuple[str, ...]


class Timeline:
    """Samples waiting requests (from Prometheus), replicas asked for and ready, and pods' revisions, every 2 s."""

    def __init__(self, fleet: Fleet, rig: AutoscalingRig) -> None:
        self.fleet, self.rig = fleet, rig
        self.moments: list[Moment] = []
        self.gaps: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timeline", daemon=True)

    def _sample(self) -> Moment:
        waiting = f"sum({scaling.series(scaling.WAITING_REQUESTS, self.fleet.namespace, NAME)})"
        body = self.fleet.get("nis", NAME)
        pods = [p for p in self.fleet.pods() if not p["metadata"].get("deletionTimestamp")]
        return Moment(
            at=time.time(),
            waiting=self.rig.value(waiting),
            wanted=body["spec"].get("replicas"),
            ready=sum(pod_ready(p) for p in pods),
            artifacts=tuple(sorted(p["metadata"]["labels"][LABEL_ARTIFACT] for p in pods)),
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.moments.append(self._sample())
            except (AssertionError, AutoscalingRigError) as error:
                # A sample lost to a slow kubectl or query leaves a gap, shown with the timeline.
                self.gaps.append(f"{time.time():.1f}: {error}")
            self._stop.wait(2)

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def print(self, test: str) -> None:
        """The timeline, for the log and the issue's note."""
        start = self.moments[0].at if self.moments else 0.0
        print(f"==> {test} timeline: seconds, waiting requests, replicas asked for, ready, pods' revisions", flush=True)
        for m in self.moments:
            waiting = "-" if m.waiting is None else f"{m.waiting:g}"
            print(f"    {m.at - start:6.1f} {waiting:>4} {m.wanted} {m.ready} {','.join(m.artifacts)}", flush=True)
        for gap in self.gaps:
            print(f"    no sample at {gap}", flush=True)


def timestamp(value: str) -> float:
    """An API server's timestamp (RFC 3339, whole seconds) as Unix seconds."""
    return datetime.datetime.fromisoformat(value).timestamp()


@dataclass
class PodLife:
    """One serving pod, as the watch reported it (Unix seconds)."""

    name: str
    artifact: str
    #: Its creationTimestamp (whole seconds, rounded down, on this machine's clock: the API server runs here).
    created: float
    #: When the watch first reported it.
    seen: float
    #: When the watch first reported its deletion begun (deletionTimestamp set: preStop, then SIGTERM).
    deleted: float | None = None
    #: When the watch reported it gone (its containers stopped, the object removed).
    gone: float | None = None


class PodWatch:
    """Every serving pod the API server reports from the start (a watch on the service's pods).

    Polls can miss a pod that comes and goes between two samples; a watch sees every pod the API server
    ever held, with its revision and creation time.
    """

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.pods: dict[str, PodLife] = {}
        self.errors: list[str] = []
        self._selector = ",".join(f"{k}={v}" for k, v in plan.service_labels(NAME).items())
        self._stop = threading.Event()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def _see(self, kind: str, pod: Obj) -> None:
        now = time.time()
        meta = pod["metadata"]
        life = self.pods.get(meta["uid"])
        if life is None:
            life = PodLife(meta["name"], meta["labels"][LABEL_ARTIFACT], timestamp(meta["creationTimestamp"]), now)
            self.pods[meta["uid"]] = life
        if meta.get("deletionTimestamp") and life.deleted is None:
            life.deleted = now
        if kind == "DELETED":
            life.gone = now

    def _run(self) -> None:
        from kubernetes import watch
        from kubernetes.client import ApiException, CoreV1Api

        with self.fleet.cluster.api_client() as client:
            core = CoreV1Api(client)
            version = self._list(core)
            self._started.set()
            while not self._stop.is_set():
                # Short watches, each from where the last ended, so a stop is seen within two seconds.
                stream = watch.Watch().stream(
                    core.list_namespaced_pod,
                    self.fleet.namespace,
                    label_selector=self._selector,
                    resource_version=version,
                    timeout_seconds=2,
                )
                try:
                    for event in stream:
                        self._see(event["type"], event["raw_object"])
                        version = event["raw_object"]["metadata"]["resourceVersion"]
                except ApiException as error:
                    # 410 Gone: the version is too old; list again (the pods already seen keep their times).
                    self.errors.append(f"{time.time():.1f}: {error.status} {error.reason}")
                    version = self._list(core)

    def _list(self, core: Any) -> str:
        """See the pods there are now; the list's resourceVersion, to watch from."""
        listed = json.loads(
            core.list_namespaced_pod(self.fleet.namespace, label_selector=self._selector, _preload_content=False).data
        )
        for pod in listed["items"]:
            self._see("ADDED", pod)
        version: str = listed["metadata"]["resourceVersion"]
        return version

    def __enter__(self) -> PodWatch:
        self._thread.start()
        # Once the pods there are have been listed, every later one is seen as it comes.
        assert self._started.wait(30), "the pod watch did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def print(self, test: str, start: float, **moments: float) -> None:
        """Every pod seen, and the test's moments, in seconds from ``start``, for the log and the issue's note."""

        def at(moment: float | None) -> str:
            return "-" if moment is None else f"{moment - start:.1f}"

        print(f"==> {test} pods (seconds): name, revision, created, seen, deletion begun, gone", flush=True)
        for life in sorted(self.pods.values(), key=lambda p: p.seen):
            print(
                f"    {life.name} {life.artifact} {at(life.created)} {at(life.seen)} {at(life.deleted)} "
                f"{at(life.gone)}",
                flush=True,
            )
        print("    moments: " + ", ".join(f"{name} {at(moment)}" for name, moment in moments.items()), flush=True)
        for error in self.errors:
            print(f"    watch error at {error}", flush=True)


def autoscaling_condition(fleet: Fleet) -> Obj:
    """The service's Autoscaling condition (empty while there is none)."""
    return next((c for c in fleet.status().get("conditions", []) if c["type"] == "Autoscaling"), {})


def compile_finished(fleet: Fleet, artifact_hash: str) -> float:
    """When the artifact's compile Job finished (Unix seconds, rounded down), once the service says it is Ready.

    The Job's end, not when a poll saw the status: the operator applies the new pod template before it
    writes that status, so only this moment has nothing of the new revision before it.
    """
    # Right after an apply the status still names the serving artifact, Ready: wait for this one.
    artifact = fleet.wait(
        lambda: (
            (ref := fleet.status().get("artifact") or {}).get("hash") == artifact_hash
            and ref.get("phase") == "Ready"
            and ref
        ),
        f"artifact {artifact_hash} compiled",
    )
    return timestamp(fleet.get("nca", artifact["name"])["status"]["completedAt"])


def answering_pods(fleet: Fleet, rig: AutoscalingRig) -> int:
    """Serving pods that have answered requests, by vLLM's counter in Prometheus."""
    answered = f"sum by (pod) ({scaling.series('vllm:request_success_total', fleet.namespace, NAME)})"
    return sum(float(sample["value"][1]) > 0 for sample in rig.query(answered))


def answered_by(load: NodeLoad) -> set[str | None]:
    """The revisions that have answered ``load`` so far (the load tool writes each outcome as it ends)."""
    lines = load.outcomes.read_text().splitlines() if load.outcomes.is_file() else []
    return {outcome["header"] for outcome in map(json.loads, lines) if outcome["result"] == "200"}


@pytest.fixture(scope="module")
def fleet(
    real_cluster: LocalCluster,
    real_node: RealNode,
    node_image: NodeImage,
    autoscaling_rig: AutoscalingRig,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    """The service autoscaled between 1 and 3 replicas, its ScaledObject querying the rig's Prometheus."""
    workdir = tmp_path_factory.mktemp("autoscaled")
    with started(
        real_cluster,
        real_node,
        node_image,
        workdir,
        prometheus=autoscaling_rig.prometheus_url,
        autoscaling=AUTOSCALING,
        max_num_seqs=MAX_NUM_SEQS,
    ) as service:
        yield service


def test_load_scales_the_service_out_and_back_in_under_load_without_losing_a_request(
    fleet: Fleet, autoscaling_rig: AutoscalingRig
) -> None:
    serving = fleet.status()["currentRevision"]
    fleet.wait(lambda: autoscaling_condition(fleet).get("reason") == "Scaling", "Autoscaling=True", timeout=60)
    # Idle, it stays at minReplicas.
    fleet.wait(lambda: fleet.rolled_out_to(serving, replicas=1), "one replica while idle", timeout=180)
    # KEDA holds it there through the scale subresource (it writes spec.replicas up to minReplicas).
    fleet.wait(lambda: fleet.get("nis", NAME)["spec"].get("replicas") == 1, "KEDA at minReplicas", timeout=60)

    top = AUTOSCALING["maxReplicas"]
    # Two loads through the Service: a steady one for the whole test, and a burst on top of it until every
    # replica answers. When the burst stops the rate falls to the steady one's, which goes on while
    # the replicas go.
    with (
        Timeline(fleet, autoscaling_rig) as timeline,
        PodWatch(fleet) as watch,
        fleet.load("steady", rate=STEADY_RATE, max_tokens=SCALE_TOKENS) as steady,
    ):
        # A connection of its own for each request of the burst: kube-proxy sends each to any replica, the
        # new ones included, where reused connections would keep going to the first.
        with fleet.load("burst", rate=BURST_RATE, max_tokens=SCALE_TOKENS, keep_alive=False) as burst:
            loaded_at = time.time()
            fleet.wait(lambda: fleet.rolled_out_to(serving, replicas=top), f"{top} Ready replicas under load")
            out_at = time.time()
            fleet.wait(lambda: answering_pods(fleet, autoscaling_rig) == top, "every replica answering", timeout=60)
            lowered_at = time.time()
            burst_result = burst.stop()
        # Back to one: the replicas removed have drained and are gone, all under the steady load.
        fleet.wait(lambda: fleet.rolled_out_to(serving, replicas=1), "back to one replica under load", timeout=300)
        in_at = time.time()
        steady_result = steady.stop()
    start = steady_result.answers[0].sent_at
    timeline.print("autoscale")
    moments = {"loaded": loaded_at, "all_ready": out_at, "lowered": lowered_at, "one_again": in_at}
    watch.print("autoscale", start, **moments)
    report("autoscale burst", burst_result, **moments)
    report("autoscale steady", steady_result, **moments)
    # The pods whose deletion the watch saw begin.
    removed = sorted(
        (p for p in watch.pods.values() if p.deleted is not None and p.deleted > p.seen), key=lambda p: p.seen
    )
    up = steady_result.sent_between(0, lowered_at) + burst_result.answers
    down = steady_result.sent_between(lowered_at)
    print(
        f"==> autoscale: scale-up sent {len(up)}, failed {sum(not a.ok for a in up)}; "
        f"scale-in sent {len(down)}, failed {sum(not a.ok for a in down)}; "
        + "; ".join(
            f"{p.name} removed at {p.deleted - start:.1f} s with {len(steady_result.in_flight_at(p.deleted))} "
            f"in flight, gone at {p.gone - start:.1f} s, {len(steady_result.sent_between(p.deleted, p.gone))} "
            f"sent meanwhile"
            for p in removed
            if p.deleted is not None and p.gone is not None
        ),
        flush=True,
    )

    target = AUTOSCALING["waitingRequestsPerReplica"]
    # Over time: idle at one replica; requests queued past the target before KEDA asked for more; all
    # the way to maxReplicas under load; back to minReplicas once the load fell.
    before = [m for m in timeline.moments if m.at < loaded_at]
    assert all(m.wanted == 1 for m in before)
    first_out = next(m for m in timeline.moments if (m.wanted or 0) > 1)
    assert first_out.at > loaded_at
    assert any((m.waiting or 0) > target for m in timeline.moments if m.at <= first_out.at)
    assert max(m.wanted or 0 for m in timeline.moments if m.at <= lowered_at) == top
    assert timeline.moments[-1].wanted == AUTOSCALING["minReplicas"]
    # Scale-in happened under load: the replicas removed were removed after the burst, and the steady
    # load sent requests while each of them went (from the start of its deletion to its end).
    assert len(removed) == top - 1, removed
    for pod in removed:
        assert pod.deleted is not None, pod
        assert pod.gone is not None, pod
        assert lowered_at < pod.deleted < pod.gone <= in_at, (pod, moments)
        assert steady_result.sent_between(pod.deleted, pod.gone), (pod, "no request sent while it went")
    # Nothing lost: every request sent through the scale-up and the scale-in was answered 200, by the
    # serving revision; none timed out, none was refused, none was dropped for want of room.
    for result in (burst_result, steady_result):
        assert result.failed == {}, result.summary
        assert result.summary["sent"] == result.summary["succeeded"] == len(result.answers), result.summary
    assert {a.header for a in up + down} == {serving}


def test_a_bucket_change_during_a_scale_up_starts_no_replica_before_its_compile(
    fleet: Fleet, autoscaling_rig: AutoscalingRig
) -> None:
    old = fleet.status()["currentRevision"]
    target = AUTOSCALING["waitingRequestsPerReplica"]
    waiting = f"sum({scaling.series(scaling.WAITING_REQUESTS, fleet.namespace, NAME)})"
    # One replica at most until the bucket change: KEDA can add none before the compile starts, and every
    # replica added after is one the scale-up made during the compile.
    held = copy.deepcopy(fleet.manifest)
    held["spec"]["autoscaling"] = {**AUTOSCALING, "maxReplicas": 1}
    fleet.apply(held)
    fleet.wait(lambda: fleet.get("hpa", f"keda-hpa-{NAME}")["spec"]["maxReplicas"] == 1, "KEDA's HPA at 1", timeout=60)
    # The change lifts the bound to two: with the rollout's surge that is what the node holds beside a
    # compile pod.
    changed = fleet.with_buckets([32, 256])
    changed["spec"]["autoscaling"] = {**AUTOSCALING, "maxReplicas": 2}
    new = identity_hash(changed)
    # The burst queues requests until the scale-up's replica exists; the steady load goes on through the
    # compile and the rollout, so both revisions answer and the old replicas drain under load.
    with (
        Timeline(fleet, autoscaling_rig) as timeline,
        PodWatch(fleet) as watch,
        fleet.load("compile-steady", rate=STEADY_RATE, max_tokens=SCALE_TOKENS) as steady,
    ):
        with fleet.load("compile-burst", rate=BURST_RATE, max_tokens=SCALE_TOKENS) as burst:
            fleet.wait(lambda: (autoscaling_rig.value(waiting) or 0) > target, "requests waiting past the target", 60)
            assert len(fleet.pods()) == 1, "a replica was added before the bucket change"
            applied_at = fleet.apply(changed)
            fleet.wait(lambda: len(fleet.pods()) > 1, "the scale-up's replica", timeout=60)
            lowered_at = time.time()
            burst_result = burst.stop()
        compiled_at = compile_finished(fleet, new)
        # However many replicas KEDA asks for by then: Ready is all of them on the new revision.
        fleet.wait(
            lambda: (status := fleet.status()).get("phase") == "Ready" and status.get("currentRevision") == new,
            f"every replica on {new}",
            timeout=2 * POD_TIMEOUT_S,
        )
        fleet.wait(lambda: new in answered_by(steady), f"an answer from {new}", timeout=60)
        steady_result = steady.stop()
    start = steady_result.answers[0].sent_at
    moments = {"applied": applied_at, "lowered": lowered_at, "compiled": compiled_at}
    timeline.print("scale during compile")
    watch.print("scale during compile", start, **moments)
    report("scale during compile burst", burst_result, **moments)
    report("scale during compile steady", steady_result, **moments)
    during = [m for m in timeline.moments if applied_at <= m.at < compiled_at]
    assert during, "the compile ended before the timeline saw it"
    # While the new artifact compiled, the scale-up added a replica of the serving revision, none of the new.
    assert all(set(m.artifacts) == {old} for m in during), [m.artifacts for m in during]
    # The watch saw every pod: those that came after the change and before the compile's end are the
    # scale-up's, all of the serving revision, and there is one.
    added = [p for p in watch.pods.values() if p.seen >= applied_at and p.created < compiled_at]
    assert added, "no replica was created during the compile"
    assert {p.artifact for p in added} == {old}, added
    # And no pod of the new revision was created before its compile ended (both times in whole seconds).
    newer = [p for p in watch.pods.values() if p.artifact == new]
    assert newer, "the watch saw no pod of the new revision"
    assert all(p.created >= compiled_at for p in newer), (compiled_at, newer)
    # Both revisions answered, and nothing was lost through the scale-up, the compile and the rollout.
    answers = burst_result.answers + steady_result.answers
    assert {a.header for a in answers if a.ok} == {old, new}
    for result in (burst_result, steady_result):
        assert result.failed == {}, result.summary
        assert result.summary["sent"] == result.summary["succeeded"] == len(result.answers), result.summary
