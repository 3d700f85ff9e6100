"""Credentials for a ServiceAccount: a kubeconfig that authenticates with its token, not as admin.

The operator runs outside the cluster (no image runs on KWOK's fake nodes), so this is how it gets
exactly the rights a chart grants its ServiceAccount in a real cluster.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from neuronfleet.devcluster.errors import RigError

if TYPE_CHECKING:
    from neuronfleet.devcluster.cluster.local import LocalCluster

#: Tokens outlive any test run or demo, and expire soon after.
TOKEN_SECONDS = 4 * 3600


class CredentialsError(RigError):
    """The API server would not issue a token."""


def service_account_token(cluster: LocalCluster, namespace: str, name: str, seconds: int = TOKEN_SECONDS) -> str:
    """A bound token for ServiceAccount ``namespace/name`` (the TokenRequest API, via kubectl)."""
    issued = cluster.kubectl("create", "token", name, "--namespace", namespace, f"--duration={seconds}s")
    if issued.returncode != 0:
        raise CredentialsError(f"no token for serviceaccount {namespace}/{name}: {issued.stderr.strip()}")
    return issued.stdout.strip()


def service_account_kubeconfig(
    cluster: LocalCluster, namespace: str, name: str, path: Path, seconds: int = TOKEN_SECONDS
) -> Path:
    """Write a kubeconfig for ServiceAccount ``namespace/name`` to ``path`` (mode 0600) and return it."""
    token = service_account_token(cluster, namespace, name, seconds)
    ca = (cluster.state.workdir / "pki" / "ca.crt").read_bytes()
    user = f"system:serviceaccount:{namespace}:{name}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster.name,
                "cluster": {"server": cluster.server, "certificate-authority-data": base64.b64encode(ca).decode()},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": cluster.name, "user": user, "namespace": namespace}}],
        "current-context": user,
    }
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
