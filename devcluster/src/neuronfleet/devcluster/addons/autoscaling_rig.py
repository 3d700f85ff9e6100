"""Autoscaling's real parts beside a real node: Prometheus scraping the node's pods, and the KEDA operator and
metrics adapter, whose ``external.metrics.k8s.io`` the controller manager's HPA controller reads.

All of it runs inside the real node's network namespace (:mod:`neuronfleet.devcluster.realnode.node`), which is
how each part reaches the others:

- Prometheus listens on the node's address (``NODE_IP:<port>``), where pods, the KEDA operator and
  :meth:`AutoscalingRig.query` reach it. It finds pods through the API server (the namespace's relay on
  ``127.0.0.1:<API server port>``, so the admin kubeconfig works unchanged) and scrapes their port named
  ``http`` on the pod network.
- The KEDA operator serves its gRPC metrics service on ``127.0.0.1`` with mutual TLS (a CA of the rig's
  own); the adapter dials it there and asks it for each metric.
- The adapter serves on ``NODE_IP:<port>``. Service ``keda/keda-metrics-apiserver`` (no selector; its
  EndpointSlice names the node's address) backs APIService ``v1beta1.external.metrics.k8s.io``: the API
  server's aggregator dials the Service's ClusterIP through its egress proxy, in this namespace, where
  kube-proxy sends it on to the adapter. The aggregator authenticates as the front-proxy client
  (:mod:`neuronfleet.devcluster.controlplane.components`), which the adapter trusts through
  ``kube-system/extension-apiserver-authentication``.

Credentials: Prometheus, the operator and the adapter all use the cluster's admin kubeconfig. The cluster is
a throwaway one and these are its own servers; the tests that use them check scaling, not KEDA's RBAC.
Their processes are recorded in the cluster's state, so ``cluster down`` and ``cluster reap`` stop them too.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from neuronfleet.contract.names import HTTP_PORT_NAME, MANAGED_BY_LABEL, OPERATOR_NAME, SERVICE_METRIC_LABEL
from neuronfleet.devcluster.addons.s3_server import answers_in_netns
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane import pki
from neuronfleet.devcluster.controlplane.api import Api
from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.process.managed import ManagedProcess, ProcessNotReadyError, free_ports, stop_all
from neuronfleet.devcluster.process.state import save
from neuronfleet.devcluster.process.tools import ToolsMissingError, bin_dir
from neuronfleet.devcluster.realnode.node import NODE_IP, RealNode

KEDA_NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
EXTERNAL_METRICS = "v1beta1.external.metrics.k8s.io"
#: The operator's serving pods carry this label, and serve their metrics on the port of this name.
SERVING_POD_SELECTOR = f"{MANAGED_BY_LABEL}={OPERATOR_NAME}"
SCRAPED_PORT = HTTP_PORT_NAME
#: Short, so a test sees a changed metric within seconds.
SCRAPE_INTERVAL = "2s"


#: Prints the body of the URL in argv[1]: run inside the node's namespace, where Prometheus listens.
_FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())"


class AutoscalingRigError(RigError):
    """The rig could not be started, or a query failed."""


def _binary(kind: str, name: str) -> Path:
    path = bin_dir(kind) / name
    if not path.is_file():
        raise ToolsMissingError(f"{name} is not built ({path} is missing): run `make tools`")
    return path


def keda_crds() -> Path:
    """The pinned KEDA release's CRDs, which ``tools/keda/build.sh`` copies beside its bin dir."""
    directory = bin_dir("keda").parent / "crds"
    if not (directory / "keda.sh_scaledobjects.yaml").is_file():
        raise ToolsMissingError(f"KEDA's CRDs are not in {directory}: run `make tools`")
    return directory


def prometheus_config(kubeconfig: Path, pod_selector: str, port_name: str, interval: str) -> dict[str, Any]:
    """One scrape job: the running pods matching ``pod_selector``, at their port named ``port_name``."""
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "scrape_configs": [
            {
                "job_name": "pods",
                "kubernetes_sd_configs": [
                    {
                        "role": "pod",
                        "kubeconfig_file": str(kubeconfig),
                        # Filtered by the API server: only these pods are listed and watched.
                        "selectors": [{"role": "pod", "label": pod_selector}],
                    }
                ],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": port_name,
                        "action": "keep",
                    },
                    {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                    # What the operator's ScaledObject queries select on, as the chart's PodMonitor names it.
                    {
                        "source_labels": [f"__meta_kubernetes_pod_label_{SERVICE_METRIC_LABEL}"],
                        "target_label": SERVICE_METRIC_LABEL,
                    },
                ],
            }
        ],
    }


@dataclass(frozen=True)
class KedaCerts:
    """KEDA's gRPC link (each cert dir holds ``ca.crt``, ``tls.crt``, ``tls.key``, as KEDA reads them) and the
    adapter's serving pair, all from one CA of the rig's own."""

    ca: Path
    operator_dir: Path
    adapter_dir: Path
    adapter_serving: pki.KeyPair

    @classmethod
    def issue(cls, directory: Path) -> KedaCerts:
        """A fresh CA and the three leaf certs under ``directory``."""
        pki_dir = directory / "pki"
        pki_dir.mkdir(parents=True)
        ca = pki.CertificateAuthority(pki_dir)
        # The adapter dials the operator at 127.0.0.1; the aggregator names the adapter by its Service.
        operator = ca.issue("operator", "keda-operator", server_ips=("127.0.0.1",))
        adapter_client = ca.issue("adapter-client", ADAPTER_SERVICE)
        serving = ca.issue(
            "adapter-serving",
            ADAPTER_SERVICE,
            server_names=(f"{ADAPTER_SERVICE}.{KEDA_NAMESPACE}.svc",),
            server_ips=(NODE_IP,),
        )
        dirs = []
        for name, pair in (("operator-certs", operator), ("adapter-certs", adapter_client)):
            certs = directory / name
            certs.mkdir()
            shutil.copy(ca.cert, certs / "ca.crt")
            shutil.copy(pair.cert, certs / "tls.crt")
            shutil.copy(pair.key, certs / "tls.key")
            dirs.append(certs)
        return cls(ca.cert, dirs[0], dirs[1], serving)


def adapter_objects(adapter_port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The adapter's Service, its EndpointSlice (the node's address) and the APIService it backs."""
    labels = {"app.kubernetes.io/name": ADAPTER_SERVICE}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE, "labels": labels},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": adapter_port, "protocol": "TCP"}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": ADAPTER_SERVICE,
                "namespace": KEDA_NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": ADAPTER_SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "neuronfleet-autoscaling-rig",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": adapter_port, "protocol": "TCP"}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": EXTERNAL_METRICS, "labels": labels},
            "spec": {
                "service": {"name": ADAPTER_SERVICE, "namespace": KEDA_NAMESPACE, "port": 443},
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "caBundle": base64.b64encode(ca_bundle).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


@dataclass(frozen=True)
class RigPorts:
    """The rig's ports, all inside the node's namespace."""

    prometheus: int
    #: The KEDA operator's gRPC metrics service and its health probes.
    operator_grpc: int
    operator_probes: int
    #: The adapter's external.metrics.k8s.io and its own metrics.
    adapter: int
    adapter_metrics: int

    @classmethod
    def pick(cls) -> RigPorts:
        """Free ports (checked on the host: the namespace's own few are fixed and far from the free range)."""
        return cls(*free_ports(5))


def prometheus_argv(binary: Path, config: Path, directory: Path, port: int) -> list[str]:
    """Prometheus on the node's address, its TSDB in ``directory``."""
    return [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'prometheus-data'}",
        f"--web.listen-address={NODE_IP}:{port}",
        "--log.level=warn",
    ]


def operator_argv(binary: Path, certs: KedaCerts, ports: RigPorts) -> list[str]:
    """The KEDA operator: no leader election, no metrics of its own, the rig's certs (never rotated)."""
    return [
        str(binary),
        "--leader-elect=false",
        "--enable-prometheus-metrics=false",
        f"--health-probe-bind-address=127.0.0.1:{ports.operator_probes}",
        f"--metrics-service-bind-address=127.0.0.1:{ports.operator_grpc}",
        f"--cert-dir={certs.operator_dir}",
        "--enable-cert-rotation=false",
        "--zap-log-level=info",
        "--zap-encoder=console",
    ]


def adapter_argv(binary: Path, certs: KedaCerts, kubeconfig: Path, ports: RigPorts) -> list[str]:
    """KEDA's metrics adapter on the node's address, asking the operator over gRPC for each metric."""
    return [
        str(binary),
        f"--bind-address={NODE_IP}",
        f"--secure-port={ports.adapter}",
        f"--tls-cert-file={certs.adapter_serving.cert}",
        f"--tls-private-key-file={certs.adapter_serving.key}",
        # Where the gRPC client's ca.crt, tls.crt and tls.key are.
        f"--cert-dir={certs.adapter_dir}",
        f"--metrics-service-address=127.0.0.1:{ports.operator_grpc}",
        f"--port={ports.adapter_metrics}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--zap-log-level=info",
        "--zap-encoder=console",
    ]


def keda_env(kubeconfig: Path) -> dict[str, str]:
    """What both KEDA programs read from their environment outside a pod: the API server and their namespace."""
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "KUBECONFIG": str(kubeconfig),
        "POD_NAMESPACE": KEDA_NAMESPACE,
        # Read from the service account's mount in a pod.
        "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
        "WATCH_NAMESPACE": "",
    }


@dataclass
class AutoscalingRig:
    """A running Prometheus and KEDA beside a cluster's real node."""

    cluster: LocalCluster
    node: RealNode
    #: Prometheus as seen from the node's namespace and its pods: the ``serverAddress`` of a KEDA trigger.
    prometheus_url: str
    processes: list[ManagedProcess]
    #: Seconds :meth:`start` took.
    started_in: float = 0.0

    @classmethod
    def start(
        cls,
        cluster: LocalCluster,
        *,
        pod_selector: str = SERVING_POD_SELECTOR,
        port_name: str = SCRAPED_PORT,
        scrape_interval: str = SCRAPE_INTERVAL,
        timeout: float = 120.0,
    ) -> AutoscalingRig:
        """Start Prometheus (scraping ``pod_selector``'s pods at ``port_name``), KEDA's CRDs, operator and adapter.

        Returns once Prometheus is ready and the API server serves ``external.metrics.k8s.io`` through the adapter.
        """
        begun = time.monotonic()
        node = cluster.real_node
        if node is None:
            raise AutoscalingRigError(
                f"cluster {cluster.name!r} has no real node: the rig runs in its network namespace"
            )
        prometheus, operator, adapter = (
            _binary("prometheus", "prometheus"),
            _binary("keda", "keda-operator"),
            _binary("keda", "keda-adapter"),
        )
        crds = keda_crds()
        directory = cluster.state.workdir / "autoscaling"
        directory.mkdir()
        ports = RigPorts.pick()
        kubeconfig = cluster.kubeconfig
        rig = cls(cluster, node, f"http://{NODE_IP}:{ports.prometheus}", [])
        try:
            config = directory / "prometheus.yaml"
            scrape = prometheus_config(kubeconfig, pod_selector, port_name, scrape_interval)
            config.write_text(yaml.safe_dump(scrape, sort_keys=False))
            prom = rig._spawn("prometheus", prometheus_argv(prometheus, config, directory, ports.prometheus))
            with cluster.admin_api() as api:
                cluster.install_crds(crds, "KEDA's CRDs")
                api.request("POST", "/api/v1/namespaces", {"metadata": {"name": KEDA_NAMESPACE}})
                certs = KedaCerts.issue(directory)
                env = keda_env(kubeconfig)
                keda_operator = rig._spawn("keda-operator", operator_argv(operator, certs, ports), env)
                keda_adapter = rig._spawn("keda-adapter", adapter_argv(adapter, certs, kubeconfig, ports), env)
                service, endpoints, api_service = adapter_objects(ports.adapter, certs.ca.read_bytes())
                api.request("POST", f"/api/v1/namespaces/{KEDA_NAMESPACE}/services", service)
                api.request("POST", f"/apis/discovery.k8s.io/v1/namespaces/{KEDA_NAMESPACE}/endpointslices", endpoints)
                api.request("POST", "/apis/apiregistration.k8s.io/v1/apiservices", api_service)
                ready = f"{rig.prometheus_url}/-/ready"
                rig._wait(prom, "Prometheus to be ready", lambda: answers_in_netns(node.netns, ready), timeout)
                probe = f"http://127.0.0.1:{ports.operator_probes}/readyz"
                rig._wait(
                    keda_operator, "the KEDA operator's /readyz", lambda: answers_in_netns(node.netns, probe), timeout
                )
                rig._wait(keda_adapter, f"APIService {EXTERNAL_METRICS} Available", lambda: _available(api), timeout)
        except BaseException:
            rig.stop()
            raise
        rig.started_in = time.monotonic() - begun
        return rig

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        directory = self.cluster.state.workdir / "autoscaling"
        inside = ["ip", "netns", "exec", self.node.netns]
        process = ManagedProcess.spawn(name, [*inside, *argv], directory / f"{name}.log", cwd=directory, env=env)
        self.processes.append(process)
        # Recorded with the cluster's own, so `cluster down` and the reaper stop it after a crash too.
        self.cluster.state.processes.append(process.record)
        save(self.cluster.state)
        return process

    def _wait(self, process: ManagedProcess, what: str, check: Callable[[], bool], timeout: float) -> None:
        try:
            process.wait_ready(check, timeout=timeout, what=what, interval=0.5)
        except ProcessNotReadyError as error:
            raise AutoscalingRigError(str(error)) from None

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The result of an instant query (Prometheus's ``data.result``), asked from the node's namespace."""
        url = f"{self.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        result = self.node.in_netns(["python3", "-I", "-c", _FETCH, url], timeout=15)
        if result.returncode != 0:
            raise AutoscalingRigError(f"query {promql!r} failed: {result.stderr.strip()[-500:]}")
        answer: dict[str, Any] = json.loads(result.stdout)
        data: list[dict[str, Any]] = answer["data"]["result"]
        return data

    def value(self, promql: str) -> float | None:
        """The value of a query that yields one sample, or None when it yields none."""
        samples = self.query(promql)
        if len(samples) > 1:
            raise AutoscalingRigError(f"query {promql!r} yields {len(samples)} samples, not one: {samples}")
        return float(samples[0]["value"][1]) if samples else None

    def stop(self) -> None:
        """Stop Prometheus and KEDA (the CRDs and objects stay: the cluster goes with its test session)."""
        if not stop_all(self.processes, grace=5):
            raise AutoscalingRigError(f"could not stop {', '.join(p.record.name for p in self.processes if p.alive())}")
        pids = {p.pid for p in self.processes}
        self.cluster.state.processes = [r for r in self.cluster.state.processes if r.pid not in pids]
        save(self.cluster.state)


def _available(api: Api) -> bool:
    found = api.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{EXTERNAL_METRICS}") or {}
    conditions = found.get("status", {}).get("conditions", [])
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)
