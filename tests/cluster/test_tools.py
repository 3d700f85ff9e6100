"""The built binaries are the pinned versions, and report them (version ldflags set)."""

from __future__ import annotations

import json
import subprocess

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.process.tools import KubeTools, pinned_version


def run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout


def test_kubectl_and_server_report_the_pinned_kubernetes_version(cluster: LocalCluster) -> None:
    result = cluster.kubectl("version", "--output=json")
    assert result.returncode == 0, result.stderr

    versions = json.loads(result.stdout)
    pinned = pinned_version("k8s.io/kubernetes")
    assert versions["serverVersion"]["gitVersion"] == pinned
    assert versions["clientVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["minor"] == pinned.split(".")[1]


def test_etcd_kwok_and_helm_report_their_pinned_versions() -> None:
    tools = KubeTools.locate()

    assert f"etcd Version: {pinned_version('go.etcd.io/etcd/server/v3').removeprefix('v')}" in run(
        str(tools.path("etcd")), "--version"
    )
    assert pinned_version("sigs.k8s.io/kwok") in run(str(tools.path("kwok")), "--version")
    helm = run(str(tools.path("helm")), "version", "--template={{.Version}}")
    assert helm == pinned_version("helm.sh/helm/v3")
