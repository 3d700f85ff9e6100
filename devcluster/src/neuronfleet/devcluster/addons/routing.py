"""The Gateway API Inference Extension's CRDs in a rig cluster: the InferencePool, and the objectives and
rewrites the Endpoint Picker also watches (from the pinned release ``tools/gie/build.sh`` builds)."""

from __future__ import annotations

from pathlib import Path

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.process.tools import ToolsMissingError, bin_dir

#: The CRD every service's InferencePool needs.
POOL_CRD = "inference.networking.k8s.io_inferencepools.yaml"


def gie_crds() -> Path:
    """The pinned GIE release's CRDs, which ``tools/gie/build.sh`` copies beside its bin dir."""
    directory = bin_dir("gie").parent / "crds"
    if not (directory / POOL_CRD).is_file():
        raise ToolsMissingError(f"GIE's CRDs are not in {directory}: run `make tools`")
    return directory


def install_gie_crds(cluster: LocalCluster) -> Path:
    """Apply GIE's CRDs and wait until the API server serves them; their directory."""
    directory = gie_crds()
    cluster.install_crds(directory, "GIE's CRDs")
    return directory


def remove_gie_crds(cluster: LocalCluster) -> None:
    """Delete GIE's CRDs (and with them every InferencePool), and wait until they are gone: an install right
    after must not find them still terminating (its apply changes nothing, then they go)."""
    cluster.kubectl("delete", "-f", str(gie_crds()), "--ignore-not-found", "--wait=true", "--timeout=50s")
