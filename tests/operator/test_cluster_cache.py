"""Reconciles on an outdated cache, against the real local control plane: no duplicate Job, no flapping status.

The operator reads what its watches delivered, which may lag the API server. Here the reconcilers run
over a :class:`CachedKube` whose view the test holds back (an object's newest event not delivered yet,
or delivered late), and show which guard holds: the compile Job's deterministic name (a second create
is a 409, then the server is read), server-side apply (applying on a view without the Deployment
changes nothing), and a cache that never goes back to an older object.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from harness.services import Services
from kubernetes.client import ApiClient

from neuronfleet.contract.names import LABEL_ARTIFACT, MANAGED_BY_LABEL, OPERATOR_NAME
from neuronfleet.devcluster.controlplane.kwok import COMPLETE_AFTER_ANNOTATION
from neuronfleet.devcluster.controlplane.status import phase_of
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator import plan
from neuronfleet.operator.cluster import cache as cache_module
from neuronfleet.operator.cluster.cache import APPLIED_ANNOTATION, CACHED, CachedKube, ObjectCache
from neuronfleet.operator.cluster.kube import ARTIFACTS, CONFIGMAPS, DEPLOYMENTS, JOBS, SERVICES_NIS, Kube
from neuronfleet.operator.policy.conditions import Event, Reason
from neuronfleet.operator.reconcilers import Manager

pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]


def spec(revision: str, complete_after: str) -> Obj:
    """One replica (one Trainium2 device); its compile pod succeeds after ``complete_after``."""
    return {
        "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": revision},
        "engine": {"max_num_seqs": 8, "tensor_parallel_size": 4},
        "replicas": 1,
        "compile": {
            "artifactStore": "s3://neuronfleet-test/neff",
            "resources": {"cpu": "10m", "memory": "64Mi"},
            "podAnnotations": {COMPLETE_AFTER_ANNOTATION: complete_after},
        },
    }


def version(body: Obj | None) -> str | None:
    return None if body is None else str(body["metadata"]["resourceVersion"])


def test_a_reconcile_on_an_outdated_view_converges_on_the_next_event(
    kube: ApiClient, api: Kube, namespace: str, services: Services, crds: Path, wait_for: WaitFor
) -> None:
    cache = ObjectCache()
    cached = CachedKube(kube, cache)
    events: list[Event] = []
    manager = Manager(cached, lambda body, event: events.append(event))
    services.create("llama", spec("0e9e39f", "0s"))
    # Its compile never ends: its artifact stays Compiling, with its Job.
    services.create("slow", spec("slow", "8760h"))

    def everything_once() -> tuple[str | None, str | None]:
        # What the watches and handlers would do: the view brought up to date, then both kinds reconciled.
        cached.relist(namespace)
        for artifact in cached.list(ARTIFACTS, namespace):
            manager.reconcile_artifact(namespace, artifact["metadata"]["name"])
        for name in ("llama", "slow"):
            manager.reconcile_service(namespace, name)
        slow = services.get("slow").get("status", {}).get("artifact", {}).get("name")
        compiling = api.get(ARTIFACTS, namespace, slow) if slow else None
        return phase_of(services.get("llama")), (compiling or {}).get("status", {}).get("reason")

    # Until nothing moves: llama served, slow's compile pod running (its status changes no more).
    settled = ("Ready", Reason.JOB_RUNNING)
    wait_for(everything_once, lambda seen: seen == settled, what="llama Ready, slow compiling", timeout=90)
    ready = services.get("llama")
    name = services.get("slow")["status"]["artifact"]["name"]
    compiling = api.get(ARTIFACTS, namespace, name)
    job = api.get(JOBS, namespace, plan.compile_job_name(name))
    assert job is not None
    told = len(events)

    # 1. The view lacks the compile Job (its event not delivered yet) of an artifact that is not compiled:
    # the reconciler starts one; the Job's deterministic name makes the create a 409, then the server is read,
    # and the status, computed from that Job, stays as it was.
    cache.forget(job)
    assert cached.get(JOBS, namespace, plan.compile_job_name(name)) is None
    manager.reconcile_artifact(namespace, name)
    jobs = [
        j["metadata"]["uid"]
        for j in api.list(JOBS, namespace, LABEL_ARTIFACT)
        if j["metadata"]["name"] == job["metadata"]["name"]
    ]
    assert jobs == [job["metadata"]["uid"]]
    assert version(api.get(ARTIFACTS, namespace, name)) == version(compiling)
    # The 409's fresh read is in the view now: the next event finds it there.
    assert cached.get(JOBS, namespace, plan.compile_job_name(name)) is not None

    # 2. The view lacks the Deployment: the service applies its serving objects again, which changes nothing
    # on the server, and its status holds (no write, no event).
    deployment = api.get(DEPLOYMENTS, namespace, "llama")
    assert deployment is not None
    cache.forget(deployment)
    manager.reconcile_service(namespace, "llama")
    assert version(api.get(DEPLOYMENTS, namespace, "llama")) == version(deployment)
    assert version(services.get("llama")) == version(ready)

    # 3. A late event with an older Deployment (its first version, no replica ready) does not take the
    # view back: the status does not flap to RollingOut.
    stale = {**deployment, "metadata": {**deployment["metadata"], "resourceVersion": "1"}, "status": {}}
    cache.observe(stale)
    manager.reconcile_service(namespace, "llama")
    assert version(services.get("llama")) == version(ready)
    assert phase_of(services.get("llama")) == "Ready"

    # 4. The next events (the view up to date): nothing to do, nothing written, nothing told.
    def versions() -> list[str | None]:
        return [version(o) for o in (*api.list(SERVICES_NIS, namespace), *services.artifacts())]

    written = versions()
    everything_once()
    assert versions() == written
    assert events[told:] == []
    assert len(api.list(JOBS, namespace, LABEL_ARTIFACT)) == 2

    # 5. A restarted operator (an empty cache, filled by its watches' first lists) applies nothing its
    # predecessor applied: what that one applied is stamped on each object.
    restarted = Restarted(kube, ObjectCache())
    restarted.relist(namespace)
    restarted.relist_unwatched(namespace)
    Manager(restarted, lambda body, event: events.append(event)).reconcile_service(namespace, "llama")
    assert restarted.applied == []
    assert versions() == written
    assert events[told:] == []
    # Without the stamp (an object made by hand, or by an operator that did not stamp), it is applied once.
    unstamped = {"metadata": {"annotations": {APPLIED_ANNOTATION: None}}}
    api.merge_patch(DEPLOYMENTS, namespace, "llama", unstamped)
    restarted.relist(namespace)
    Manager(restarted, lambda body, event: events.append(event)).reconcile_service(namespace, "llama")
    assert restarted.applied == ["Deployment"]


class Applies(Kube):
    """The real client, noting each server-side apply it sends."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.applied: list[str] = []

    def apply(self, body: Obj) -> Obj:
        """Apply, and note the kind."""
        self.applied.append(body["kind"])
        return super().apply(body)


class Restarted(CachedKube, Applies):
    """An operator's cached client, started afresh, whose applies that reach the server are noted."""


def test_a_resync_lets_event_driven_reconciles_finish_before_its_next_object(
    kube: ApiClient, namespace: str, services: Services, crds: Path
) -> None:
    # A pass over 1,000 services takes a second on 2 cores: a change must not wait it out.
    manager = Manager(CachedKube(kube, ObjectCache()), lambda body, event: None, events_first_timeout=60)
    for name in ("a", "b"):
        services.create(name, spec(name, "8760h"))
    turns: list[threading.Event] = [threading.Event(), threading.Event()]

    def between() -> None:
        for turn in turns:
            if not turn.is_set():
                turn.set()
                return

    # The pass's first object is "a" (lists come in name order); the event is about "b".
    with manager.locks.held(("service", namespace, "b")):
        # A watch event's reconcile of "b", held on the lock the test holds: it is in flight.
        event = threading.Thread(target=manager.reconcile_service, args=(namespace, "b"))
        event.start()
        resync = threading.Thread(target=manager.resync, args=([namespace], between))
        resync.start()
        assert turns[0].wait(timeout=30), "the resync never reached its first object"
        # The pass waits for the event's reconcile: no second object while it is in flight.
        resync.join(timeout=1.0)
        assert resync.is_alive()
        assert not turns[1].is_set()
    event.join(timeout=30)
    resync.join(timeout=60)
    assert not event.is_alive()
    assert not resync.is_alive()
    assert turns[1].is_set()
    assert [phase_of(services.get(name)) for name in ("a", "b")] == ["Compiling", "Compiling"]


class PagesCounted(CachedKube):
    """A :class:`CachedKube` that counts the pages its lists asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pages = 0

    def request(self, method: str, path: str, **kwargs: Any) -> Obj:
        if any(key == "limit" for key, _ in kwargs.get("query") or []):
            self.pages += 1
        return super().request(method, path, **kwargs)


def test_a_resync_lists_by_pages_keeps_every_object_listed_and_drops_what_was_deleted_unseen(
    kube: ApiClient, api: Kube, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "RELIST_PAGE", 2)
    labels = {MANAGED_BY_LABEL: OPERATOR_NAME}
    created = [
        api.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"cm-{i}", "namespace": namespace, "labels": labels},
            }
        )
        for i in range(5)
    ]
    cached = PagesCounted(kube, ObjectCache())
    # Seen before the list, deleted since with no event: older than the list's snapshot.
    gone = {**created[0], "metadata": {**created[0]["metadata"], "name": "deleted-unseen", "uid": "gone"}}
    cached.cache.observe(gone)
    cached.relist(namespace)
    names = sorted(c["metadata"]["name"] for c in cached.list(CONFIGMAPS, namespace))
    assert names == [f"cm-{i}" for i in range(5)]
    # Five ConfigMaps two to a page, and one page for each other kind the resync lists.
    assert cached.pages == 3 + len(CACHED) - 1
