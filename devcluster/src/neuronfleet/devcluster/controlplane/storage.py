"""The ReadWriteMany claim a namespace's ``pvc://`` artifact store needs, on the local control plane.

On EKS an admin provisions it (EFS or FSx for Lustre). The local control plane has no storage
provisioner, so the claim is bound to a hostPath PersistentVolume made for it; KWOK's pods never
mount it, but the scheduler places a pod only once its claims are bound, as on a real cluster.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

#: The class both sides name, so a default StorageClass never provisions the claim elsewhere.
STORAGE_CLASS = "neuronfleet-local"


def artifact_volume(namespace: str, claim: str, host_path: str, size: str = "10Gi") -> list[Obj]:
    """A PersistentVolume and the claim ``claim`` in ``namespace`` bound to it."""
    volume = f"{claim}-{namespace}"
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": STORAGE_CLASS,
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": namespace, "name": claim},
                "hostPath": {"path": host_path, "type": "DirectoryOrCreate"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": STORAGE_CLASS,
                "volumeName": volume,
                "resources": {"requests": {"storage": size}},
            },
        },
    ]
