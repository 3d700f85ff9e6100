"""pytest fixtures for running the operator against the local control plane.

Enable with ``pytest_plugins = ["neuronfleet.operator.pytest_plugin"]`` (after the devcluster
plugin, whose ``cluster``, ``kube``, ``namespace`` and ``wait_for`` these build on).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml

from neuronfleet.operator.kube import Kube
from neuronfleet.operator.testing import OperatorProcess, Services, WaitFor

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from neuronfleet.devcluster.cluster import LocalCluster

#: Short resyncs: the tests must pass on watch events alone, but a lost event should not hang them.
RESYNC_SECONDS = 5.0


@pytest.fixture(scope="session")
def crds(cluster: LocalCluster, pytestconfig: pytest.Config) -> Path:
    """The checked-in CRDs, applied as users apply them, and Established."""
    directory = pytestconfig.rootpath / "crds"
    applied = cluster.kubectl("apply", "--server-side", "-f", str(directory))
    assert applied.returncode == 0, applied.stderr
    for path in sorted(directory.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]
        waited = cluster.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
        assert waited.returncode == 0, waited.stderr
    return directory


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
