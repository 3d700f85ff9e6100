"""pytest fixtures for running the operator against the local control plane.

Only the operator's cluster tests load these (``pytest_plugins = ["harness.operator_fixtures"]`` in the
module), on top of the ``cluster``, ``crds``, ``kube``, ``namespace`` and ``wait_for`` of
:mod:`harness.cluster_fixtures`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.services import Services
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator.cluster.kube import Kube

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from neuronfleet.devcluster.cluster.local import LocalCluster

#: Short resyncs: the tests must pass on watch events alone, but a lost event should not hang them.
RESYNC_SECONDS = 5.0


@pytest.fixture
def api(kube: ApiClient, crds: Path) -> Kube:
    """Plain-dict requests as the cluster admin."""
    return Kube(kube)


@pytest.fixture
def operator(
    cluster: LocalCluster, namespace: str, crds: Path, wait_for: WaitFor, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """``neuronfleet-operator run`` for this test's namespace; its log is printed after the test."""
    running = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path, resync_seconds=RESYNC_SECONDS)
    running.start(wait_for)
    try:
        yield running
    finally:
        running.stop()
        print(f"--- operator log (last run) ---\n{running.tail(60)}")


@pytest.fixture
def services(api: Kube, namespace: str, wait_for: WaitFor) -> Services:
    """The test namespace's NeuronInferenceServices."""
    return Services(api, namespace, wait_for)
