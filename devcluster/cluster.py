"""A real Kubernetes control plane as local processes: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and KWOK playing the kubelets of fake Neuron and CPU nodes.

Everything listens on free loopback ports and lives in a temp directory. Each cluster's state (pids,
ports, directory, owner) is a JSON file (see :mod:`.state`), so another process can stop it, and a
cluster whose owner died (a crashed test run) is reaped by :func:`reap_orphans`.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from neuronfleet.devcluster.api import Api, ApiError
from neuronfleet.devcluster.components import COMPONENTS, Layout, argv
from neuronfleet.devcluster.fleet import DEFAULT_FLEET, NodePool, fleet_nodes
from neuronfleet.devcluster.processes import is_alive, spawn, start_ticks, stop
from neuronfleet.devcluster.state import ClusterState, list_states, load, save, state_file
from neuronfleet.devcluster.tools import KubeTools
from neuronfleet.devcluster.waiting import WaitTimeoutError, wait_for

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


class ClusterError(RuntimeError):
    """A cluster could not be started, found or stopped."""


def _free_ports(count: int) -> list[int]:
    # Held open together so the kernel hands out distinct ports.
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _healthy(url: str) -> bool:
    # /healthz of the controller manager and scheduler is open to anyone; their certs are self-signed.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class LocalCluster:
    """A running local control plane. Start one with :meth:`start`, find a running one with :meth:`find`."""

    def __init__(self, state: ClusterState, children: Sequence[subprocess.Popen[bytes]] = ()) -> None:
        self.state = state
        # Only the starting process holds these; it reaps them so no zombies remain.
        self._children = list(children)

    @property
    def name(self) -> str:
        """The cluster's name (its state file is ``<name>.json``)."""
        return self.state.name

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig."""
        return self.state.kubeconfig

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
    ) -> LocalCluster:
        """Start a cluster and its fake nodes; return once every node is Ready.

        With ``owner_pid``, :func:`reap_orphans` stops the cluster after that process is gone.
        """
        tools = tools or KubeTools.locate()
        existing = cls.find(name)
        if existing is not None:
            if existing.running():
                raise ClusterError(f"cluster {name!r} is already running (kubeconfig {existing.kubeconfig})")
            existing.stop()
        ports = dict(zip(("etcd", "etcd-peer", *COMPONENTS[1:4]), _free_ports(5), strict=True))
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
            owner_start_ticks=start_ticks(os.getpid()),
        )
        save(state)
        cluster = cls(state)
        try:
            cluster._boot(tools, Layout.create(workdir, server), list(fleet), timeout)
        except BaseException:
            cluster.stop()
            raise
        state.owner_pid = owner_pid
        state.owner_start_ticks = None if owner_pid is None else start_ticks(owner_pid)
        save(state)
        return cluster

    def _spawn(self, name: str, tools: KubeTools, layout: Layout) -> None:
        logs = self.state.workdir / "logs"
        logs.mkdir(exist_ok=True)
        child, record = spawn(name, argv(name, tools, layout, self.state.ports), logs / f"{name}.log", cwd=logs)
        self._children.append(child)
        self.state.processes.append(record)
        save(self.state)

    def _wait(self, what: str, component: str, check: Callable[[], bool], timeout: float) -> None:
        record = next(r for r in self.state.processes if r.name == component)

        def observe() -> bool:
            if not is_alive(record.pid, record.start_ticks):
                raise ClusterError(f"{component} exited during startup; last log lines:\n{_log_tail(record.log)}")
            return check()

        try:
            wait_for(observe, timeout=timeout, interval=0.25, what=what)
        except WaitTimeoutError as error:
            raise ClusterError(f"{error}\n{component} log ({record.log}):\n{_log_tail(record.log)}") from None

    def _boot(self, tools: KubeTools, layout: Layout, fleet: list[NodePool], timeout: float) -> None:
        api = self._admin_api()
        ports = self.state.ports

        self._spawn("etcd", tools, layout)
        self._wait("etcd to be healthy", "etcd", lambda: _etcd_healthy(ports["etcd"]), timeout)

        self._spawn("kube-apiserver", tools, layout)
        self._wait("kube-apiserver /readyz", "kube-apiserver", lambda: _readyz(api), timeout)

        for name in ("kube-controller-manager", "kube-scheduler"):
            self._spawn(name, tools, layout)
        for name in ("kube-controller-manager", "kube-scheduler"):
            url = f"https://127.0.0.1:{ports[name]}/healthz"
            self._wait(f"{name} /healthz", name, partial(_healthy, url), timeout)

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
            lambda: _exists(api, "/api/v1/namespaces/default/serviceaccounts/default"),
            timeout,
        )

    def running(self) -> bool:
        """Whether every component runs and the API server is ready."""
        return all(self.components().values())

    def components(self) -> dict[str, bool]:
        """Each component's liveness, plus ``kube-apiserver /readyz``."""
        alive = {r.name: is_alive(r.pid, r.start_ticks) for r in self.state.processes}
        health = {name: alive.get(name, False) for name in COMPONENTS}
        health["kube-apiserver /readyz"] = health["kube-apiserver"] and _readyz(self._admin_api())
        return health

    def _admin_api(self) -> Api:
        pki_dir = self.state.workdir / "pki"
        return Api(self.server, pki_dir / "ca.crt", pki_dir / "admin.crt", pki_dir / "admin.key")

    def stop(self) -> None:
        """Stop every process this cluster started, then remove its directory and state file."""
        # etcd goes last: with it up the API server exits in about a second, without it it waits out its grace.
        records = self.state.processes
        survivors = stop([r for r in records if r.name != "etcd"]) + stop([r for r in records if r.name == "etcd"])
        if survivors:
            names = ", ".join(f"{r.name} (pid {r.pid})" for r in survivors)
            raise ClusterError(f"could not stop {names}; state kept in {state_file(self.name)}")
        for child in self._children:
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

    def kubectl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster as admin (output captured, status not checked)."""
        return subprocess.run(
            [str(self.state.tools / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )


def _etcd_healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return bool(json.load(response).get("health") == "true")
    except (OSError, ValueError):
        return False


def _readyz(api: Api) -> bool:
    try:
        return bool(api.request("GET", "/readyz", timeout=3) == "ok")
    except (OSError, ApiError):
        return False


def _exists(api: Api, path: str) -> bool:
    try:
        api.request("GET", path)
    except ApiError as error:
        if error.status == 404:
            return False
        raise
    return True


def _ready_nodes(api: Api) -> set[str]:
    ready = set()
    for node in api.request("GET", "/api/v1/nodes")["items"]:
        conditions = node.get("status", {}).get("conditions", [])
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ready.add(node["metadata"]["name"])
    return ready


def reap_orphans() -> list[str]:
    """Stop clusters whose owner died, and unowned ones whose processes all died; return their names."""
    reaped = []
    for state in list_states():
        dead = not any(is_alive(r.pid, r.start_ticks) for r in state.processes)
        if not state.owner_alive() or (state.owner_pid is None and dead):
            LocalCluster(state).stop()
            reaped.append(state.name)
    return reaped
