"""Two operators on a real control plane, elected on a Lease: one reconciles, the other stands by and takes
over when the leader stops. A crash (SIGKILL, the Lease left to expire) is proven on the real node, under
load (tests/realnode/test_promises_under_load.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harness.services import Services

from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.status import observed, phase_of
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator.cluster.leadership import Election

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
