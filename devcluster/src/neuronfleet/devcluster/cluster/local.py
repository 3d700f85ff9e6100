"""A real Kubernetes control plane as local processes: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and KWOK playing the kubelets of fake Neuron and CPU nodes.

Everything listens on free loopback ports and lives in a temp directory. Each cluster's state (pids,
ports, directory, owner) is a JSON file (see :mod:`neuronfleet.devcluster.process.state`), so another
process can stop it, and a cluster whose owner died (a crashed test run) is reaped by :func:`reap_orphans`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from neuronfleet.contract.hardware import NEURON_DEVICE_RESOURCE
from neuronfleet.devcluster.controlplane.api import Api, ApiError
from neuronfleet.devcluster.controlplane.components import COMPONENTS, REAL_NODE, Layout, argv
from neuronfleet.devcluster.controlplane.fleet import DEFAULT_FLEET, NodePool, fleet_nodes
from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.process.managed import (
    ManagedProcess,
    ProcessNotReadyError,
    answers,
    free_ports,
    started_at,
    stop,
)
from neuronfleet.devcluster.process.state import ClusterState, list_states, load, save, state_file
from neuronfleet.devcluster.process.tools import KubeTools, helm_env
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode import node

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


class ClusterError(RigError):
    """A cluster could not be started, found or stopped."""


class LocalCluster:
    """A running local control plane. Start one with :meth:`start`, find a running one with :meth:`find`."""

    def __init__(self, state: ClusterState, children: Sequence[ManagedProcess] = ()) -> None:
        self.state = state
        # Only the starting process holds these; it reaps them so no zombies remain.
        self._children = {child.record.name: child for child in children}

    @property
    def name(self) -> str:
        """The cluster's name (its state file is ``<name>.json``)."""
        return self.state.name

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig."""
        return self.state.kubeconfig

    @property
    def audit_log(self) -> Path:
        """The API server's audit log of the admin's writes (``controlplane.components.Layout.audit_log``)."""
        return self.state.workdir / "audit.log"

    @property
    def server(self) -> str:
        """The API server's URL."""
        return self.state.server

    @classmethod
    def find(cls, name: str) -> LocalCluster | None:
        """The cluster named ``name`` from its state file, or None."""
        state = load(state_file(name))
        return None if state is None else cls(state)

    @classmethod
    def start(
        cls,
        name: str = "dev",
        *,
        fleet: Iterable[NodePool] = DEFAULT_FLEET,
        owner_pid: int | None = None,
        tools: KubeTools | None = None,
        timeout: float = 90.0,
        real_node: bool = False,
    ) -> LocalCluster:
        """Start a cluster and its fake nodes; return once every node is Ready.

        With ``owner_pid``, :func:`reap_orphans` stops the cluster after that process is gone. With
        ``real_node``, node ``real-0`` (a kubelet, containerd and kube-proxy; see
        :mod:`neuronfleet.devcluster.realnode.node`) joins the fleet, advertising a trn2.48xlarge's Neuron capacity.
        """
        tools = tools or KubeTools.locate()
        existing = cls.find(name)
        if existing is not None:
            if existing.running():
                raise ClusterError(f"cluster {name!r} is already running (kubeconfig {existing.kubeconfig})")
            existing.stop()
        ports = dict(zip(("etcd", "etcd-peer", *COMPONENTS[1:4]), free_ports(5), strict=True))
        server = f"https://127.0.0.1:{ports['kube-apiserver']}"
        workdir = Path(tempfile.mkdtemp(prefix=f"neuronfleet-{name}-"))
        # Owned by this process while booting, so a crash mid-way leaves a cluster to reap.
        state = ClusterState(
            name=name,
            workdir=workdir,
            server=server,
            ports=ports,
            tools=tools.directory,
            owner_pid=os.getpid(),
            owner_started=started_at(os.getpid()),
            netns=node.netns_name(name) if real_node else None,
        )
        save(state)
        cluster = cls(state)
        try:
            cluster._boot(tools, Layout.create(workdir, server), list(fleet), timeout)
        except BaseException:
            cluster.stop()
            raise
        state.owner_pid = owner_pid
        state.owner_started = None if owner_pid is None else started_at(owner_pid)
        save(state)
        return cluster

    def _spawn(self, name: str, tools: KubeTools, layout: Layout) -> None:
        self._spawn_argv(name, argv(name, tools, layout, self.state.ports))

    def _spawn_argv(self, name: str, command: Sequence[str], env: dict[str, str] | None = None) -> ManagedProcess:
        logs = self.state.workdir / "logs"
        logs.mkdir(exist_ok=True)
        child = ManagedProcess.spawn(name, command, logs / f"{name}.log", cwd=logs, env=env)
        self._children[name] = child
        self.state.processes.append(child.record)
        save(self.state)
        return child

    def _wait_process(self, what: str, process: ManagedProcess, check: Callable[[], bool], timeout: float) -> None:
        try:
            process.wait_ready(check, timeout=timeout, what=what)
        except ProcessNotReadyError as error:
            raise ClusterError(str(error)) from None

    def _wait(self, what: str, component: str, check: Callable[[], bool], timeout: float) -> None:
        self._wait_process(what, self._children[component], check, timeout)

    def _boot(self, tools: KubeTools, layout: Layout, fleet: list[NodePool], timeout: float) -> None:
        with self.admin_api() as api:
            ports = self.state.ports

            self._spawn("etcd", tools, layout)
            self._wait("etcd to be healthy", "etcd", lambda: _etcd_healthy(ports["etcd"]), timeout)

            self._spawn("kube-apiserver", tools, layout)
            self._wait("kube-apiserver /readyz", "kube-apiserver", lambda: _readyz(api), timeout)

            for name in ("kube-controller-manager", "kube-scheduler"):
                self._spawn(name, tools, layout)
            for name in ("kube-controller-manager", "kube-scheduler"):
                # Their /healthz is open to anyone, and their serving certificates are self-signed.
                url = f"https://127.0.0.1:{ports[name]}/healthz"
                self._wait(f"{name} /healthz", name, partial(answers, url, verify=False), timeout)

            nodes = fleet_nodes(fleet)
            for node in nodes:
                api.request("POST", "/api/v1/nodes", node)
            self._spawn("kwok", tools, layout)
            names = {node["metadata"]["name"] for node in nodes}
            self._wait("the fake nodes to be Ready", "kwok", lambda: names <= _ready_nodes(api), timeout)
            # Pods need a namespace's default ServiceAccount, which the controller manager creates.
            self._wait(
                "the default ServiceAccount",
                "kube-controller-manager",
                lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default") is not None,
                timeout,
            )
            if self.state.netns is not None:
                self._boot_real_node(api, tools, layout, timeout)

    def _boot_real_node(self, api: Api, tools: KubeTools, layout: Layout, timeout: float) -> None:
        try:
            node.start(self.state, layout, tools, self._spawn_argv, partial(self._wait_process, timeout=timeout))
        except node.NodeError as error:
            raise ClusterError(str(error)) from None
        api.request("POST", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices", node.apiserver_endpoints())
        self._wait("the real node to be Ready", "kubelet", lambda: REAL_NODE in _ready_nodes(api), timeout)
        self._wait(
            "the real node to advertise its Neuron devices",
            "node-capacity",
            lambda: NEURON_DEVICE_RESOURCE in api.request("GET", f"/api/v1/nodes/{REAL_NODE}")["status"]["allocatable"],
            timeout,
        )

    @property
    def real_node(self) -> node.RealNode | None:
        """The cluster's real node (``start(real_node=True)``), or None."""
        return None if self.state.netns is None else node.RealNode(self.state)

    def running(self) -> bool:
        """Whether every component runs and the API server is ready."""
        return all(self.components().values())

    def components(self) -> dict[str, bool]:
        """Each component's liveness (the real node's processes too), plus ``kube-apiserver /readyz``."""
        alive = {r.name: r.alive() for r in self.state.processes}
        names = COMPONENTS if self.state.netns is None else (*COMPONENTS, *node.PROCESSES)
        health = {name: alive.get(name, False) for name in names}
        with self.admin_api() as api:
            health["kube-apiserver /readyz"] = health["kube-apiserver"] and _readyz(api)
        return health

    def admin_api(self) -> Api:
        """A small JSON client authenticated as the cluster admin (close it, or use it in ``with``)."""
        pki_dir = self.state.workdir / "pki"
        return Api(self.server, pki_dir / "ca.crt", pki_dir / "admin.crt", pki_dir / "admin.key")

    def stop(self) -> None:
        """Stop every process this cluster started, then remove its directory and state file."""
        # The real node first, in its own order (kubelet, pods, containerd, shims, relays, namespace).
        survivors = [] if self.state.netns is None else node.teardown(self.state)
        # etcd goes last: with it up the API server exits in about a second, without it it waits out its grace.
        records = self.state.processes
        survivors += stop([r for r in records if r.name != "etcd"]) + stop([r for r in records if r.name == "etcd"])
        if survivors:
            names = ", ".join(f"{r.name} (pid {r.pid})" for r in survivors)
            raise ClusterError(f"could not stop {names}; state kept in {state_file(self.name)}")
        for child in self._children.values():
            child.wait(timeout=5)
        shutil.rmtree(self.state.workdir, ignore_errors=True)
        state_file(self.name).unlink(missing_ok=True)

    def api_client(self) -> ApiClient:
        """A ``kubernetes`` client authenticated as the cluster admin (close it when done)."""
        from kubernetes.client import ApiClient, Configuration

        pki_dir = self.state.workdir / "pki"
        configuration = Configuration(
            host=self.server,
            ssl_ca_cert=str(pki_dir / "ca.crt"),
            cert_file=str(pki_dir / "admin.crt"),
            key_file=str(pki_dir / "admin.key"),
        )
        return ApiClient(configuration)

    def install_crds(self, path: Path, what: str) -> None:
        """Server-side apply the CRDs at ``path`` (a file or a directory), then wait until each is Established."""
        applied = self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        if applied.returncode != 0:
            raise ClusterError(f"applying {what} failed: {applied.stderr.strip()}")
        self.wait_established(path, what)

    def wait_established(self, path: Path, what: str, timeout: float = 60.0) -> None:
        """Wait until the API server serves every CRD at ``path``."""
        # Right after an apply a CRD may have no conditions yet, which `kubectl wait` takes as an error.
        wait_for(
            lambda: self.kubectl("wait", "--for=condition=Established", "--timeout=10s", "-f", str(path)),
            lambda done: done.returncode == 0,
            timeout=timeout,
            interval=0.5,
            what=f"{what} Established",
            show=lambda done: done.stderr.strip(),
        )

    def kubectl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster as admin (output captured, status not checked)."""
        return self._run_tool("kubectl", args, timeout)

    def helm(self, *args: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        """Run the pinned helm against this cluster as admin (output captured, status not checked).

        Helm keeps its caches and repository list in the cluster's directory, never in the user's home.
        """
        return self._run_tool("helm", args, timeout, helm_env(self.state.workdir / "helm"))

    def _run_tool(
        self, tool: str, args: tuple[str, ...], timeout: float, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.state.tools / tool), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
            env=env,
        )


def _etcd_healthy(port: int) -> bool:
    try:
        return bool(httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("health") == "true")
    except (httpx.TransportError, ValueError):
        return False


def _readyz(api: Api) -> bool:
    try:
        return bool(api.request("GET", "/readyz", timeout=3) == "ok")
    except (httpx.TransportError, ApiError):
        return False


def _ready_nodes(api: Api) -> set[str]:
    ready = set()
    for item in api.request("GET", "/api/v1/nodes")["items"]:
        conditions = item.get("status", {}).get("conditions", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ready.add(item["metadata"]["name"])
    return ready


def reap_orphans() -> list[str]:
    """Stop clusters whose owner died, and unowned ones whose processes all died; return their names."""
    reaped = []
    for state in list_states():
        dead = not any(r.alive() for r in state.processes)
        if not state.owner_alive() or (state.owner_pid is None and dead):
            LocalCluster(state).stop()
            reaped.append(state.name)
    return reaped
