"""The operator with a compile pod the real kubelet cannot start: the reason reaches status, no silent wait.

KWOK starts every container, so a compile pod that names a missing credentials Secret only shows what
users see on a real kubelet: ``CreateContainerConfigError``. The compile Job would otherwise wait for its
deadline (two hours by default) with nothing in status but "attempt 1 of 3".
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.controlplane.status import condition
from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode.node import pinned_here
from neuronfleet.operator.api import API_VERSION, SERVICE_KIND

Obj = dict[str, Any]
CRDS = Path(__file__).resolve().parents[2] / "crds"
SECRET = "absent-neff-keys"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}: {result.stderr}"
    return result.stdout


@pytest.fixture
def operator_namespace(real_cluster: LocalCluster, tmp_path: Path) -> Iterator[str]:
    """A namespace with the CRDs applied and the operator (a local process) watching it."""
    real_cluster.install_crds(CRDS, "the CRDs")
    namespace = f"real-{uuid.uuid4().hex[:8]}"
    ok(real_cluster.kubectl("create", "namespace", namespace))
    # Pods are refused until the controller manager has made the namespace's default ServiceAccount.
    wait_for(
        lambda: real_cluster.kubectl("get", "serviceaccount", "default", "--namespace", namespace).returncode,
        lambda code: code == 0,
        timeout=30,
        what=f"ServiceAccount default in {namespace}",
    )
    operator = OperatorProcess(real_cluster.kubeconfig, [namespace], tmp_path, resync_seconds=5)
    operator.start(wait_for)
    try:
        yield namespace
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(40)}")
        real_cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def service(name: str) -> Obj:
    """A service whose compile pod runs on the real node and reads its S3 keys from a Secret that is not there."""
    return {
        "apiVersion": API_VERSION,
        "kind": SERVICE_KIND.kind,
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "hf://neuronfleet/tiny", "revision": "main"},
            "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 256, "max_model_len": 256},
            # Present on the node: the kubelet gets as far as the container's environment.
            "image": node_images.BASE_IMAGE,
            "compile": {
                "artifactStore": "s3://neff-store/team",
                "s3": {"credentialsSecret": SECRET},
                **pinned_here(),
                "resources": {"cpu": "100m", "memory": "128Mi"},
            },
        },
    }


def get(cluster: LocalCluster, namespace: str, kind: str, name: str) -> Obj:
    """An object as kubectl shows it (empty when it does not exist yet)."""
    found = cluster.kubectl("get", kind, name, "--namespace", namespace, "-o", "yaml")
    return yaml.safe_load(found.stdout) or {} if found.returncode == 0 else {}


def test_a_compile_pod_the_kubelet_cannot_start_shows_why_in_status(
    real_cluster: LocalCluster, operator_namespace: str, tmp_path: Path
) -> None:
    name = f"stuck-{uuid.uuid4().hex[:6]}"
    manifest = tmp_path / "service.yaml"
    manifest.write_text(yaml.safe_dump(service(name)))
    ok(real_cluster.kubectl("apply", "--namespace", operator_namespace, "-f", str(manifest)))
    started = time.monotonic()
    nis = wait_for(
        lambda: get(real_cluster, operator_namespace, "nis", name),
        lambda body: (
            body.get("status", {}).get("artifact", {}).get("name") is not None
            and "cannot start" in (condition(body, "ArtifactReady").get("message") or "")
        ),
        timeout=180,
        what=f"{name}: the compile pod's trouble in the ArtifactReady condition",
        show=lambda body: body.get("status"),
    )
    artifact = get(real_cluster, operator_namespace, "nca", nis["status"]["artifact"]["name"])
    status = artifact["status"]
    assert (status["phase"], status["reason"]) == ("Compiling", "CreateContainerConfigError")
    assert f'secret "{SECRET}" not found' in status["message"]
    # Told within a resync or two of the kubelet's refusal, not at the Job's two-hour deadline.
    assert time.monotonic() - started < 180
    described = ok(real_cluster.kubectl("describe", "nis", name, "--namespace", operator_namespace))
    print(described)
    assert f'secret "{SECRET}" not found' in described
    # The pod really ran into the kubelet on the real node.
    (pod,) = yaml.safe_load(ok(real_cluster.kubectl("get", "pods", "--namespace", operator_namespace, "-o", "yaml")))[
        "items"
    ]
    assert pod["spec"]["nodeName"] == REAL_NODE
