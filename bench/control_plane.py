"""What the operator costs on a real control plane: latency, API requests, memory, idleness.

A local control plane (``neuronfleet.devcluster``: etcd, kube-apiserver, controller manager,
scheduler, KWOK playing fake Trainium2 and CPU nodes) gets the Helm chart (CRDs, ServiceAccount,
RBAC) for one namespace, and runs the operator as a child process under the chart's ServiceAccount,
so its rights are the chart's and the API server can tell its requests apart. One run measures, in
order:

- **apply -> Ready**, one service at a time: a NeuronInferenceService with a new compile identity
  (its compile pod succeeds at once, ``neuronfleet.io/kwok-complete-after: 0s``, so no simulated
  compile time is in the figure, only the Job's orchestration), then a second one with the same
  identity (its artifact is compiled: the rollout alone). The baseline, interleaved with them, is
  what a user with hand-written YAML gets: the same ConfigMap, Deployment (the same pod template,
  made by the operator's own planner), Service and PodDisruptionBudget, server-side applied, until
  the Deployment is Available. Each clock starts before the first request and stops when a watch
  delivers the state, on both sides alike.
- **reconcile latency**: a spec change that needs no compile (a pod annotation; it rolls the pods)
  until ``status.observedGeneration`` catches up, one service at a time.
- **probes at 1, ``--midpoint`` (100) and ``--fleet`` (1,000) services**: the same latency, for
  ``--probe-changes`` spec changes of one service (``probe``, the first one created), each waited
  on until its rollout is Ready, with the requests per reconcile and the operator's memory at that
  size. The probe at 1 runs first, alone in the namespace; the others once the fleet has grown.
- **idleness**: once everything is Ready, and right after a full resync, the operator's write
  requests over ``--idle-seconds`` (shorter than the resync period, so no pass falls inside) must
  be 0. The next full resync is then measured alone: its requests, how long it took, and the
  objects it changed (resourceVersions), which must be 0 too (its server-side applies are
  requests, but no-ops).
- **memory**: the operator's RSS (psutil) and peak (``/proc``) after the above, and again once the namespace
  holds ``--fleet`` services. The added services share ``--fleet-identities`` compile identities
  (30: a fleet's few models and bucket sets; not 1,000: every service reconcile lists the namespace's
  artifacts, so that run would measure the lists; not one: 1,000 services racing to add themselves to one
  artifact's owner references conflict and retry). Each compiles at once and serves: its Deployment, its
  pod (KWOK, on as many Trainium2 nodes as the fleet needs and a quarter more), Service and PDB, Ready.
  ``--compiling-fleet`` keeps their compiles running for ever instead (no Deployment, pod, Service or
  PDB; a quicker run that measures the operator's watches of services, artifacts and Jobs alone).
- **a steady stream of spec changes** at 1, ``--midpoint`` and ``--fleet`` services (serving fleets only):
  ``--steady-changes`` (200) changes at ``--steady-rate`` (10) per second, to every service in turn, of
  three kinds in turn (a pod annotation: the pods roll; the replicas, 1 <-> 2; ``max_num_seqs`` 8 <-> 16:
  a new compile identity, compiled at once, then a rollout). Each change's time to the status observing
  it and to Ready, and the operator's API requests per change, its rollout's included.
- **a restart** at ``--fleet`` services: the operator stopped and started again; the time until it has
  reconciled every service, and what that cost in requests, which must hold no write.
- **API requests per reconcile**, in each phase: FlowSchemas (API Priority and Fairness) match the
  operator's ServiceAccount, one per verb and resource the chart's roles grant, and the admin's GET
  /metrics counts ``apiserver_flowcontrol_dispatched_requests_total`` per schema. Reconciles are the
  operator's own count (``neuronfleet_operator_reconciles_total``, both kinds, every outcome, from its
  ``/metrics``): it reads from its watches' cache, so no request marks a reconcile. Watches are not
  counted (opened once, they stream). The operator's CPU time per reconcile comes from psutil.

``--idle-at-fleet`` moves the idleness check and the timed full resync after the fleet. The run
takes about 11 minutes on 2 busy cores (8 with ``--compiling-fleet``); the last line says how many CPU-seconds
it used.

Run: ``make bench-operator`` (or ``.venv/bin/python bench/control_plane.py``).
Prints one table; writes bench/results/operator.json; exits 1 if the idle or restarted operator wrote.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from provenance import commit
from tables import print_table

from neuronfleet.contract.names import LABEL_SERVICE
from neuronfleet.devcluster.addons.metrics import Samples
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.credentials import service_account_kubeconfig
from neuronfleet.devcluster.cluster.local import LocalCluster, reap_orphans
from neuronfleet.devcluster.controlplane.fleet import M7I_8XLARGE, TRN2_48XLARGE, NodePool
from neuronfleet.devcluster.controlplane.kwok import COMPLETE_AFTER_ANNOTATION
from neuronfleet.devcluster.controlplane.status import observed, phase_of, ready_at
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.operator import api, plan
from neuronfleet.operator.cluster.kube import (
    ARTIFACTS,
    CONFIGMAPS,
    DEPLOYMENTS,
    JOBS,
    PDBS,
    SERVICES,
    SERVICES_NIS,
    Kube,
)
from neuronfleet.operator.metrics import QUEUE_WAIT, RESYNC_CPU, RESYNC_DURATION, RESYNC_OBJECTS, RESYNCS
from neuronfleet.operator.runtime.drive import PRIORITY_NAMES, SPEC_CHANGE

#: The operator's reconciles, by kind and outcome; how long its service reconciles took (a histogram).
RECONCILES_TOTAL = "neuronfleet_operator_reconciles_total"
RECONCILE_DURATION_BUCKET = "neuronfleet_operator_reconcile_duration_seconds_bucket"
#: ``Window.reconciles`` keys besides the kinds: objects the full resyncs reconciled, and the service
#: reconciles that took at most ``le=<seconds>``.
RESYNCED = "resync"
#: The full resyncs' CPU seconds, in ``Window.reconciles``.
RESYNC_CPU_S = "resync cpu"
LE = "le="
#: ``Window.reconciles`` keys of the spec changes' waits for a worker: how many waited at most ``wait<=<seconds>``.
WAIT_LE = "wait<="
#: The goal for a spec change's wait for a worker (issue: p99 within 50 ms).
WAIT_GOAL_S = 0.05

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "operator.json"
CHART = REPO / "charts" / "neuronfleet"
#: The chart is installed into the bench's namespace and watches only it; its ServiceAccount is the release's name.
NAMESPACE = "bench"
RELEASE = "neuronfleet"
MODEL_URI = "hf://meta-llama/Llama-3.1-8B"
#: Baseline objects carry this label instead of the operator's, so the operator's watches skip them.
PLAIN_LABEL = "bench.neuronfleet.io/plain"
ROUND_ANNOTATION = "bench.neuronfleet.io/round"
#: The service whose spec changes time the reconcile at 1, --midpoint and --fleet services.
PROBE = "probe"
#: Longer than any bench: a compile that never finishes.
FOREVER = "8760h"

#: Five Trainium2 nodes (80 devices) for the serving pods of both sides and their surges; compile pods
#: run on the CPU nodes.
NODES = (NodePool("trn2", TRN2_48XLARGE, count=5), NodePool("cpu", M7I_8XLARGE, count=2))
#: A serving fleet's spare devices, for the surges of its rollouts and the replicas its changes add.
SPARE = 0.25
#: The kinds of spec change the steady stream sends, in turn: a pod annotation (the pods roll), the replica
#: count (1 <-> 2), the decode batch (``max_num_seqs`` 8 <-> 16: a new compile identity, then a rollout).
CHANGE_KINDS = ("annotation", "replicas", "max_num_seqs")

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
OTHER = "other"
SCHEMA_PREFIX = "bench-operator-"
DISPATCHED_SAMPLE = re.compile(
    r"^apiserver_flowcontrol_dispatched_requests_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE
)
LABEL = re.compile(r'(\w+)="([^"]*)"')


# The cluster and the operator's identity


def service_spec(revision: str, complete_after: str) -> Obj:
    """A one-replica service (TP 4: one Trainium2 device) whose compile pod succeeds after ``complete_after``."""
    return {
        "model": {"uri": MODEL_URI, "revision": revision},
        "engine": {"max_num_seqs": 8, "tensor_parallel_size": 4},
        "replicas": 1,
        "compile": {
            "artifactStore": "s3://neuronfleet-bench/neff",
            "resources": {"cpu": "10m", "memory": "64Mi"},
            "podAnnotations": {COMPLETE_AFTER_ANNOTATION: complete_after},
        },
    }


def nodes(services: int) -> tuple[NodePool, ...]:
    """The Trainium2 nodes for ``services`` one-device replicas and :data:`SPARE` more, at least :data:`NODES`'."""
    devices = TRN2_48XLARGE.neuron_devices
    trn2 = max(NODES[0].count, math.ceil(services * (1 + SPARE) / devices))
    return (NodePool("trn2", TRN2_48XLARGE, count=trn2), *NODES[1:])


def install(cluster: LocalCluster, kube: Kube, directory: Path) -> tuple[Path, list[str]]:
    """The chart (CRDs, ServiceAccount, RBAC) for the bench namespace, FlowSchemas over its ServiceAccount, one
    per verb and resource its roles grant; the ServiceAccount's kubeconfig and the schemas' names."""
    run_checked(cluster.kubectl("create", "namespace", NAMESPACE))
    run_checked(
        cluster.helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--set",
            f"watchNamespaces={{{NAMESPACE}}}",
            "--wait",
            "--timeout=120s",
        )
    )
    cluster.wait_established(CHART / "crds", "the chart's CRDs")
    roles = kube.request(
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        query=[("labelSelector", f"app.kubernetes.io/instance={RELEASE}")],
    )["items"]
    rules = [rule for role in roles for rule in role["rules"]]
    schemas = flow_rules(rules)
    subject = {"kind": "ServiceAccount", "serviceAccount": {"name": RELEASE, "namespace": NAMESPACE}}
    for precedence, (name, rule) in enumerate(schemas.items(), start=20):
        resource_rule = {**rule, "clusterScope": True, "namespaces": ["*"]}
        other = {"nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]} if name == OTHER else {}
        spec = {
            "priorityLevelConfiguration": {"name": "workload-high"},
            "matchingPrecedence": precedence,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [subject], "resourceRules": [resource_rule], **other}],
        }
        kube.request(
            "POST",
            "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas",
            body={
                "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                "kind": "FlowSchema",
                "metadata": {"name": SCHEMA_PREFIX + name},
                "spec": spec,
            },
        )
    kubeconfig = service_account_kubeconfig(cluster, NAMESPACE, RELEASE, directory / "operator.kubeconfig")
    return kubeconfig, list(schemas)


def flow_rules(rules: list[Obj]) -> dict[str, Obj]:
    """One FlowSchema resource rule per verb and resource of ``rules``, named ``verb-resource``, then the rest."""
    schemas: dict[str, Obj] = {}
    for rule in rules:
        for resource in rule.get("resources", []):
            for verb in rule["verbs"]:
                schemas[f"{verb}-{resource.replace('/', '-')}"] = {
                    "verbs": [verb],
                    "apiGroups": rule["apiGroups"],
                    "resources": [resource],
                }
    # Discovery and anything refused.
    schemas[OTHER] = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}
    return schemas


def run_checked(done: subprocess.CompletedProcess[str]) -> None:
    """Fail loudly when kubectl or helm did."""
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, done.args[:3]))} ...: {done.stderr.strip()}")


def cluster_pki(cluster: LocalCluster) -> Path:
    """Where the cluster keeps its CA and the admin's client certificate."""
    return cluster.state.workdir / "pki"


# What the API server and /proc saw


@dataclass
class Window:
    """What the operator did during one ``Requests.counting()`` block."""

    requests: dict[str, float] = field(default_factory=dict)
    #: The operator's reconciles, by kind, of which ``RESYNCED`` in full resyncs, and its service reconciles'
    #: durations (``LE`` keys, cumulative as in the histogram).
    reconciles: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0
    wall_s: float = 0.0


class Requests:
    """The operator's requests as the API server counted them, per FlowSchema (GET /metrics as admin)."""

    def __init__(self, cluster: LocalCluster, operator: OperatorProcess, schemas: list[str]) -> None:
        self._api = cluster.admin_api()
        self._operator = operator
        self._schemas = schemas

    @property
    def pid(self) -> int:
        """The operator's current process (a restart makes a new one)."""
        assert self._operator.process is not None
        return self._operator.process.pid

    def reconciles(self) -> dict[str, float]:
        """The operator's reconciles so far, by kind, those of full resyncs, and its service reconciles' durations."""
        counts = {SERVICES_NIS.kind: 0.0, ARTIFACTS.kind: 0.0}
        for (name, labels), value in self._operator.metrics().items():
            label = dict(labels)
            if name == RECONCILES_TOTAL and label.get("kind") in counts:
                counts[label["kind"]] += value
            elif name == f"{RESYNC_OBJECTS}_total":
                counts[RESYNCED] = value
            elif name == f"{RESYNC_CPU}_total":
                counts[RESYNC_CPU_S] = value
            elif name == RECONCILE_DURATION_BUCKET and label.get("kind") == SERVICES_NIS.kind:
                counts[LE + label["le"]] = value
            elif name == f"{QUEUE_WAIT}_bucket" and label.get("priority") == PRIORITY_NAMES[SPEC_CHANGE]:
                counts[WAIT_LE + label["le"]] = value
        return counts

    def snapshot(self) -> dict[str, float]:
        """Requests dispatched so far, by schema (without the prefix)."""
        counts = dict.fromkeys(self._schemas, 0.0)
        # The exposition runs to megabytes: pick out the one counter rather than parse it all.
        for match in DISPATCHED_SAMPLE.finditer(self._api.request("GET", "/metrics")):
            schema = dict(LABEL.findall(match["labels"])).get("flow_schema", "")
            if schema.startswith(SCHEMA_PREFIX):
                counts[schema.removeprefix(SCHEMA_PREFIX)] += float(match["value"])
        return counts

    @contextmanager
    def counting(self) -> Iterator[Window]:
        """Yields a window that holds, once the block is done, the requests and CPU time spent during it."""
        window = Window()
        reconciles = self.reconciles()
        before, cpu, start = self.snapshot(), cpu_seconds(self.pid), time.monotonic()
        yield window
        after = self.snapshot()
        # A histogram's buckets appear with its first sample.
        window.reconciles = {kind: n - reconciles.get(kind, 0.0) for kind, n in self.reconciles().items()}
        window.requests = {key: after[key] - before[key] for key in self._schemas}
        window.cpu_s = cpu_seconds(self.pid) - cpu
        window.wall_s = time.monotonic() - start


def per_reconcile(window: Window) -> Obj:
    """Requests, reconciles and their ratio in one window, with the operator's CPU time per reconcile."""
    counted = window.requests
    reconciles = window.reconciles[SERVICES_NIS.kind] + window.reconciles[ARTIFACTS.kind]
    # The resyncs' reconciles cost no request when nothing changed: they would flatter the ratio.
    on_events = reconciles - window.reconciles.get(RESYNCED, 0)
    verbs = {key: key.split("-", 1)[0] for key in counted}
    total = sum(counted.values())
    writes = sum(n for key, n in counted.items() if verbs[key] in WRITE_VERBS)
    watches = sum(n for key, n in counted.items() if verbs[key] == "watch")
    return {
        "requests": int(total),
        "writes": int(writes),
        "watches": int(watches),
        "service_reconciles": int(window.reconciles[SERVICES_NIS.kind]),
        "artifact_reconciles": int(window.reconciles[ARTIFACTS.kind]),
        # Watches are opened once and stream: they are no reconcile's cost.
        "requests_per_reconcile": (total - watches) / reconciles if reconciles else None,
        "resync_reconciles": int(reconciles - on_events),
        "requests_per_event_reconcile": (total - watches) / on_events if on_events else None,
        "writes_per_event_reconcile": writes / on_events if on_events else None,
        "service_reconcile_p50_s": duration_quantile(window, 0.5),
        "service_reconcile_p99_s": duration_quantile(window, 0.99),
        "writes_per_reconcile": writes / reconciles if reconciles else None,
        "operator_cpu_s": window.cpu_s,
        "operator_cpu_ms_per_reconcile": 1000 * window.cpu_s / reconciles if reconciles else None,
        "wall_s": window.wall_s,
        "by_request": {key: int(n) for key, n in sorted(counted.items(), key=lambda kv: -kv[1]) if n},
    }


def spec_change_waits(window: Window) -> Obj:
    """How long the window's spec changes waited for a worker (the operator's histogram): how many, the share
    within :data:`WAIT_GOAL_S`, and the bucket holding the 99th percentile (its upper bound, seconds)."""
    buckets = sorted(
        (float(key.removeprefix(WAIT_LE)), n) for key, n in window.reconciles.items() if key.startswith(WAIT_LE)
    )
    total = buckets[-1][1] if buckets else 0
    if not total:
        return {"n": 0}
    within = next(n for bound, n in buckets if bound >= WAIT_GOAL_S)
    p99 = next(bound for bound, n in buckets if n >= 0.99 * total)
    return {"n": int(total), "within_goal": within / total, "p99_at_most_s": p99}


def own_requests(per_change: list[dict[str, float]]) -> Obj:
    """Requests of each spec change's own reconcile (from its patch to the status observing it): the median and
    the largest total, and the mean by verb and resource."""
    totals = [sum(counted.values()) for counted in per_change]
    keys = {key for counted in per_change for key in counted}
    mean = {key: sum(c.get(key, 0.0) for c in per_change) / len(per_change) for key in keys}
    return {
        "median": statistics.median(totals),
        "max": max(totals),
        "n": len(totals),
        "by_request": {key: round(n, 2) for key, n in sorted(mean.items(), key=lambda kv: -kv[1]) if n},
    }


def duration_quantile(window: Window, quantile: float) -> float | None:
    """The service reconciles' duration at ``quantile`` in the window, as its histogram bucket's upper bound."""
    buckets = sorted((float(key.removeprefix(LE)), n) for key, n in window.reconciles.items() if key.startswith(LE))
    total = buckets[-1][1] if buckets else 0
    return next((bound for bound, n in buckets if n >= quantile * total), None) if total else None


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def memory(pid: int, services: int) -> Obj:
    """The process's resident set now and at its peak, with ``services`` in its namespace."""
    rss = psutil.Process(pid).memory_info().rss / 2**20
    # psutil has no peak: the kernel's high-water mark is VmHWM (in kB).
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    peak = int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) / 1024
    return {"services": services, "rss_mib": rss, "peak_mib": peak}


@dataclass(frozen=True)
class Resyncs:
    """The operator's full resyncs so far, from its ``/metrics``."""

    passes: int
    seconds: float
    objects: float

    @classmethod
    def of(cls, samples: Samples) -> Resyncs:
        """From one scrape."""
        return cls(
            passes=int(samples.get((f"{RESYNCS}_total", (("outcome", "ok"),)), 0)),
            seconds=samples.get((f"{RESYNC_DURATION}_sum", ()), 0.0),
            objects=samples.get((f"{RESYNC_OBJECTS}_total", ()), 0.0),
        )


def resyncs(operator: OperatorProcess) -> Resyncs:
    """Scrape the operator's resync counters."""
    return Resyncs.of(operator.metrics())


class WatchError(RuntimeError):
    """A watch of the bench namespace failed (the waits stop at once rather than time out)."""


class EventLog:
    """A watch on one collection in the bench namespace: every object state, with the moment it arrived."""

    def __init__(self, cluster: LocalCluster, path: str) -> None:
        pki = cluster_pki(cluster)
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._client = httpx.Client(verify=context, headers={"Accept": "application/json"})
        self._url = cluster.server + path
        self._events: list[tuple[float, Obj]] = []
        self._latest: dict[str, Obj] = {}
        self._changed = threading.Condition()
        self._error: str | None = None
        threading.Thread(target=self._run, name=f"watch {path}", daemon=True).start()

    def _record(self, obj: Obj) -> None:
        with self._changed:
            self._events.append((time.monotonic(), obj))
            self._latest[obj["metadata"]["name"]] = obj
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            while True:  # a watch that ends (server timeout, 410 Gone) is listed and opened again
                try:
                    self._watch()
                except httpx.HTTPStatusError as error:
                    # 429 while the API server fills a new CRD's watch cache: come back when it says.
                    if error.response.status_code != httpx.codes.TOO_MANY_REQUESTS:
                        raise
                    time.sleep(float(error.response.headers.get("Retry-After") or 1))
        except Exception as error:  # reported by the waiter, on the main thread
            with self._changed:
                self._error = f"{type(error).__name__}: {error}"
                self._changed.notify_all()

    def _watch(self) -> None:
        listing = self._client.get(self._url, timeout=30).raise_for_status().json()
        for obj in listing["items"]:
            self._record(obj)
        query = {"watch": "1", "resourceVersion": listing["metadata"]["resourceVersion"], "timeoutSeconds": "1800"}
        with self._client.stream("GET", self._url, params=query, timeout=1900) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line:
                    continue
                event = json.loads(line)
                if event["type"] == "ERROR":
                    return
                if event["type"] != "DELETED":
                    self._record(event["object"])

    def count(self, predicate: Callable[[Obj], bool]) -> int:
        """How many objects meet ``predicate`` in their latest state."""
        with self._changed:
            if self._error is not None:
                raise WatchError(f"watch failed: {self._error}")
            return sum(1 for obj in self._latest.values() if predicate(obj))

    def latest(self, name: str) -> Obj:
        """The object's latest state."""
        with self._changed:
            return self._latest[name]

    def mark(self) -> int:
        """A position: later waits see only what arrives after it."""
        with self._changed:
            return len(self._events)

    def first(self, name: str, until: Callable[[Obj], bool], since: int, timeout: float, what: str) -> float:
        """When ``name`` first met ``until`` after position ``since`` (monotonic seconds)."""
        deadline = time.monotonic() + timeout
        last: Obj | None = None
        with self._changed:
            while True:
                for at, obj in self._events[since:]:
                    if obj["metadata"]["name"] == name:
                        last = obj
                        if until(obj):
                            return at
                since = len(self._events)
                if self._error is not None:
                    raise WatchError(f"watch for {what} failed: {self._error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    shown = json.dumps((last or {}).get("status"))[:1500]
                    raise TimeoutError(f"{name}: timed out after {timeout:g} s waiting for {what}; last status {shown}")
                self._changed.wait(left)


def observed_at(generation: int) -> Callable[[Obj], bool]:
    """A service whose status is about ``generation`` or later."""
    return lambda b: int((b.get("status") or {}).get("observedGeneration") or 0) >= generation


def ready_since(generation: int) -> Callable[[Obj], bool]:
    """A service Ready for its current spec, ``generation`` or a later one."""
    return lambda b: phase_of(b) == "Ready" and observed(b) and int(b["metadata"]["generation"]) >= generation


def is_available(deployment: Obj) -> bool:
    """A Deployment Available with all its replicas ready and updated, for its current spec."""
    status = deployment.get("status") or {}
    replicas = deployment["spec"]["replicas"]
    available = any(c["type"] == "Available" and c["status"] == "True" for c in status.get("conditions") or [])
    return (
        available
        and status.get("observedGeneration") == deployment["metadata"]["generation"]
        and status.get("readyReplicas", 0) == status.get("updatedReplicas", 0) == replicas
    )


def summary(samples: list[float]) -> Obj:
    """Median, p99 (inclusive quantiles), min, max and the count of latency samples, in seconds."""
    p99 = statistics.quantiles(samples, n=100, method="inclusive")[98] if len(samples) > 1 else samples[0]
    return {
        "median_s": statistics.median(samples),
        "p99_s": p99,
        "min_s": min(samples),
        "max_s": max(samples),
        "n": len(samples),
    }


# The phases


def plain_objects(name: str, spec: Obj) -> list[Obj]:
    """What the operator would serve ``spec`` with, as a user's own YAML: no owner, not the operator's label."""
    parsed = api.parse_service_spec(spec)
    identity = parsed.identity()
    served = plan.ServedArtifact(plan.artifact_name(identity), identity.hash(), parsed.compile)
    owner = plan.Owner(api.API_VERSION, SERVICES_NIS.kind, name, uid="")
    objects = []
    for obj in plan.serving_objects(owner, NAMESPACE, parsed, served):
        obj["metadata"].pop("ownerReferences")
        objects.append(relabel(obj))
    return objects


def relabel(value: Any) -> Any:
    """``value`` with every ``neuronfleet.io/service`` key (labels, selectors) renamed to the bench's own."""
    if isinstance(value, dict):
        return {(PLAIN_LABEL if k == LABEL_SERVICE else k): relabel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [relabel(v) for v in value]
    return value


def create_service(kube: Kube, name: str, spec: Obj) -> Obj:
    """Create a NeuronInferenceService in the bench namespace."""
    metadata = {"name": name, "namespace": NAMESPACE}
    return kube.create({"apiVersion": api.API_VERSION, "kind": SERVICES_NIS.kind, "metadata": metadata, "spec": spec})


def apply_to_ready(kube: Kube, services: EventLog, deployments: EventLog, count: int) -> dict[str, list[float]]:
    """Per index: plain YAML to Available, a fresh service to Ready, a service of a compiled artifact to Ready."""
    times: dict[str, list[float]] = {"plain": [], "fresh": [], "compiled": []}
    for i in range(count):
        spec = service_spec(f"bench-{i}", "0s")
        mark, start = deployments.mark(), time.monotonic()
        for obj in plain_objects(f"plain-{i}", spec):
            kube.apply(obj)
        times["plain"].append(deployments.first(f"plain-{i}", is_available, mark, 60, "Available") - start)
        # The second service has the first one's identity: its artifact is compiled by the time it is applied.
        for kind, name in (("fresh", f"fresh-{i}"), ("compiled", f"compiled-{i}")):
            mark, start = services.mark(), time.monotonic()
            create_service(kube, name, spec)
            times[kind].append(services.first(name, ready_at(1), mark, 60, "Ready") - start)
    return times


def spec_changes(
    kube: Kube,
    services: EventLog,
    names: list[str],
    rounds: int,
    tag: str = "",
    own: tuple[Requests, list[dict[str, float]]] | None = None,
) -> list[float]:
    """Seconds from a pod-annotation change to the status observing it, one service at a time. With ``own``
    (the operator's requests, a list): into the list, each change's requests from its patch until the status
    observed it, by verb and resource (its own reconcile's; the rollout's follow in later reconciles)."""
    latencies = []
    for round_ in range(rounds):
        round_start = services.mark()
        generations = {}
        for name in names:
            before = own[0].snapshot() if own is not None else {}
            mark, start = services.mark(), time.monotonic()
            patch = {"spec": {"podAnnotations": {ROUND_ANNOTATION: f"{tag}{round_}"}}}
            generation = int(kube.merge_patch(SERVICES_NIS, NAMESPACE, name, patch)["metadata"]["generation"])
            latencies.append(services.first(name, observed_at(generation), mark, 60, "observedGeneration") - start)
            if own is not None:
                after = own[0].snapshot()
                # The bench's own patch goes as the admin: every request counted here is the operator's.
                own[1].append({key: after[key] - before[key] for key in after if after[key] > before[key]})
            generations[name] = generation
        # The rollouts finish before the next round (and the next phase) starts.
        for name, generation in generations.items():
            services.first(name, ready_at(generation), round_start, 120, f"Ready at generation {generation}")
    return latencies


def probe(kube: Kube, services: EventLog, requests: Requests, size: int, changes: int) -> Obj:
    """With ``size`` services in the namespace: ``changes`` spec changes of the probe service, one at a time
    (each rolled out before the next), their latency, the requests per reconcile, the operator's memory."""
    own: list[dict[str, float]] = []
    with requests.counting() as window:
        latencies = spec_changes(kube, services, [PROBE], changes, tag=f"probe-{size}-", own=(requests, own))
    return {
        "services": size,
        **summary(latencies),
        "requests": per_reconcile(window),
        "own_requests": own_requests(own),
        "spec_change_waits": spec_change_waits(window),
    }


def settle(requests: Requests, quiet_seconds: float, timeout: float) -> None:
    """Wait until the operator has sent no request for ``quiet_seconds``."""
    counts, changed = requests.snapshot(), time.monotonic()

    def quiet_for() -> float:
        nonlocal counts, changed
        now = requests.snapshot()
        if now != counts:
            counts, changed = now, time.monotonic()
        return time.monotonic() - changed

    wait_for(
        quiet_for,
        lambda quiet: quiet >= quiet_seconds,
        timeout=timeout,
        interval=1.0,
        what=f"{quiet_seconds:g} s without a request from the operator",
    )


def fleet(
    kube: Kube,
    services: EventLog,
    requests: Requests,
    existing: int,
    total: int,
    identities: int,
    timeout: float,
    *,
    serving: bool,
) -> Obj:
    """Grow the namespace to ``total`` services over ``identities`` compile identities (in turn, so services
    created together need different artifacts), until the operator has seen them all: each Ready and serving
    (``serving``), or Compiling for ever."""
    added = total - existing
    phase = "Ready" if serving else "Compiling"
    with requests.counting() as window:
        start = time.monotonic()
        for i in range(existing, total):
            create_service(kube, f"fleet-{i}", service_spec(f"fleet-{i % identities}", "0s" if serving else FOREVER))
        created = time.monotonic() - start

        new = {f"fleet-{i}" for i in range(existing, total)}

        def grown(body: Obj) -> bool:
            return body["metadata"]["name"] in new and phase_of(body) == phase and observed(body)

        wait_for(
            lambda: services.count(grown),
            lambda n: n == added,
            timeout=timeout,
            interval=1.0,
            what=f"{added} services {phase}",
            fatal=(WatchError,),
        )
    return {"services": total, "identities": identities, "created_in_s": created, **per_reconcile(window)}


@dataclass(frozen=True)
class Change:
    """One change of the steady stream: its service and kind, when it was sent, and the generation it made."""

    name: str
    kind: str
    sent: float
    mark: int
    generation: int


def change_patch(kind: str, mark: str, spec: Obj) -> Obj:
    """The merge patch of a change of ``kind`` to a service now at ``spec`` (which it updates); ``mark``, the
    annotation's value, unique to the change (the same value again would change nothing)."""
    if kind == "annotation":
        return {"spec": {"podAnnotations": {ROUND_ANNOTATION: mark}}}
    if kind == "replicas":
        spec["replicas"] = 3 - spec["replicas"]
        return {"spec": {"replicas": spec["replicas"]}}
    spec["max_num_seqs"] = 24 - spec["max_num_seqs"]
    return {"spec": {"engine": {"max_num_seqs": spec["max_num_seqs"]}}}


def send_changes(kube: Kube, services: EventLog, names: list[str], count: int, rate: float) -> list[Change]:
    """``count`` spec changes at ``rate`` per second, to ``names`` in turn, of :data:`CHANGE_KINDS` in turn."""
    specs = {}
    for name in names:
        spec = services.latest(name)["spec"]
        specs[name] = {"replicas": int(spec["replicas"]), "max_num_seqs": int(spec["engine"]["max_num_seqs"])}
    changes = []
    start = time.monotonic()
    for index in range(count):
        # Each change at its own moment, however long the last one's request took: a steady rate.
        time.sleep(max(0.0, start + index / rate - time.monotonic()))
        name, kind = names[index % len(names)], CHANGE_KINDS[index % len(CHANGE_KINDS)]
        mark, sent = services.mark(), time.monotonic()
        patch = change_patch(kind, f"steady-{len(names)}-{index}", specs[name])
        body = kube.merge_patch(SERVICES_NIS, NAMESPACE, name, patch)
        changes.append(Change(name, kind, sent, mark, int(body["metadata"]["generation"])))
    return changes


def steady_changes(
    kube: Kube, services: EventLog, requests: Requests, names: list[str], count: int, rate: float
) -> Obj:
    """With ``names`` serving: ``count`` changes at ``rate`` per second; each one's time to the status observing
    it and to Ready, and the operator's API requests per change (until it is quiet again)."""
    with requests.counting() as window:
        changes = send_changes(kube, services, names, count, rate)
        sent_for = time.monotonic() - changes[0].sent
        # A later change of the same service is observed (and Ready) with it: the first status that covers it.
        observed_s = [
            services.first(c.name, observed_at(c.generation), c.mark, 300, "observedGeneration") - c.sent
            for c in changes
        ]
        ready_s = [services.first(c.name, ready_since(c.generation), c.mark, 600, "Ready") - c.sent for c in changes]
        settle(requests, quiet_seconds=3, timeout=300)
    counted = per_reconcile(window)
    resync_cpu_s = window.reconciles.get(RESYNC_CPU_S, 0.0)
    per_change = {key: counted[key] / count for key in ("requests", "writes", "watches")}
    reads = counted["requests"] - counted["writes"] - counted["watches"]
    return {
        "services": len(names),
        "changes": count,
        "rate": rate,
        "sent_for_s": sent_for,
        "observed": summary(observed_s),
        "ready": summary(ready_s),
        "by_kind": {
            kind: summary(of_kind)
            for kind in CHANGE_KINDS
            if (of_kind := [ready for c, ready in zip(changes, ready_s, strict=True) if c.kind == kind])
        },
        # Watches are opened once and stream: no change's cost.
        "requests_per_change": per_change["requests"] - per_change["watches"],
        "writes_per_change": per_change["writes"],
        "reads_per_change": reads / count,
        # Every reconcile the stream caused, its rollouts' included, over the changes; the full resyncs that fell in
        # the window apart (a fixed cost, every --resync-seconds, whatever changes).
        "operator_cpu_ms_per_change": 1000 * (window.cpu_s - resync_cpu_s) / count,
        "resync_cpu_s": resync_cpu_s,
        "resyncs": window.reconciles.get(RESYNCED, 0.0),
        "spec_change_waits": spec_change_waits(window),
        "requests": counted,
    }


def restart(operator: OperatorProcess, requests: Requests, kube: Kube, services: int, timeout: float) -> Obj:
    """Stop the operator and start it again with ``services`` in the namespace: the time until it has reconciled
    every one (its watches list them all), and the requests that cost until it is quiet (no write: nothing
    changed), with the objects it changed (none)."""
    versions_before = versions(kube)
    operator.stop()
    before, start = requests.snapshot(), time.monotonic()
    operator.start(wait_for)
    up = time.monotonic()
    wait_for(
        lambda: requests.reconciles()[SERVICES_NIS.kind],
        lambda n: n >= services,
        timeout=timeout,
        interval=1.0,
        what=f"the restarted operator's reconciles of {services} services",
    )
    reconciled = time.monotonic()
    settle(requests, quiet_seconds=3, timeout=timeout)
    after = requests.snapshot()
    window = Window(
        requests={key: after[key] - before[key] for key in after},
        reconciles=requests.reconciles(),
        cpu_s=cpu_seconds(requests.pid),
        wall_s=time.monotonic() - start,
    )
    versions_after = versions(kube)
    return {
        "services": services,
        "up_s": up - start,
        "reconciled_s": reconciled - start,
        "changed_objects": changed_objects(versions_before, versions_after),
        **per_reconcile(window),
    }


def versions(kube: Kube) -> dict[tuple[str, str], str]:
    """resourceVersion of every object the operator makes or reads in the bench namespace."""
    kinds = (SERVICES_NIS, ARTIFACTS, DEPLOYMENTS, CONFIGMAPS, SERVICES, PDBS, JOBS)
    return {
        (kind.kind, obj["metadata"]["name"]): obj["metadata"]["resourceVersion"]
        for kind in kinds
        for obj in kube.list(kind, NAMESPACE)
    }


def changed_objects(before: dict[tuple[str, str], str], after: dict[tuple[str, str], str]) -> list[str]:
    """``kind/name`` of each object whose resourceVersion differs between two :func:`versions` (or that came or
    went)."""
    return sorted(
        f"{kind}/{name}"
        for kind, name in before.keys() | after.keys()
        if before.get((kind, name)) != after.get((kind, name))
    )


def idle(
    operator: OperatorProcess, requests: Requests, kube: Kube, services: int, seconds: float, resync_seconds: float
) -> Obj:
    """Writes while nothing changes (right after a full resync, so before the next), then the next resync alone."""
    # A pass over a thousand services takes most of a minute on 2 busy cores.
    timeout = 2 * resync_seconds + 240
    before = operator.resyncs()
    # Every 2 s, not 0.5: each scrape costs the operator a little CPU, which the windows measure.
    done = wait_for(
        lambda: resyncs(operator), lambda r: r.passes > before, timeout=timeout, interval=2, what="a full resync"
    )
    with requests.counting() as quiet:
        time.sleep(seconds)  # the measurement window itself
    if operator.resyncs() != done.passes:
        raise RuntimeError(f"a resync fell inside the {seconds:g} s idle window: use --idle-seconds < --resync-seconds")
    versions_before = versions(kube)
    with requests.counting() as resync:
        finished = wait_for(
            lambda: resyncs(operator), lambda r: r.passes > done.passes, timeout=timeout, interval=2, what="the next"
        )
    changed = changed_objects(versions_before, versions(kube))
    return {
        "services": services,
        "idle_seconds": seconds,
        "idle_writes": per_reconcile(quiet)["writes"],
        "idle_requests": per_reconcile(quiet)["requests"],
        "resync": {
            "objects": int(finished.objects - done.objects),
            "took_s": finished.seconds - done.seconds,
            "objects_checked": len(versions_before),
            "changed_objects": changed,
            **per_reconcile(resync),
        },
    }


# The table


def seconds(value: float) -> str:
    """A duration for the table."""
    return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"


def table(results: Obj) -> list[tuple[str, str, str, str]]:
    """The rows: what, median (or the figure), p99 (or a detail), ratio to the baseline (or a note)."""
    ready, rows = results["apply_to_ready"], []
    base = ready["plain"]["median_s"]
    for key, label in (
        ("plain", "apply -> Available, plain YAML (baseline)"),
        ("fresh", "apply -> Ready, new artifact (compile 0 s)"),
        ("compiled", "apply -> Ready, artifact already compiled"),
    ):
        figure = ready[key]
        ratio = f"{figure['median_s'] / base:.2f}x"
        rows.append((label, seconds(figure["median_s"]), seconds(figure["p99_s"]), ratio))
    latency = results["reconcile_latency"]
    rows.append(
        (
            "reconcile latency, spec -> observedGeneration",
            seconds(latency["median_s"]),
            seconds(latency["p99_s"]),
            f"n={latency['n']}",
        )
    )
    for figure in results["probes"]:
        size = figure["services"]
        rows.append(
            (
                f"reconcile latency at {size} services, spec -> observedGeneration",
                f"{1000 * figure['median_s']:.0f} ms",
                f"{1000 * figure['p99_s']:.0f} ms",
                f"n={figure['n']}",
            )
        )
        counted = figure["requests"]
        rows.append(
            (
                f"  service reconcile in the operator at {size} services (histogram bound)",
                f"<= {1000 * counted['service_reconcile_p50_s']:.0f} ms",
                f"<= {1000 * counted['service_reconcile_p99_s']:.0f} ms",
                "",
            )
        )
        rows.append(
            (
                f"  API requests/reconcile at {size} services (those changes and rollouts; resyncs' left out)",
                f"{counted['requests_per_event_reconcile']:.1f}",
                f"{counted['writes_per_event_reconcile']:.1f} writes",
                f"{counted['service_reconciles'] + counted['artifact_reconciles'] - counted['resync_reconciles']} "
                f"reconciles (+{counted['resync_reconciles']} in resyncs), "
                f"{counted['operator_cpu_ms_per_reconcile']:.0f} ms CPU each; "
                f"RSS {figure['memory']['rss_mib']:.0f} MiB",
            )
        )
        own = figure["own_requests"]
        top = ", ".join(f"{key} {n:g}" for key, n in list(own["by_request"].items())[:4])
        rows.append(
            (
                f"  API requests of a change's own reconcile at {size} services",
                f"{own['median']:g}",
                f"max {own['max']:g}",
                top,
            )
        )
        rows.append(wait_row(f"  spec change's wait for a worker at {size} services", figure["spec_change_waits"]))
    rows += steady_rows(results["steady"])
    restarted = results["restart"]
    rows.append(
        (
            f"operator restart at {restarted['services']} services: start -> every service reconciled",
            seconds(restarted["reconciled_s"]),
            f"{restarted['requests'] - restarted['watches']} requests, {restarted['writes']} writes",
            f"up in {seconds(restarted['up_s'])}; {len(restarted['changed_objects'])} objects changed (must be 0)",
        )
    )
    fleet_size, idle_size = results["fleet"]["services"], results["idle"]["services"]
    requests = results["requests"]
    for key, label in (
        ("creating", "API requests/reconcile, apply -> Ready"),
        ("changing", "API requests/reconcile, spec changes"),
        ("fleet", f"API requests/reconcile, growing to {fleet_size} services"),
        ("resync", f"API requests/reconcile, full resync at {idle_size} services"),
    ):
        figure = requests[key]
        reconciles = figure["service_reconciles"] + figure["artifact_reconciles"]
        note = f"{reconciles} reconciles, {figure['operator_cpu_ms_per_reconcile']:.0f} ms CPU each"
        # Outside the resync row, a resync that fell inside the window would flatter the ratio: leave it out.
        per = "reconcile" if key == "resync" else "event_reconcile"
        if key != "resync" and figure["resync_reconciles"]:
            note += f" (+{figure['resync_reconciles']} in resyncs, left out)"
        rows.append((label, f"{figure[f'requests_per_{per}']:.1f}", f"{figure[f'writes_per_{per}']:.1f} writes", note))
    resync = requests["resync"]
    rows.append(
        (
            f"full resync at {idle_size} services: duration",
            seconds(resync["took_s"]),
            f"{resync['objects']} objects",
            "",
        )
    )
    memory = results["memory"]
    settled, grown = memory["settled"], memory["fleet"]
    per_service = 1024 * (grown["rss_mib"] - settled["rss_mib"]) / (grown["services"] - settled["services"])
    for key, figure in memory.items():
        rows.append(
            (
                f"operator RSS, {key} ({figure['services']} services)",
                f"{figure['rss_mib']:.0f} MiB",
                f"peak {figure['peak_mib']:.0f} MiB",
                f"+{per_service:.0f} KiB/service" if key == "fleet" else "",
            )
        )
    quiet = results["idle"]
    rows.append(
        (
            f"idle writes at {idle_size} services over {quiet['idle_seconds']:g} s (must be 0)",
            str(quiet["idle_writes"]),
            "",
            "",
        )
    )
    rows.append(
        (
            "objects the full resync changed (must be 0)",
            str(len(resync["changed_objects"])),
            f"of {resync['objects_checked']}",
            "",
        )
    )
    return rows


def wait_row(label: str, waits: Obj) -> tuple[str, str, str, str]:
    """A row of the spec changes' waits for a worker: the share within the goal, the p99's histogram bound."""
    if not waits["n"]:
        return (label, "-", "-", "n=0")
    return (
        label,
        f"{100 * waits['within_goal']:.1f}% <= {1000 * WAIT_GOAL_S:.0f} ms",
        f"p99 <= {1000 * waits['p99_at_most_s']:g} ms",
        f"n={waits['n']}",
    )


def steady_rows(steady: list[Obj]) -> list[tuple[str, str, str, str]]:
    """The steady streams' rows: latency to observedGeneration and to Ready, requests per change."""
    rows = []
    for figure in steady:
        size, observed_, ready = figure["services"], figure["observed"], figure["ready"]
        stream = f"{figure['changes']} changes at {figure['rate']:g}/s over {size} serving services"
        rows.append(
            (
                f"{stream}: spec -> observedGeneration",
                f"{1000 * observed_['median_s']:.0f} ms",
                f"{1000 * observed_['p99_s']:.0f} ms",
                f"max {1000 * observed_['max_s']:.0f} ms",
            )
        )
        kinds = ", ".join(f"{kind} {seconds(k['median_s'])}" for kind, k in figure["by_kind"].items())
        rows.append((f"  spec -> Ready at {size} services", seconds(ready["median_s"]), seconds(ready["p99_s"]), kinds))
        rows.append(
            (
                f"  API requests per spec change at {size} services (its rollout's included)",
                f"{figure['requests_per_change']:.1f}",
                f"{figure['writes_per_change']:.1f} writes",
                f"{figure['reads_per_change']:.1f} reads",
            )
        )
        rows.append(
            (
                f"  operator CPU per spec change at {size} services (its rollout's included)",
                f"{figure['operator_cpu_ms_per_change']:.0f} ms",
                "",
                f"full resyncs' {figure['resync_cpu_s']:.1f} CPU-s apart ({figure['resyncs']:.0f} objects)",
            )
        )
        rows.append(wait_row(f"  spec change's wait for a worker at {size} services", figure["spec_change_waits"]))
    return rows


def main() -> None:
    """Run every phase on one local control plane; print the table and write it as JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=20, help="services timed apply -> Ready (of each kind)")
    parser.add_argument("--rounds", type=int, default=1, help="spec changes per service, for reconcile latency")
    parser.add_argument("--fleet", type=int, default=1000, help="services in the namespace for memory and idleness")
    parser.add_argument("--fleet-identities", type=int, default=30, help="compile identities the fleet shares")
    parser.add_argument("--midpoint", type=int, default=100, help="services in the namespace at the middle probe")
    parser.add_argument("--probe-changes", type=int, default=20, help="spec changes of the probe service per probe")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="idle window that must see no writes")
    parser.add_argument("--resync-seconds", type=float, default=40.0, help="the operator's --resync-seconds")
    parser.add_argument(
        "--compiling-fleet",
        action="store_true",
        help="the fleet's compiles never finish, so it owns no Deployment, pod, Service or PDB, and no steady "
        "stream runs (a quicker run); by default every service serves",
    )
    parser.add_argument("--steady-changes", type=int, default=200, help="changes of the steady stream, per size")
    parser.add_argument("--steady-rate", type=float, default=10.0, help="changes per second of the steady stream")
    parser.add_argument(
        "--idle-at-fleet",
        action="store_true",
        help="check idleness and time a full resync with the whole fleet, not before it (a pass over 1,000 "
        "services takes about a minute on 2 cores, and waiting for passes some more)",
    )
    args = parser.parse_args()
    if args.idle_seconds >= args.resync_seconds:
        parser.error("--idle-seconds must be shorter than --resync-seconds (the window falls between two resyncs)")
    if not 2 * args.services + 1 < args.midpoint < args.fleet:
        parser.error("--midpoint must lie between twice --services (plus the probe) and --fleet")

    serving = not args.compiling_fleet
    began = time.monotonic()
    reap_orphans()
    pools = nodes(args.fleet + 2 * args.services + 1) if serving else NODES
    cluster = LocalCluster.start(f"bench-operator-{os.getpid()}", fleet=pools, owner_pid=os.getpid())
    operator: OperatorProcess | None = None
    client = cluster.api_client()
    try:
        kube = Kube(client)
        work = cluster.state.workdir / "bench"
        work.mkdir()
        kubeconfig, schemas = install(cluster, kube, work)
        services = EventLog(cluster, SERVICES_NIS.path(NAMESPACE))
        deployments = EventLog(cluster, DEPLOYMENTS.path(NAMESPACE))
        operator = OperatorProcess(kubeconfig, [NAMESPACE], work, resync_seconds=args.resync_seconds)
        operator.start(wait_for)
        assert operator.process is not None
        pid = operator.process.pid
        requests = Requests(cluster, operator, schemas)
        memories = {"started": memory(pid, 0)}
        progress(began, "cluster and operator up")

        mark = services.mark()
        create_service(kube, PROBE, service_spec("probe", "0s"))
        services.first(PROBE, ready_at(1), mark, 60, "Ready")
        probes = [{**probe(kube, services, requests, 1, args.probe_changes), "memory": memory(pid, 1)}]
        progress(began, f"probe at 1 service: {args.probe_changes} spec changes")
        steady = []
        if serving:
            steady.append(steady_changes(kube, services, requests, [PROBE], args.steady_changes, args.steady_rate))
            progress(began, f"{args.steady_changes} changes at {args.steady_rate:g}/s at 1 service")

        with requests.counting() as creating:
            ready = apply_to_ready(kube, services, deployments, args.services)
        progress(began, f"apply -> Ready x {3 * args.services}")
        names = [f"{kind}-{i}" for i in range(args.services) for kind in ("fresh", "compiled")]
        with requests.counting() as changing:
            latencies = spec_changes(kube, services, names, args.rounds)
        settle(requests, quiet_seconds=3, timeout=60)
        present = len(names) + 1  # and the probe
        memories["settled"] = memory(pid, present)
        progress(began, f"{len(latencies)} spec changes")
        if not args.idle_at_fleet:
            quiet = idle(operator, requests, kube, present, args.idle_seconds, args.resync_seconds)
            progress(began, f"idle window and a full resync at {present} services")
        for size in (args.midpoint, args.fleet):
            grown = fleet(kube, services, requests, present, size, args.fleet_identities, 1800, serving=serving)
            fleet_names = [f"fleet-{i}" for i in range(len(names) + 1, size)]
            present = size
            # The probe measures a settled fleet, not the growth's last writes (compile Jobs, their pods).
            settle(requests, quiet_seconds=3, timeout=300)
            progress(began, f"{size} services {'Ready' if serving else 'Compiling'}")
            probes.append({**probe(kube, services, requests, size, args.probe_changes), "memory": memory(pid, size)})
            progress(began, f"probe at {size} services: {args.probe_changes} spec changes")
            if serving:
                every = [PROBE, *names, *fleet_names]
                steady.append(steady_changes(kube, services, requests, every, args.steady_changes, args.steady_rate))
                progress(began, f"{args.steady_changes} changes at {args.steady_rate:g}/s at {size} services")
        memories["fleet"] = memory(pid, args.fleet)
        if args.idle_at_fleet:
            quiet = idle(operator, requests, kube, args.fleet, args.idle_seconds, args.resync_seconds)
            memories["fleet, after a full resync"] = memory(pid, args.fleet)
            progress(began, f"idle window and a full resync at {args.fleet} services")
        refused = [line for line in operator.tail(1_000_000).splitlines() if "Forbidden" in line]
        cpu = {record.name: cpu_seconds(record.pid) for record in cluster.state.processes}
        cpu["operator"] = cpu_seconds(pid)
        # 80 s at 1,000 services on 2 cores; at 5,000, 511 services in 600 s (a run at 4fcd12a).
        restarted = restart(operator, requests, kube, args.fleet, timeout=max(600, 0.6 * args.fleet))
        # A new process holds what the fleet's lists brought, without the growth's backlog behind it.
        memories["fleet, restarted"] = memory(requests.pid, args.fleet)
        progress(began, f"operator restarted at {args.fleet} services")
        refused += [line for line in operator.tail(1_000_000).splitlines() if "Forbidden" in line]
        cpu["operator, restarted"] = cpu_seconds(requests.pid)
        cpu["bench"] = time.process_time()
    except BaseException:
        if operator is not None:
            print(f"--- operator log ---\n{operator.tail(60)}", file=sys.stderr)
        raise
    finally:
        if operator is not None:
            operator.stop()
        client.close()
        cluster.stop()

    results: Obj = {
        "commit": commit(),
        "args": vars(args),
        "wall_s": time.monotonic() - began,
        "apply_to_ready": {key: summary(values) for key, values in ready.items()},
        "reconcile_latency": summary(latencies),
        "probes": probes,
        "requests": {
            "creating": per_reconcile(creating),
            "changing": per_reconcile(changing),
            "fleet": grown,
            "resync": quiet.pop("resync"),
        },
        "fleet": grown,
        "steady": steady,
        "restart": restarted,
        "memory": memories,
        "idle": quiet,
        "operator_refused": refused,
        # What the run cost the machine: on 2 dedicated cores it needs at least half the total in wall time.
        "cpu_s": cpu,
    }
    report(results)
    problems = []
    if quiet["idle_writes"]:
        problems.append(f"the idle operator made {quiet['idle_writes']} write requests in {args.idle_seconds:g} s")
    if restarted["writes"] or restarted["changed_objects"]:
        problems.append(f"a restart wrote {restarted['writes']} times and changed {restarted['changed_objects']}")
    if results["requests"]["resync"]["changed_objects"]:
        problems.append(f"a full resync changed {', '.join(results['requests']['resync']['changed_objects'])}")
    if refused:
        problems.append(f"the operator was refused: {refused[0]}")
    if problems:
        sys.exit("FAIL: " + "; ".join(problems))


def progress(began: float, what: str) -> None:
    """One line per finished phase, so a slow run shows where it is."""
    print(f"[{time.monotonic() - began:5.0f} s] {what}", flush=True)


def report(results: Obj) -> None:
    """Print the table and write the results as JSON."""
    args, rows = results["args"], table(results)
    print_table(
        f"neuronfleet operator on a local control plane (KWOK nodes): {args['services']} of each kind applied one "
        f"at a time, {args['rounds']} spec change(s) each, {args['fleet']} services over {args['fleet_identities']} "
        f"compile identities, resync every {args['resync_seconds']:g} s; took {seconds(results['wall_s'])}; "
        f"commit {results['commit']}",
        ["measure", "median", "p99", "vs baseline / note"],
        rows,
    )
    cpu = results["cpu_s"]
    parts = ", ".join(f"{name} {value:.0f}" for name, value in sorted(cpu.items(), key=lambda kv: -kv[1]))
    print(f"CPU seconds: {sum(cpu.values()):.0f} in all ({parts})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
