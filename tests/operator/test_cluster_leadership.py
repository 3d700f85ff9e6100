"""Two operators on a real control plane, elected on a Lease: one reconciles, the other stands by and takes
over when the leader stops, or when it can no longer renew (the API server's audit log shows who wrote what).
A crash (SIGKILL, the Lease left to expire) is proven on the real node, under load
(tests/realnode/test_promises_under_load.py)."""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.services import Services

from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.status import observed, phase_of
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator.cluster.leadership import EXIT_LOST_LEASE, Election

# The operator's fixtures (`api`, `services`), for the modules that run it themselves.
pytest_plugins = ["harness.operator_fixtures"]

SPEC: dict[str, Any] = {
    "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
    "engine": {"max_num_seqs": 8, "num_seqs_buckets": [1, 8], "tensor_parallel_size": 4},
    "replicas": 1,
    "compile": {"artifactStore": "s3://neuronfleet-test/neff"},
}


def reconciles(operator: OperatorProcess) -> float:
    """Reconciles this operator ran, of any kind and outcome."""
    return sum(v for (name, _), v in operator.metrics().items() if name == "neuronfleet_operator_reconciles_total")


def test_one_of_two_operators_reconciles_and_a_stopped_leader_hands_over_at_once(
    cluster: LocalCluster, namespace: str, crds: Path, services: Services, wait_for: WaitFor, tmp_path: Path
) -> None:
    first, second = (
        OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / name, leader_election=namespace)
        for name in ("first", "second")
    )
    for operator in (first, second):
        operator.log_dir.mkdir()
    try:
        first.start(wait_for)
        wait_for(first.leading, timeout=30, interval=0.2, what="the first operator leads")
        second.start(wait_for)  # alive to its probe while it stands by
        services.create("before", SPEC)
        services.wait_phase("before", "Compiling")
        assert not second.leading()
        assert reconciles(first) > 0
        assert reconciles(second) == 0, second.tail()
        # SIGTERM, as an upgrade or a drain sends: the leader releases the Lease on its way out, so the standby
        # takes it at its next try instead of a lease duration after the last renewal.
        stopped_at = time.monotonic()
        first.stop()
        wait_for(second.leading, timeout=30, interval=0.1, what="the second operator leads")
        handover = time.monotonic() - stopped_at
        print(f"    handover after SIGTERM: {handover:.2f} s (the Lease: {Election.lease_duration_s} s)")
        assert first.process is not None
        assert first.process.returncode == 0, first.tail()
        assert "released Lease" in first.log.read_text()
        assert handover < Election.lease_duration_s
        # The successor reconciles what arrives after the handover: Compiling, or already Ready where the compile
        # it shares with "before" finished first.
        services.create("after", SPEC)
        services.wait(
            "after", lambda b: observed(b) and phase_of(b) in ("Compiling", "Ready"), "reconciled by the successor"
        )
    finally:
        second.stop()
        first.stop()
        print(f"--- first operator ---\n{first.tail(30)}\n--- second operator ---\n{second.tail(30)}")


#: Short Lease timings (client-go's ratios): the successor takes over 8 s after the leader's last renewal.
LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S = 8, 6, 2
ELECTION = (
    *("--lease-duration-seconds", str(LEASE_DURATION_S), "--renew-deadline-seconds", str(RENEW_DEADLINE_S)),
    *("--retry-period-seconds", str(RETRY_PERIOD_S)),
)


@dataclass(frozen=True)
class Write:
    """One write the API server's audit log recorded."""

    received: datetime.datetime
    user_agent: str
    resource: str
    code: int


def writes(cluster: LocalCluster) -> list[Write]:
    """Every write of the admin identity so far (the audit policy records no other)."""
    events = [json.loads(line) for line in cluster.audit_log.read_text().splitlines()]
    return [
        Write(
            datetime.datetime.fromisoformat(e["requestReceivedTimestamp"]),
            e.get("userAgent", ""),
            e["objectRef"]["resource"],
            int(e.get("responseStatus", {}).get("code", 0)),
        )
        for e in events
        if e["stage"] == "ResponseComplete"
    ]


def lease_holder(cluster: LocalCluster, namespace: str) -> str:
    """Who holds the operators' Lease now ("" for nobody)."""
    got = cluster.kubectl("get", "lease", Election.lease, "-n", namespace, "-o", "jsonpath={.spec.holderIdentity}")
    return got.stdout if got.returncode == 0 else ""


def cut_off(cluster: LocalCluster, namespace: str, holder: str, directory: Path) -> list[str]:
    """A ValidatingAdmissionPolicy refusing every write of the Lease that keeps it with ``holder``: its renewals
    fail, while another candidate may still take it. The objects made, to delete."""
    name = f"cut-off-{namespace}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["coordination.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["leases"],
                    }
                ]
            },
            "validations": [
                {
                    # A released Lease has no holder: the key is absent then.
                    "expression": f"!has(object.spec.holderIdentity) || object.spec.holderIdentity != '{holder}'",
                    "message": "cut off",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    manifest = directory / "cut-off.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [policy, binding]}))
    applied = cluster.kubectl("apply", "-f", str(manifest))
    assert applied.returncode == 0, applied.stderr
    return [f"validatingadmissionpolicybinding/{name}", f"validatingadmissionpolicy/{name}"]


def test_a_leader_that_cannot_renew_stops_writing_before_its_successor_writes_anything(
    cluster: LocalCluster, namespace: str, crds: Path, services: Services, wait_for: WaitFor, tmp_path: Path
) -> None:
    first, second = (
        OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / name, leader_election=namespace, options=ELECTION)
        for name in ("first", "second")
    )
    for operator in (first, second):
        operator.log_dir.mkdir()
    made: list[str] = []
    stop = threading.Event()

    def change_the_spec_until_stopped() -> None:
        # Work for whoever leads, all along: each change is a reconcile that writes the service's status.
        replicas = 1
        while not stop.wait(0.5):
            replicas = 3 - replicas
            services.patch_spec("svc", {"replicas": replicas})

    changes = threading.Thread(target=change_the_spec_until_stopped, daemon=True)
    try:
        first.start(wait_for)
        wait_for(first.leading, timeout=30, interval=0.2, what="the first operator leads")
        second.start(wait_for)
        services.create("svc", SPEC)
        services.wait_phase("svc", "Compiling")
        leader = lease_holder(cluster, namespace)
        changes.start()
        made = cut_off(cluster, namespace, leader, tmp_path)
        # Its watchdog ends it within the renew deadline of its last renewal; the standby takes the Lease once it
        # has gone unrenewed for a lease duration, and reconciles the changes from then on.
        wait_for(lambda: first.process is not None and first.process.poll() is not None, timeout=60,
                 interval=0.2, what="the cut-off leader exits")  # fmt: skip
        wait_for(second.leading, timeout=60, interval=0.2, what="the standby leads")
        successor = lease_holder(cluster, namespace)
        generation = services.get("svc")["metadata"]["generation"]
        services.wait("svc", lambda b: b["status"].get("observedGeneration", 0) >= generation, "seen by the successor")
    finally:
        stop.set()
        if changes.is_alive():
            changes.join(timeout=10)
        for obj in made:
            cluster.kubectl("delete", obj, "--ignore-not-found")
        second.stop()
        first.stop()
        print(f"--- first operator ---\n{first.tail(30)}\n--- second operator ---\n{second.tail(30)}")
    assert first.process is not None
    assert first.process.returncode == EXIT_LOST_LEASE, first.tail()
    assert "lost the Lease" in first.log.read_text()
    assert leader
    assert successor not in ("", leader)
    # The audit log names each operator by its identity: what each wrote, and when.
    recorded = writes(cluster)
    renewals = [w for w in recorded if leader in w.user_agent and w.resource == "leases"]
    refused = [w for w in renewals if w.code >= 400]
    last_renewal = max(w.received for w in renewals if w.code < 400)
    by_first = [w.received for w in recorded if leader in w.user_agent and w.resource != "leases"]
    took_over = min(
        w.received for w in recorded if successor in w.user_agent and w.resource == "leases" and w.code < 400
    )
    by_second = [w.received for w in recorded if successor in w.user_agent and w.resource != "leases"]
    span = f"last renewal {last_renewal.time()}, the successor's Lease {took_over.time()}"
    print(f"    {len(by_first)} writes by the cut-off leader, the last {max(by_first).time()}; {span}; "
          f"{len(by_second)} by the successor, the first {min(by_second).time()}")  # fmt: skip
    assert refused, "no renewal was refused: the leader was never cut off"
    assert by_first, "the first leader wrote nothing"
    assert by_second, "the successor wrote nothing"
    # The leader stopped writing within its renew deadline of its last renewal (its watchdog); the successor
    # wrote nothing before it held the Lease, which is after the leader's last write: never two at once.
    assert max(by_first) <= last_renewal + datetime.timedelta(seconds=RENEW_DEADLINE_S + 1)
    assert min(by_second) >= took_over > max(by_first)
