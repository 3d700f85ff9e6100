"""The control-plane components: their certificates, kubeconfigs and command lines."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import yaml

from neuronfleet.devcluster.controlplane import kwok, pki
from neuronfleet.devcluster.controlplane.fleet import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE
from neuronfleet.devcluster.process.tools import KubeTools

SERVICE_CIDR = "10.96.0.0/16"
#: KWOK's pod addresses; the real node's pods use :data:`REAL_NODE_POD_CIDR`, clear of it.
POD_CIDR = "10.244.0.0/16"
REAL_NODE_POD_CIDR = "10.245.0.0/24"
#: The one node a real kubelet runs (``cluster up --real-node``).
REAL_NODE = "real-0"

#: The common name of the API server's client cert towards extension API servers (the aggregation layer).
FRONT_PROXY_CLIENT = "front-proxy-client"

#: Components in start order; stopped all at once.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def _write_kubeconfig(path: Path, server: str, ca: Path, user: pki.KeyPair) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [
            {"name": "user", "user": {"client-certificate-data": _b64(user.cert), "client-key-data": _b64(user.key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass(frozen=True)
class Layout:
    """The certificates and kubeconfigs in one cluster's working directory."""

    workdir: Path
    ca: Path
    serving: pki.KeyPair
    service_account: pki.KeyPair
    #: The API server's client identity towards kubelets (logs, exec, port-forward).
    kubelet_client: pki.KeyPair
    kubeconfigs: dict[str, Path]
    #: The aggregation layer's CA, whose client (the API server) extension API servers trust to name the user.
    front_proxy_ca: Path
    #: The API server's client identity towards extension API servers (an APIService's backend).
    front_proxy_client: pki.KeyPair

    @property
    def apiserver_socket(self) -> Path:
        """The unix socket the real node's relays reach the API server through."""
        return self.workdir / "apiserver.sock"

    @property
    def egress_socket(self) -> Path:
        """The unix socket of the CONNECT proxy the API server sends node, pod and service traffic to."""
        return self.workdir / "egress.sock"

    @classmethod
    def create(cls, workdir: Path, server: str) -> Layout:
        """Issue the CA, the serving cert, one client identity per component, and their kubeconfigs."""
        pki_dir = workdir / "pki"
        pki_dir.mkdir()
        ca = pki.CertificateAuthority(pki_dir)
        serving = ca.issue(
            "apiserver",
            "kube-apiserver",
            server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            server_ips=("127.0.0.1", "10.96.0.1"),
        )
        # Each component gets the identity its bootstrap RBAC roles expect; KWOK, playing every
        # kubelet at once, fits no node identity and runs as an admin. The real node's identities are
        # issued for every cluster: the CA key lives only in this process, so they cannot be added later.
        identities = {
            "admin": ("neuronfleet-admin", "system:masters"),
            "kube-controller-manager": ("system:kube-controller-manager", None),
            "kube-scheduler": ("system:kube-scheduler", None),
            "kwok": ("kwok-controller", "system:masters"),
            # the Node authorizer and NodeRestriction admit exactly this node's own objects
            REAL_NODE: (f"system:node:{REAL_NODE}", "system:nodes"),
            # bound to system:node-proxier by the bootstrap RBAC policy
            "kube-proxy": ("system:kube-proxy", None),
        }
        kubeconfigs = {
            who: _write_kubeconfig(
                workdir / f"{who}.kubeconfig", server, ca.cert, ca.issue(who, cn, organization=organization)
            )
            for who, (cn, organization) in identities.items()
        }
        # The kubelet authorizes it by webhook against the API server: system:masters may do anything.
        kubelet_client = ca.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organization="system:masters"
        )
        # A CA of its own, as Kubernetes asks: a client cert of the cluster CA must not pass for the front proxy.
        front_proxy_dir = pki_dir / "front-proxy"
        front_proxy_dir.mkdir()
        front_proxy = pki.CertificateAuthority(front_proxy_dir)
        front_proxy_client = front_proxy.issue("client", FRONT_PROXY_CLIENT)
        return cls(
            workdir,
            ca.cert,
            serving,
            pki.service_account_keys(pki_dir),
            kubelet_client,
            kubeconfigs,
            front_proxy.cert,
            front_proxy_client,
        )

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: the admin's writes (``write_audit_policy``), one JSON event a line."""
        return self.workdir / "audit.log"

    def write_audit_policy(self) -> Path:
        """Record every write of the admin identity (the operators tests start, the tests), by whom: a test tells
        from each event's ``userAgent`` which operator process wrote (they name themselves in it)."""
        writes = ["create", "update", "patch", "delete", "deletecollection"]
        rules = [{"level": "Metadata", "users": ["neuronfleet-admin"], "verbs": writes}, {"level": "None"}]
        policy = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"], "rules": rules}
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        return path

    def write_egress_selector(self) -> Path:
        """The API server's egress selector: traffic to nodes, pods and services goes to the egress proxy.

        Without it the API server dials a node's address from the host's network (``kubectl logs`` on a KWOK
        pod would go out of the default route). With no real node nothing listens on the socket, so such
        calls fail at once instead.
        """
        config = {
            "apiVersion": "apiserver.k8s.io/v1beta1",
            "kind": "EgressSelectorConfiguration",
            "egressSelections": [
                {
                    "name": "cluster",
                    "connection": {
                        "proxyProtocol": "HTTPConnect",
                        "transport": {"uds": {"udsName": str(self.egress_socket)}},
                    },
                }
            ],
        }
        path = self.workdir / "egress-selector.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path


def argv(name: str, tools: KubeTools, layout: Layout, ports: dict[str, int]) -> list[str]:
    """The command line of component ``name``: loopback only, files under the layout's directory."""
    binary = str(tools.path(name))
    if name == "etcd":
        return [binary, *_etcd_flags(layout, ports)]
    if name == "kube-apiserver":
        return [binary, *_apiserver_flags(layout, ports)]
    if name in ("kube-controller-manager", "kube-scheduler"):
        return [binary, *_controller_flags(name, layout, ports)]
    if name == "kwok":
        return [
            binary,
            f"--kubeconfig={layout.kubeconfigs['kwok']}",
            f"--config={kwok.write_config(layout.workdir / 'kwok-stages.yaml')}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
            f"--cidr={POD_CIDR}",
            # KWOK renews each node's Lease, so the node lifecycle controller keeps them Ready.
            "--node-lease-duration-seconds=40",
        ]
    raise ValueError(f"unknown component {name!r}")


def _etcd_url(ports: dict[str, int]) -> str:
    return f"http://127.0.0.1:{ports['etcd']}"


def _etcd_flags(layout: Layout, ports: dict[str, int]) -> list[str]:
    etcd, peer = _etcd_url(ports), f"http://127.0.0.1:{ports['etcd-peer']}"
    return [
        "--name=local",
        f"--data-dir={layout.workdir / 'etcd'}",
        f"--listen-client-urls={etcd}",
        f"--advertise-client-urls={etcd}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=local={peer}",
        "--unsafe-no-fsync",  # throwaway data: durability only costs time
        "--log-level=warn",
    ]


def _apiserver_flags(layout: Layout, ports: dict[str, int]) -> list[str]:
    return [
        f"--etcd-servers={_etcd_url(ports)}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['kube-apiserver']}",
        f"--cert-dir={layout.workdir / 'kube-apiserver'}",
        f"--tls-cert-file={layout.serving.cert}",
        f"--tls-private-key-file={layout.serving.key}",
        f"--client-ca-file={layout.ca}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        f"--service-account-issuer=https://127.0.0.1:{ports['kube-apiserver']}",
        f"--service-account-key-file={layout.service_account.cert}",
        f"--service-account-signing-key-file={layout.service_account.key}",
        # Endpoints may not point at loopback; the real node points Service kubernetes at its relay.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        f"--kubelet-client-certificate={layout.kubelet_client.cert}",
        f"--kubelet-client-key={layout.kubelet_client.key}",
        # A node's Hostname would be looked up through the host's resolver.
        "--kubelet-preferred-address-types=InternalIP",
        f"--egress-selector-config-file={layout.write_egress_selector()}",
        # The aggregation layer, for APIServices such as KEDA's external.metrics.k8s.io adapter.
        f"--requestheader-client-ca-file={layout.front_proxy_ca}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={layout.front_proxy_client.cert}",
        f"--proxy-client-key-file={layout.front_proxy_client.key}",
        f"--audit-policy-file={layout.write_audit_policy()}",
        f"--audit-log-path={layout.audit_log}",
    ]


def _controller_flags(name: str, layout: Layout, ports: dict[str, int]) -> list[str]:
    kubeconfig = layout.kubeconfigs[name]
    flags = [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports[name]}",  # serves /healthz, which says when it is up
        f"--cert-dir={layout.workdir / name}",
        "--profiling=false",
    ]
    if name == "kube-controller-manager":
        flags += [
            f"--root-ca-file={layout.ca}",
            f"--service-account-private-key-file={layout.service_account.key}",
            "--use-service-account-credentials=true",
            # The autoscaling tests wait on the HPA controller: its default 15 s would be most of their time.
            "--horizontal-pod-autoscaler-sync-period=5s",
        ]
    return flags
