"""The operator installed as users install it: the Helm chart, with the image built here, in a pod on the real node.

No registry is reachable, so the image is imported into the real node's containerd beforehand and
the chart is told never to pull it. The real node stands for a trn2 node, Neuron taint included, so
the operator's pod is pinned to it and tolerates the taint.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from neuronfleet.contract.hardware import NEURON_TAINT_KEY
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE

#: The Helm release name; the chart names its ServiceAccount and Deployment after it.
RELEASE = "neuronfleet"


def real_node_values(image: str) -> list[str]:
    """``helm --set`` arguments that run the chart's operator from ``image`` (``repo:tag``) on the real node."""
    repository, tag = image.rsplit(":", 1)
    return [
        "--set",
        f"image.repository={repository}",
        "--set",
        f"image.tag={tag}",
        # Imported into the node's containerd: there is no registry to pull from.
        "--set",
        "image.pullPolicy=Never",
        "--set-string",
        f"nodeSelector.kubernetes\\.io/hostname={REAL_NODE}",
        "--set",
        f"tolerations[0].key={NEURON_TAINT_KEY}",
        "--set",
        "tolerations[0].operator=Exists",
        "--set",
        "tolerations[0].effect=NoSchedule",
    ]


def install(
    cluster: LocalCluster,
    chart: Path,
    namespace: str,
    image: str,
    *,
    watch_namespaces: Sequence[str] = (),
    resync_seconds: int | None = None,
    prometheus: str | None = None,
    values: Sequence[str] = (),
    timeout_s: int = 300,
) -> subprocess.CompletedProcess[str]:
    """``helm install --wait`` of the chart into ``namespace`` (which must exist), its pod on the real node.

    ``watch_namespaces`` empty watches every namespace (the chart's default, a ClusterRole). A
    ``prometheus`` URL turns on the chart's autoscaling (KEDA ScaledObjects querying it).
    """
    settings: list[str] = []
    if watch_namespaces:
        settings += ["--set", f"watchNamespaces={{{','.join(watch_namespaces)}}}"]
    if resync_seconds is not None:
        settings += ["--set", f"resyncSeconds={resync_seconds}"]
    if prometheus is not None:
        settings += ["--set", "autoscaling.enabled=true", "--set", f"autoscaling.prometheus.address={prometheus}"]
    return cluster.helm(
        "install",
        RELEASE,
        str(chart),
        "--namespace",
        namespace,
        *settings,
        *values,
        *real_node_values(image),
        "--wait",
        f"--timeout={timeout_s}s",
        timeout=timeout_s + 30,
    )


def leader(cluster: LocalCluster, namespace: str) -> str:
    """The pod whose operator holds the release's Lease, the one that reconciles; ``""`` before any does."""
    holder = cluster.kubectl("get", "lease", RELEASE, "--namespace", namespace, "-o", "jsonpath={.spec.holderIdentity}")
    # The operator names itself <pod>_<random> (neuronfleet.operator.cluster.leadership.candidate_identity).
    return holder.stdout.rsplit("_", 1)[0] if holder.returncode == 0 and holder.stdout else ""


def leader_log(cluster: LocalCluster, namespace: str, tail: int = -1) -> subprocess.CompletedProcess[str]:
    """The log of the operator that reconciles (of the Deployment's first pod while none leads)."""
    source = f"pod/{pod}" if (pod := leader(cluster, namespace)) else f"deployment/{RELEASE}"
    return cluster.kubectl("logs", source, "--namespace", namespace, f"--tail={tail}")
