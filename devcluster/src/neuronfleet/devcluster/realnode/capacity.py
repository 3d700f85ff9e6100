"""Keeps the real node's Neuron capacity advertised, as a device plugin would.

Extended resources are advertised the documented way: patched into the node's status (the kubelet
copies them into allocatable). A kubelet that registers the node again starts without them, so this
process checks every few seconds and patches again when they are missing.

    python -m neuronfleet.devcluster.realnode.capacity WORKDIR NODE INSTANCE_TYPE SERVER
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import httpx

from neuronfleet.contract.hardware import NEURON_CORE_RESOURCE, NEURON_DEVICE_RESOURCE, get_instance_type
from neuronfleet.devcluster.controlplane.api import Api, ApiError

#: Seconds between checks.
INTERVAL = 2.0


def neuron_capacity(instance_type: str) -> dict[str, str]:
    """The extended resources of ``instance_type``'s devices and NeuronCores (hardware catalogue)."""
    instance = get_instance_type(instance_type)
    return {NEURON_DEVICE_RESOURCE: str(instance.devices), NEURON_CORE_RESOURCE: str(instance.cores)}


def needs_patch(node: dict[str, Any], capacity: dict[str, str]) -> bool:
    """Whether the node's status lacks (or differs from) ``capacity``."""
    current = node.get("status", {}).get("capacity", {})
    return any(current.get(resource) != value for resource, value in capacity.items())


def keep_advertised(api: Api, node: str, capacity: dict[str, str], *, interval: float = INTERVAL) -> None:
    """Patch ``capacity`` into the node's status whenever it is missing, until the process is stopped."""
    path = f"/api/v1/nodes/{node}"
    while True:
        try:
            found = api.get(path)
            if found is not None and needs_patch(found, capacity):
                api.request(
                    "PATCH",
                    f"{path}/status",
                    {"status": {"capacity": capacity}},
                    content_type="application/merge-patch+json",
                )
        except (ApiError, httpx.TransportError) as error:
            print(f"node {node}: {error}", flush=True)
        time.sleep(interval)


def main() -> None:
    """Run :func:`keep_advertised` with the cluster's admin identity."""
    workdir, node, instance_type, server = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    pki = workdir / "pki"
    with Api(server, pki / "ca.crt", pki / "admin.crt", pki / "admin.key") as api:
        keep_advertised(api, node, neuron_capacity(instance_type))


if __name__ == "__main__":
    main()
