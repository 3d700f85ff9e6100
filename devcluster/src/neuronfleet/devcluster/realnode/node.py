"""One real node beside the KWOK fleet: containerd, runc, a kubelet and kube-proxy in a network namespace.

Everything the node runs lives in the namespace ``nf-<cluster>``, which has only ``lo`` and no route out:
pods sit on a CNI bridge inside it, the API server is reached over unix sockets (socat relays), and the
API server reaches the node through the egress proxy, which runs inside it too. Every process is a
:class:`ManagedProcess` recorded in the cluster's state, so ``cluster down`` and ``cluster reap`` stop
them by pid; :func:`teardown` also removes the pods, leftover shims and the namespace, after a crash too.

Sandbox workarounds, each named where it is made: the rlimits wrapper
(:mod:`neuronfleet.devcluster.images.runc_norlimits`), the cgroup remount (:mod:`.namespace`),
``oom_score_adj`` clamped to 0, the node address on ``lo``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from neuronfleet.contract.hardware import INSTANCE_TYPE_LABEL, NEURON_TAINT_KEY, get_instance_type
from neuronfleet.devcluster.controlplane import devices
from neuronfleet.devcluster.controlplane.components import REAL_NODE, REAL_NODE_POD_CIDR, SERVICE_CIDR, Layout
from neuronfleet.devcluster.controlplane.fleet import (
    DEFAULT_FLEET,
    POOL_LABEL,
    REGION,
    REGION_LABEL,
    ZONE_LABEL,
    NodePool,
)
from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.images import node_images, runc_norlimits
from neuronfleet.devcluster.process import tools
from neuronfleet.devcluster.process.managed import ManagedProcess, ProcessRecord, stop
from neuronfleet.devcluster.process.state import ClusterState
from neuronfleet.devcluster.process.tools import KubeTools, NodeTools, ToolsMissingError
from neuronfleet.devcluster.realnode.store import UNPACK_CONFIG, Containerd, NodeImageStore, OciImage, StoreError

#: The node's address: inside the fleet's node network, far above the KWOK nodes counting up from .1.
NODE_IP = "10.240.255.254"
#: Where pods reach the API server (Service ``kubernetes`` points here): a relay to its socket.
APISERVER_RELAY_PORT = 6443
#: The hardware catalogue's instance type the node stands for (labels, taint, Neuron capacity).
INSTANCE_TYPE = "trn2.48xlarge"
POOL = "real"
#: The node's processes, in the order :func:`teardown` stops them (after the pods are removed).
PROCESSES = (
    "node-capacity",
    "neuron-dra",
    "kubelet",
    "kube-proxy",
    "containerd",
    "relay-host",
    "relay-loopback",
    "relay-node",
    "egress-proxy",
    "node-namespace",
)
#: Seconds one image import may take.
IMPORT_TIMEOUT_S = 1800
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

#: Starts and records one process: ``spawn(name, argv, env)``.
Spawn = Callable[[str, Sequence[str], dict[str, str] | None], ManagedProcess]
#: ``wait(what, process, check)``: until ``check()`` holds, failing as soon as ``process`` exits.
Wait = Callable[[str, ManagedProcess, Callable[[], bool]], None]


def pinned_here() -> dict[str, Any]:
    """A pod spec's placement on the real node: its hostname selected, its Neuron taint tolerated."""
    return {
        "nodeSelector": {"kubernetes.io/hostname": REAL_NODE},
        "tolerations": [{"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    }


def netns_name(cluster: str) -> str:
    """The network namespace of ``cluster``'s real node."""
    return f"nf-{cluster}"


class NodeError(RigError):
    """The real node could not be set up or torn down."""


@dataclass(frozen=True)
class NodePaths:
    """The real node's files, all under the cluster's working directory."""

    root: Path

    @classmethod
    def of(cls, workdir: Path) -> NodePaths:
        """The node's directory in a cluster's working directory."""
        return cls(workdir / REAL_NODE)

    @property
    def containerd(self) -> Path:
        """containerd's root, state and sockets."""
        return self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        """containerd's gRPC socket (the kubelet's and crictl's runtime endpoint)."""
        return self.containerd / "containerd.sock"

    @property
    def cdi(self) -> Path:
        """The CDI specs the DRA plugin writes for prepared claims, and containerd applies."""
        return self.root / "cdi"

    @property
    def device_nodes(self) -> Path:
        """The node's Neuron device nodes (``neuron<id>``), stand-ins with /dev/null's numbers."""
        return self.root / "dev"

    @property
    def namespace_ready(self) -> Path:
        """Created by :mod:`.namespace` once the cgroups are mounted."""
        return self.root / "namespace-ready"


def kubelet_config(paths: NodePaths, ca: Path) -> dict[str, Any]:
    """The kubelet's configuration: loopback and the node's address only, the least of the cgroups."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # The host has cgroup v1 (hybrid), which kubelet 1.37 refuses unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # No QoS or pod-level parents and no allocatable enforcement: as little of the hierarchy as possible.
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        # Sandbox refusal: a negative oom_score_adj is refused here (the kubelet's own default is -999).
        "oomScoreAdj": 0,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "podLogsDir": str(paths.root / "pod-logs"),
        # Pods get a resolver that answers nothing: there is no cluster DNS, and no route out.
        "resolvConf": str(paths.root / "resolv.conf"),
        "localStorageCapacityIsolation": False,
        # No eviction, and imported images are never collected (they cannot be pulled again).
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerWithTaints": [{"key": NEURON_TAINT_KEY, "effect": "NoSchedule"}],
    }


def fleet_beside(fleet: Sequence[NodePool] = DEFAULT_FLEET) -> list[NodePool]:
    """The KWOK pools that join the real node: none of its instance type, so its pods land on it alone."""
    return [pool for pool in fleet if pool.shape.instance_type != INSTANCE_TYPE]


def node_labels(zone: str = f"{REGION}a") -> dict[str, str]:
    """The labels a trn2.48xlarge node carries (as the KWOK fleet's), set by the kubelet at registration."""
    return {INSTANCE_TYPE_LABEL: INSTANCE_TYPE, ZONE_LABEL: zone, REGION_LABEL: REGION, POOL_LABEL: POOL}


def kube_proxy_config(kubeconfig: Path) -> dict[str, Any]:
    """kube-proxy in iptables mode, touching no global sysctl and listening inside the namespace only."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": REAL_NODE,
        "mode": "iptables",
        "clusterCIDR": REAL_NODE_POD_CIDR,
        "bindAddress": NODE_IP,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "iptables": {"localhostNodePorts": False},
        # 0: leave the kernel's conntrack settings alone (they are global, and refused here).
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def cni_config(paths: NodePaths) -> dict[str, Any]:
    """The pod network: a bridge inside the node's namespace, no masquerade (there is nowhere to go)."""
    gateway = REAL_NODE_POD_CIDR.rsplit(".", 1)[0] + ".1"
    return {
        "cniVersion": "1.0.0",
        "name": "neuronfleet",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": REAL_NODE_POD_CIDR, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.root / "cni-ipam"),
                },
            }
        ],
    }


def containerd_config(paths: NodePaths, runtime_spec: Path, runc: Path) -> str:
    """containerd's configuration (version 3): CRI with overlayfs, the local pause image, the runc wrapper."""
    c = paths.containerd
    return f"""version = 3
root = "{c / "root"}"
state = "{c / "state"}"

[grpc]
  address = "{paths.containerd_socket}"

[ttrpc]
  address = "{paths.containerd_socket}.ttrpc"

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    # No registry is reachable: every image is imported, the sandbox's too.
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{node_images.PAUSE_IMAGE}'

  [plugins.'io.containerd.cri.v1.runtime']
    enable_selinux = false
    disable_apparmor = true
    netns_mounts_under_state_dir = true
    # Sandbox refusal: a negative oom_score_adj is refused ("nsexec: failed to update /proc/self/oom_score_adj:
    # Permission denied", which the kubelet sees as "can't get final child's PID from pipe: EOF"); the kubelet
    # asks -998 for sandboxes. Clamped to containerd's own (0).
    restrict_oom_score_adj = true
    enable_unprivileged_ports = true
    enable_unprivileged_icmp = true
    # What a prepared DRA claim hands its containers: device nodes and the Neuron runtime's environment.
    enable_cdi = true
    cdi_spec_dirs = ['{paths.cdi}']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        # containerd's default spec without its RLIMIT_NOFILE (see the wrapper below).
        base_runtime_spec = '{runtime_spec}'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          # Sandbox refusal "error setting rlimit type 7: operation not permitted": runc without rlimits.
          BinaryName = '{runc}'
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni']
      conf_dir = '{paths.root / "cni"}'
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'

{UNPACK_CONFIG}"""


def apiserver_endpoints() -> dict[str, Any]:
    """An EndpointSlice giving Service ``kubernetes`` the node's relay, so in-cluster clients reach the API."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes-real-node",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "neuronfleet-real-node",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": APISERVER_RELAY_PORT, "protocol": "TCP"}],
    }


def _run(argv: Sequence[str], what: str, timeout: float = 60) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise NodeError(f"{what} failed ({' '.join(argv)}): {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def create_netns(name: str) -> None:
    """The node's network namespace: ``lo`` with the node's address, and no route out."""
    delete_netns(name)  # left by a crashed run
    _run(["ip", "netns", "add", name], "creating the node's network namespace")
    _run(["ip", "-n", name, "link", "set", "lo", "up"], "lo up")
    # Sandbox refusal: `ip link add ... type dummy` answers "Unknown device type." (no dummy module): lo holds it.
    _run(["ip", "-n", name, "addr", "add", f"{NODE_IP}/32", "dev", "lo"], "the node's address")
    # Without a route a connect() to a ClusterIP fails before kube-proxy's OUTPUT DNAT; via lo it stays local.
    _run(["ip", "-n", name, "route", "add", SERVICE_CIDR, "dev", "lo"], "the Service route")
    _run(["ip", "netns", "exec", name, "sysctl", "-qw", "net.ipv4.ip_forward=1"], "forwarding")
    # Pod-to-Service on one bridge needs bridged traffic to pass iptables (absent without br_netfilter).
    with contextlib.suppress(NodeError):
        _run(["ip", "netns", "exec", name, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1"], "bridge netfilter")


def delete_netns(name: str) -> None:
    """Delete the namespace if it exists."""
    if (Path("/var/run/netns") / name).exists():
        _run(["ip", "netns", "delete", name], "deleting the node's network namespace")


class RealNode:
    """The real node of a running cluster (its state names the namespace)."""

    def __init__(self, state: ClusterState) -> None:
        if state.netns is None:
            raise NodeError(f"cluster {state.name!r} has no real node (start it with --real-node)")
        self.state = state
        self.netns = state.netns
        self.paths = NodePaths.of(state.workdir)
        self.tools = NodeTools.locate()

    def ctr(self, *args: str, timeout: float = 300) -> str:
        """Run ctr against the node's containerd (Kubernetes' namespace); its output."""
        return _run(
            [str(self.tools.path("ctr")), f"--address={self.paths.containerd_socket}", "--namespace=k8s.io", *args],
            f"ctr {args[0]}",
            timeout,
        )

    def crictl(self, *args: str, timeout: float = 60) -> str:
        """Run crictl against the node's containerd; its output."""
        endpoint = f"unix://{self.paths.containerd_socket}"
        return _run(
            [str(self.tools.path("crictl")), f"--runtime-endpoint={endpoint}", *args], f"crictl {args[0]}", timeout
        )

    def import_image(self, image: OciImage) -> int:
        """Make ``image`` runnable by the node's pods; how many layers had to be unpacked.

        Nothing to do for an image that was in the node image store when the node started; otherwise
        only the layers the node has no snapshot of are sent (see :mod:`.store`).
        """
        scratch = self.paths.root / "imports"
        scratch.mkdir(exist_ok=True)
        try:
            return Containerd(self.tools.path("ctr"), self.paths.containerd_socket).load(
                image, scratch, timeout=IMPORT_TIMEOUT_S
            )
        except StoreError as error:
            raise NodeError(str(error)) from None

    def in_netns(self, argv: Sequence[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the node's network namespace (output captured, status not checked)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )


@dataclass(frozen=True)
class NodeFiles:
    """The configuration files :func:`write_files` made."""

    containerd: Path
    kubelet: Path
    kube_proxy: Path


def write_files(paths: NodePaths, layout: Layout, node_tools: NodeTools) -> NodeFiles:
    """Write the node's configuration: containerd (with the runc wrapper and its spec), CNI, kubelet, kube-proxy."""
    (paths.root / "cni").mkdir(parents=True)
    # containerd runs this path without arguments of its own.
    runc = runc_norlimits.install(paths.root / "runc")
    # containerd's default spec carries RLIMIT_NOFILE: the wrapper would strip it from every container anyway.
    spec = json.loads(_run([str(node_tools.path("ctr")), "oci", "spec"], "containerd's default spec"))
    runc_norlimits.without_rlimits(spec["process"])
    runtime_spec = paths.root / "runtime-spec.json"
    runtime_spec.write_text(json.dumps(spec))
    files = NodeFiles(paths.root / "containerd.toml", paths.root / "kubelet.yaml", paths.root / "kube-proxy.yaml")
    files.containerd.write_text(containerd_config(paths, runtime_spec, runc))
    (paths.root / "cni" / "10-neuronfleet.conflist").write_text(json.dumps(cni_config(paths)))
    (paths.root / "resolv.conf").write_text("nameserver 127.0.0.1\n")
    files.kubelet.write_text(yaml.safe_dump(kubelet_config(paths, layout.ca)))
    files.kube_proxy.write_text(yaml.safe_dump(kube_proxy_config(layout.kubeconfigs["kube-proxy"])))
    return files


def start(state: ClusterState, layout: Layout, kube_tools: KubeTools, spawn: Spawn, wait: Wait) -> None:
    """Set up the namespace and start the node's processes (each through ``spawn``, which records it).

    ``wait(what, process, check)`` waits until ``check()`` holds while ``process`` runs.
    """
    if state.netns is None:
        raise NodeError(f"cluster {state.name!r} names no namespace for its real node")
    if os.geteuid() != 0:
        raise NodeError("the real node needs root: it creates a network namespace and mounts cgroups")
    node_tools = NodeTools.locate()
    paths = NodePaths.of(state.workdir)
    files = write_files(paths, layout, node_tools)
    _prepare_images(paths, node_tools)
    create_netns(state.netns)

    holder = spawn(
        "node-namespace",
        [
            "ip",
            "netns",
            "exec",
            state.netns,
            *_PYTHON,
            "neuronfleet.devcluster.realnode.namespace",
            str(paths.namespace_ready),
        ],
        None,
    )
    wait("the node's mount namespace", holder, paths.namespace_ready.exists)
    # Joins the holder's network and mount namespaces: one mount table for the kubelet, containerd and runc.
    enter = ["nsenter", f"--target={holder.pid}", "--mount", "--net", "--"]
    env = {"PATH": f"{node_tools.directory}:{_PATH}"}
    _start_relays(state, layout, spawn, wait, enter)

    containerd = spawn("containerd", [*enter, str(node_tools.path("containerd")), f"--config={files.containerd}"], env)
    node = RealNode(state)
    wait("containerd to answer", containerd, lambda: _answers(node))
    _start_kubelet_and_proxy(layout, kube_tools, spawn, enter, env, files, paths)
    _start_dra_plugin(layout, spawn, enter, paths)
    spawn(
        "node-capacity",
        [
            *_PYTHON,
            "neuronfleet.devcluster.realnode.capacity",
            str(state.workdir),
            REAL_NODE,
            INSTANCE_TYPE,
            state.server,
        ],
        None,
    )


def _start_dra_plugin(layout: Layout, spawn: Spawn, enter: list[str], paths: NodePaths) -> None:
    """The node's simulated Neuron devices, published and prepared as the Neuron DRA driver's kubelet plugin
    would (``tools/dra``): claims on them reach the kubelet's side of DRA. Only a DeviceClass selecting the
    driver (which the tests create) lets a pod claim them."""
    published = paths.root / "dra-devices.json"
    published.write_text(json.dumps(devices.resource_slice(REAL_NODE, INSTANCE_TYPE)["spec"]["devices"]))
    instance = get_instance_type(INSTANCE_TYPE)
    # A simulated device has no driver behind it: its node is a character device that reads and writes as /dev/null.
    paths.device_nodes.mkdir(exist_ok=True)
    for index in range(instance.devices):
        with contextlib.suppress(FileExistsError):
            os.mknod(paths.device_nodes / f"neuron{index}", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    spawn(
        "neuron-dra",
        [
            *enter,
            str(tools.dra_plugin()),
            f"--kubeconfig={layout.kubeconfigs[REAL_NODE]}",
            f"--node-name={REAL_NODE}",
            f"--kubelet-root-dir={paths.root / 'kubelet'}",
            f"--devices={published}",
            f"--cores-per-device={instance.chip.physical_cores}",
            f"--default-lnc={instance.chip.default_lnc}",
            f"--cdi-dir={paths.cdi}",
            f"--device-node-dir={paths.device_nodes}",
        ],
        None,
    )


#: How the node's own Python helpers are started: this interpreter, safe path.
_PYTHON = [sys.executable, "-P", "-m"]


def _prepare_images(paths: NodePaths, node_tools: NodeTools) -> None:
    """The node's containerd starts with every image of the node image store: the pause and base images
    (built once and cached, see images/node_images.py), and whatever a caller unpacked there before."""
    store = NodeImageStore.default(node_tools.directory)
    try:
        store.prepare([OciImage.read(node_images.pause_image()), OciImage.read(node_images.base_image())])
        store.clone_to(paths.containerd / "root")
    except StoreError as error:
        raise NodeError(str(error)) from None


def _start_relays(state: ClusterState, layout: Layout, spawn: Spawn, wait: Wait, enter: list[str]) -> None:
    """The API server, reached from inside the namespace through a socket; the egress proxy beside it."""
    socket = layout.apiserver_socket
    port = state.ports["kube-apiserver"]
    relay_host = spawn("relay-host", ["socat", f"UNIX-LISTEN:{socket},fork,mode=600", f"TCP:127.0.0.1:{port}"], None)
    wait("the API server relay's socket", relay_host, socket.exists)
    # The kubelet and kube-proxy use the unchanged kubeconfigs (https://127.0.0.1:<port>, in the serving cert).
    spawn(
        "relay-loopback",
        [*enter, "socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr", f"UNIX-CONNECT:{socket}"],
        None,
    )
    spawn(
        "relay-node",
        [*enter, "socat", f"TCP-LISTEN:{APISERVER_RELAY_PORT},bind={NODE_IP},fork,reuseaddr", f"UNIX-CONNECT:{socket}"],
        None,
    )
    allow = [f"--allow={network}" for network in (f"{NODE_IP}/32", REAL_NODE_POD_CIDR, SERVICE_CIDR)]
    spawn(
        "egress-proxy",
        [*enter, *_PYTHON, "neuronfleet.devcluster.realnode.egress_proxy", str(layout.egress_socket), *allow],
        None,
    )


def _start_kubelet_and_proxy(
    layout: Layout,
    kube_tools: KubeTools,
    spawn: Spawn,
    enter: list[str],
    env: dict[str, str],
    files: NodeFiles,
    paths: NodePaths,
) -> None:
    labels = ",".join(f"{key}={value}" for key, value in node_labels().items())
    spawn(
        "kubelet",
        [
            *enter,
            str(kube_tools.path("kubelet")),
            f"--config={files.kubelet}",
            f"--kubeconfig={layout.kubeconfigs[REAL_NODE]}",
            f"--root-dir={paths.root / 'kubelet'}",
            f"--cert-dir={paths.root / 'kubelet-pki'}",
            f"--hostname-override={REAL_NODE}",
            f"--node-ip={NODE_IP}",
            f"--node-labels={labels}",
            "--v=1",
        ],
        env,
    )
    spawn("kube-proxy", [*enter, str(kube_tools.path("kube-proxy")), f"--config={files.kube_proxy}", "--v=1"], env)


def _answers(node: RealNode) -> bool:
    try:
        node.ctr("version", timeout=5)
    except (NodeError, subprocess.TimeoutExpired):
        return False
    return True


def _kill_shims(paths: NodePaths) -> None:
    """SIGKILL the node's runc shims and the containers under them (a shim outlives containerd)."""
    address = str(paths.containerd_socket)
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if cmdline and cmdline[0].endswith("containerd-shim-runc-v2") and any(address in arg for arg in cmdline):
            with contextlib.suppress(psutil.Error):
                # Each container's first process is the shim's child: killing it ends its pid namespace.
                for child in process.children():
                    child.send_signal(signal.SIGKILL)
                process.send_signal(signal.SIGKILL)


def teardown(state: ClusterState) -> list[ProcessRecord]:
    """Stop the node's processes in order, remove its pods, shims and namespace; the processes still alive."""
    records = {record.name: record for record in state.processes if record.name in PROCESSES}
    paths = NodePaths.of(state.workdir)

    def stop_named(*names: str) -> list[ProcessRecord]:
        return stop([records[name] for name in names if name in records])

    survivors = stop_named("node-capacity", "neuron-dra", "kubelet")
    containerd = records.get("containerd")
    if containerd is not None and containerd.alive():
        # Stopped and removed while containerd runs: containers killed, CNI torn down.
        with contextlib.suppress(NodeError, ToolsMissingError, subprocess.TimeoutExpired):
            RealNode(state).crictl("rmp", "--all", "--force", timeout=60)
    survivors += stop_named("kube-proxy", "containerd")
    _kill_shims(paths)
    survivors += stop_named(*PROCESSES[4:])
    if state.netns is not None and not survivors:
        # The mounts made for the node lived in its mount namespace, which ended with its last process.
        delete_netns(state.netns)
    return survivors
