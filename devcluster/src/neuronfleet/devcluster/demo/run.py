"""``neuronfleet-dev demo``: the path a user takes, end to end, on the local control plane and its real node.

Builds (or reuses) the operator and engine images, starts a cluster whose real node ``real-0`` (a kubelet and
containerd) stands for a trn2 node beside KWOK's fake inf2 and CPU nodes, imports both images into the
node's containerd, and installs the Helm chart: the operator runs from its image in a pod on ``real-0``,
under the chart's ServiceAccount. Then it applies a ``device: sim`` example and shows it live until Ready:
the operator's compile pod and serving pod run on ``real-0`` too. It sends one completion through the
service's Kubernetes Service from the node's network, prints how to poke at it and waits for Ctrl-C (or
exits at once with ``--exit-when-ready``); either way it tears everything down.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from neuronfleet.contract.names import ARTIFACT_KIND, GROUP, HTTP_PORT, SERVICE_KIND
from neuronfleet.devcluster.cluster.local import LocalCluster, reap_orphans
from neuronfleet.devcluster.controlplane.api import Api
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.controlplane.storage import artifact_volume
from neuronfleet.devcluster.demo import completion, operator_release, view
from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.images import dockerfile, inputs
from neuronfleet.devcluster.process.tools import NodeTools
from neuronfleet.devcluster.process.waiting import WaitTimeoutError, wait_for
from neuronfleet.devcluster.realnode import node
from neuronfleet.devcluster.realnode.store import NodeImageStore, OciImage, StoreError

Obj = dict[str, Any]

RELEASE = operator_release.RELEASE
OPERATOR_NAMESPACE = "neuronfleet-system"
NAMESPACE = "demo"
DEFAULT_EXAMPLE = Path("examples/tiny-sim.yaml")
#: How long the service may take to be Ready: the compile pod, then vLLM starting in the serving pod on
#: two busy cores (about 90 s in all).
READY_TIMEOUT = 600.0
#: How long unpacking a new engine build into the node image store takes, to say so before it starts.
UNPACK_TIME = "minutes the first time: it unpacks to 10 GB; seconds when only its top layer changed"
#: The events that tell the story (``kubectl describe``): the operator's, on its two kinds.
STORY_KINDS = frozenset({SERVICE_KIND, ARTIFACT_KIND})
#: A verb the chart forgot shows up as Forbidden in the operator's log (the API server's reason, in our
#: errors and Kopf's), even where the operator carries on. Not a bare 403: log timestamps end in milliseconds.
REFUSED = re.compile(r"forbidden", re.IGNORECASE)


def rbac_refusals(log: str) -> list[str]:
    """The lines of the operator's log where the API server refused it a verb."""
    return [line for line in log.splitlines() if REFUSED.search(line)]


class DemoError(RigError):
    """A step of the demo failed; the message says which and why."""


def checkout() -> Path:
    """The neuronfleet checkout this package is installed from (the chart and examples live there)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "charts" / "neuronfleet" / "Chart.yaml").is_file():
            return parent
    raise DemoError("charts/neuronfleet not found: run the demo from a neuronfleet checkout (`make demo`)")


def load_example(path: Path) -> Obj:
    """The example's NeuronInferenceService, checked to be one on the simulated device."""
    try:
        body = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise DemoError(f"cannot read example {path}: {error}") from None
    if not isinstance(body, dict) or body.get("kind") != SERVICE_KIND:
        raise DemoError(f"{path} is not a NeuronInferenceService")
    if (body.get("spec") or {}).get("device") != "sim":
        raise DemoError(f"{path} is not `device: sim`: the demo's node has no Neuron device to serve it")
    return body


def store_claim(service: Obj) -> str | None:
    """The ReadWriteMany claim of a service's ``pvc://`` artifact store (None for another store)."""
    store = str(service["spec"]["compile"]["artifactStore"])
    return store.removeprefix("pvc://").split("/", 1)[0] if store.startswith("pvc://") else None


def with_image(service: Obj, image: str) -> Obj:
    """The example served by ``image`` (the engine image built here, imported into the node); nothing else changes."""
    body = copy.deepcopy(service)
    body["spec"]["image"] = image
    return body


@dataclass(frozen=True)
class Options:
    """What ``neuronfleet-dev demo`` was asked to do."""

    example: Path
    name: str = "demo"
    exit_when_ready: bool = False


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def ok(result: subprocess.CompletedProcess[str], what: str) -> str:
    """The output of a command that succeeded; a :class:`DemoError` naming ``what`` otherwise."""
    if result.returncode != 0:
        raise DemoError(f"{what}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


class Demo:
    """One run of the demo; every step it takes is undone on the way out."""

    def __init__(self, console: Console, options: Options) -> None:
        self.console = console
        self.options = options
        self.root = checkout()
        self.started = time.monotonic()

    def say(self, message: str) -> None:
        """A timeline line: seconds since the start, then the message."""
        self.console.print(f"[dim]{time.monotonic() - self.started:6.1f}s[/]  {message}", highlight=False)

    @contextlib.contextmanager
    def slow(self, what: str, expected: str) -> Iterator[None]:
        """A step that takes a while: said first with how long it takes, a spinner and a clock while it runs."""
        self.say(f"{what} ({expected}) ...")
        started = time.monotonic()
        columns = (SpinnerColumn(), TextColumn(what), TimeElapsedColumn())
        # Not on a pipe (a test, a log): rich would leave an empty line where the spinner was.
        shown = self.console.is_terminal
        with Progress(*columns, console=self.console, transient=True, disable=not shown) as progress:
            progress.add_task(what, total=None)
            yield
        self.say(f"  done in {time.monotonic() - started:.0f} s")

    def run(self) -> None:
        """Set up, watch the service to Ready, report, then tear down (on Ctrl-C, or at once)."""
        service = load_example(self.options.example)
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        try:
            with contextlib.ExitStack() as teardown:
                self._run(service, teardown)
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _run(self, service: Obj, teardown: contextlib.ExitStack) -> None:
        reaped = reap_orphans()
        if reaped:
            self.say(f"stopped clusters left by dead runs: {', '.join(reaped)}")
        built = {target: dockerfile.build(target, say=self.say) for target in inputs.TARGETS}
        self._store_images(built)
        cluster = self._start_cluster(teardown)
        self._import_images(cluster, built)
        self._install_chart(cluster, built["operator"])
        self._show_operator(cluster, built["operator"])

        workdir = cluster.state.workdir / "demo"
        workdir.mkdir(exist_ok=True)
        name = self._apply(cluster, with_image(service, built["engine"].name), workdir)
        self._watch(cluster, service, name)
        log = ok(operator_release.leader_log(cluster, OPERATOR_NAMESPACE), "operator log")
        refused = rbac_refusals(log)
        if refused:
            raise DemoError(f"the chart's RBAC refused the operator {len(refused)} times; first: {refused[0]}")
        self.say(f"kubectl get nis -n {NAMESPACE} -o wide")
        table = ok(cluster.kubectl("get", "nis", "-n", NAMESPACE, "-o", "wide"), "kubectl get nis")
        self.console.print(table.rstrip(), highlight=False, markup=False, soft_wrap=True)
        curl = self._complete(cluster, service, name)
        self._instructions(cluster, name, curl)
        if self.options.exit_when_ready:
            return
        self.console.print("[bold]Ctrl-C[/] tears it all down.")
        self._follow(cluster, service, name)

    def _start_cluster(self, teardown: contextlib.ExitStack) -> LocalCluster:
        name = self.options.name
        with self.slow(f"starting the local control plane {name!r} with the real node {REAL_NODE}", "about 40 s"):
            cluster = LocalCluster.start(name, fleet=node.fleet_beside(), owner_pid=os.getpid(), real_node=True)
        teardown.callback(self._stop_cluster, cluster)
        nodes = cluster.kubectl("get", "nodes", "--no-headers").stdout.splitlines()
        self.say(
            f"cluster up at {cluster.server}: {REAL_NODE} (kubelet, containerd; a trn2.48xlarge, Neuron taint) "
            f"and {len(nodes) - 1} fake nodes (inf2, CPU)"
        )
        return cluster

    def _stop_cluster(self, cluster: LocalCluster) -> None:
        self.say(f"tearing down: stopping cluster {cluster.name!r} ...")
        cluster.stop()
        self.say("done: every process stopped, every file removed")

    def _store_images(self, built: dict[inputs.Target, dockerfile.BuiltImage]) -> None:
        """Both images unpacked into the node image store, which the node's containerd starts from."""
        store = NodeImageStore.default(NodeTools.locate().directory)
        images = [OciImage.of(built[target]) for target in inputs.TARGETS]
        try:
            missing = store.missing(images)
            if missing:
                names = ", ".join(image.name for image in missing)
                with self.slow(f"unpacking {names} into the node image store", UNPACK_TIME):
                    store.prepare(missing, say=self.say)
            else:
                self.say(f"node image store: both images already unpacked in {store.root}")
        except StoreError as error:
            raise DemoError(str(error)) from None

    def _import_images(self, cluster: LocalCluster, built: dict[inputs.Target, dockerfile.BuiltImage]) -> None:
        """Both images in the node's containerd (there is no registry to pull from): there from its start."""
        real_node = cluster.real_node
        assert real_node is not None
        for target in inputs.TARGETS:
            image = built[target]
            try:
                layers = real_node.import_image(OciImage.of(image))
            except node.NodeError as error:
                raise DemoError(str(error)) from None
            self.say(f"{target} image {image.name} in {REAL_NODE}'s containerd ({layers} layers sent)")

    def _install_chart(self, cluster: LocalCluster, image: dockerfile.BuiltImage) -> None:
        # The operator's namespace enforces the restricted Pod Security Standard: the chart's pod must pass.
        ok(cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE), f"kubectl create namespace {OPERATOR_NAMESPACE}")
        restricted = "pod-security.kubernetes.io/enforce=restricted"
        ok(cluster.kubectl("label", "namespace", OPERATOR_NAMESPACE, restricted), "kubectl label namespace")
        what = (
            f"helm install {RELEASE} charts/neuronfleet --namespace {OPERATOR_NAMESPACE} --wait, its pod on {REAL_NODE}"
        )
        with self.slow(what, "about 30 s"):
            installed = operator_release.install(
                cluster, self.root / "charts" / "neuronfleet", OPERATOR_NAMESPACE, image.name
            )
        ok(installed, "helm install")
        crds = cluster.kubectl("get", "crd", "-o", "name").stdout.split()
        names = [n.rsplit("/", 1)[-1] for n in crds if n.endswith(f".{GROUP}")]
        self.say(f"chart installed: CRDs {', '.join(names)}, ServiceAccount, RBAC, operator Deployment")

    def _show_operator(self, cluster: LocalCluster, image: dockerfile.BuiltImage) -> None:
        """Where the operator runs: the chart's pods, from the image built here, on the real node; which leads."""
        selector = "app.kubernetes.io/name=neuronfleet"
        listed = ok(cluster.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", selector, "-o", "json"), "get pods")
        pods = {p["metadata"]["name"]: p for p in json.loads(listed)["items"]}
        for pod in pods.values():
            running = [s["image"] for s in pod["status"].get("containerStatuses", [])]
            if running != [image.name] or pod["spec"].get("nodeName") != REAL_NODE:
                raise DemoError(f"the operator pod runs {running} on {pod['spec'].get('nodeName')}, not {image.name}")
        try:
            leader = wait_for(
                lambda: operator_release.leader(cluster, OPERATOR_NAMESPACE), timeout=60, interval=0.5, what="a leader"
            )
        except WaitTimeoutError as error:
            raise DemoError(f"no operator pod took the Lease: {error}") from error
        if leader not in pods:
            raise DemoError(f"the Lease names {leader}, not one of the operator pods {sorted(pods)}")
        self.say(
            f"operator pod {OPERATOR_NAMESPACE}/{leader} running on {REAL_NODE} from {image.name}, "
            f"as serviceaccount {OPERATOR_NAMESPACE}/{pods[leader]['spec']['serviceAccountName']} (the chart's RBAC, "
            f"not admin), leading; {len(pods) - 1} more standing by"
        )

    def _apply(self, cluster: LocalCluster, service: Obj, workdir: Path) -> str:
        ok(cluster.kubectl("create", "namespace", NAMESPACE), f"kubectl create namespace {NAMESPACE}")
        manifest = workdir / self.options.example.name
        manifest.write_text(yaml.safe_dump(service, sort_keys=False))
        apply = ("apply", "--server-side", "-n", NAMESPACE, "-f", str(manifest))
        # The server's dry run fills in the CRD's defaults (the artifact store among them) without creating it.
        defaulted = ok(cluster.kubectl(*apply, "--dry-run=server", "-o", "json"), "kubectl apply --dry-run=server")
        claim = store_claim(json.loads(defaulted))
        if claim is not None:
            # A pvc:// store needs its ReadWriteMany claim first; on EKS an admin provisions it (EFS, FSx).
            store = workdir / "artifacts"
            store.mkdir()
            # The compile pod writes as the engine image's user (uid 1000); a hostPath is made root's.
            store.chmod(0o777)
            volume = workdir / "artifact-volume.yaml"
            volume.write_text(yaml.safe_dump_all(artifact_volume(NAMESPACE, claim, str(store))))
            self.say(f"kubectl apply -f {volume.name}  (a ReadWriteMany claim {claim!r} for the artifact store)")
            ok(cluster.kubectl("apply", "-f", str(volume)), f"kubectl apply {volume.name}")
        try:
            shown = self.options.example.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = self.options.example
        self.say(f"kubectl apply --server-side -n {NAMESPACE} -f {shown}  (image: {service['spec']['image']})")
        ok(cluster.kubectl(*apply), "kubectl apply")
        return str(service["metadata"]["name"])

    def _observe(self, api: Api, service: Obj, name: str) -> tuple[Obj | None, Obj | None, list[Obj]]:
        version = str(service["apiVersion"])
        found = api.get(api.path(version, SERVICE_KIND, NAMESPACE, name))
        artifact_name = (((found or {}).get("status") or {}).get("artifact") or {}).get("name")
        artifact = api.get(api.path(version, ARTIFACT_KIND, NAMESPACE, artifact_name)) if artifact_name else None
        events = [
            e
            for e in api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events").get("items", [])
            if (e.get("involvedObject") or {}).get("kind") in STORY_KINDS
        ]
        events.sort(key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "", e["metadata"]["name"]))
        return found, artifact, events

    def _watch(self, cluster: LocalCluster, service: Obj, name: str) -> None:
        """Show the service live until it is Ready; fail on a stage that cannot finish."""
        title = f"{SERVICE_KIND} {NAMESPACE}/{name}"
        seen_events: set[str] = set()
        told: dict[str, str] = {}
        with cluster.admin_api() as api, Live(console=self.console, refresh_per_second=8, transient=True) as live:

            def step() -> list[view.Stage]:
                found, artifact, events = self._observe(api, service, name)
                current = view.stages(found, artifact, datetime.datetime.now(datetime.UTC))
                for event in events:
                    if event["metadata"]["uid"] not in seen_events:
                        seen_events.add(event["metadata"]["uid"])
                        self.say(f"[dim]  event {view.event_line(event)}[/]")
                for stage in current:
                    if stage.state != "waiting" and told.get(stage.name) != stage.state:
                        told[stage.name] = stage.state
                        mark = {"failed": "[red]✗[/]", "done": "[green]✓[/]"}.get(stage.state, "[cyan]…[/]")
                        self.say(f"{mark} [bold]{stage.name}[/]  {stage.detail}")
                live.update(view.render(title, current, [view.event_line(e) for e in events[-5:]]))
                failed = [s for s in current if s.state == "failed"]
                if failed:
                    raise DemoError(f"{failed[0].name}: {failed[0].detail}")
                return current

            try:
                wait_for(
                    step,
                    lambda current: current[-1].state == "done",
                    timeout=READY_TIMEOUT,
                    interval=0.5,
                    what=f"{name} to be Ready",
                    show=view.headline,
                    fatal=(DemoError,),
                )
            except WaitTimeoutError as error:
                raise DemoError(str(error)) from None

    def _complete(self, cluster: LocalCluster, service: Obj, name: str) -> list[str]:
        """One completion through the service's Service from the node's network; the curl that sent it."""
        real_node = cluster.real_node
        assert real_node is not None
        found = json.loads(ok(cluster.kubectl("get", "service", name, "-n", NAMESPACE, "-o", "json"), "get service"))
        url = f"http://{found['spec']['clusterIP']}:{HTTP_PORT}/v1/completions"
        model = completion.served_model(str(service["spec"]["model"]["uri"]))
        curl = completion.curl_argv(real_node.netns, url, completion.completion_request(model))
        self.say(f"{escape(shlex.join(curl))}  (through Service {NAMESPACE}/{name}, from {REAL_NODE}'s network)")
        # kube-proxy writes the Service's rules a moment after the endpoint turns ready: until then nothing answers.
        try:
            sent = wait_for(
                lambda: subprocess.run(
                    curl, capture_output=True, text=True, timeout=completion.CURL_TIMEOUT_S + 10, check=False
                ),
                lambda done: done.returncode != completion.CURL_COULD_NOT_CONNECT,
                timeout=30,
                interval=1,
                what=f"Service {NAMESPACE}/{name} to accept a connection",
                show=lambda done: done.stderr.strip(),
            )
            response = completion.parse_response(ok(sent, "curl"))
            if response.status != 200:
                raise DemoError(f"the Service answered {response.status}: {response.body[:300]}")
            answer = completion.completion_text(response)
        except (completion.ResponseError, WaitTimeoutError) as error:
            raise DemoError(str(error)) from None
        selector = f"kubernetes.io/service-name={name}"
        slices = ok(cluster.kubectl("get", "endpointslices", "-n", NAMESPACE, "-l", selector, "-o", "json"), "slices")
        behind = completion.ready_endpoints(json.loads(slices)["items"])
        pods = " or ".join(f"pod {pod} on {where}" for pod, where in behind)
        artifact = response.headers.get("x-neuronfleet-artifact", "(no X-Neuronfleet-Artifact header)")
        self.say(f"HTTP {response.status}, X-Neuronfleet-Artifact: {artifact}, served by {pods}")
        self.say(escape(f"{completion.PROMPT!r} -> {answer!r}"))
        return curl

    def _instructions(self, cluster: LocalCluster, name: str, curl: list[str]) -> None:
        kubectl = f"kubectl --kubeconfig {cluster.kubeconfig}"
        lines = [
            "",
            f"[bold green]{name} is Ready[/], served by the pod the operator rolled out. Poke at it:",
            f"  export PATH={cluster.state.tools}:$PATH   # the pinned kubectl and helm",
            f"  {kubectl} get neuron -n {NAMESPACE}",
            f"  {kubectl} describe nis {name} -n {NAMESPACE}",
            f"  {kubectl} get pods -A -o wide",
            f"  {kubectl} get lease {RELEASE} -n {OPERATOR_NAMESPACE}   # which operator pod leads",
            f"  {kubectl} logs -l app.kubernetes.io/instance={RELEASE} -n {OPERATOR_NAMESPACE} --prefix -f",
            f"  {kubectl} logs deployment/{name} -n {NAMESPACE}   # the engine",
            f"  helm --kubeconfig {cluster.kubeconfig} status {RELEASE} -n {OPERATOR_NAMESPACE}",
            f"  {escape(shlex.join(curl))}   # through the Service",
            f"  {kubectl} port-forward svc/{name} -n {NAMESPACE} {HTTP_PORT}   # then curl localhost:{HTTP_PORT}",
        ]
        for line in lines:
            self.console.print(line, highlight=False, soft_wrap=True)

    def _follow(self, cluster: LocalCluster, service: Obj, name: str) -> None:
        """Keep the view live (scale it, edit it) until Ctrl-C."""
        title = f"{SERVICE_KIND} {NAMESPACE}/{name} (Ctrl-C to tear down)"
        with cluster.admin_api() as api, Live(console=self.console, refresh_per_second=4, transient=True) as live:
            while True:
                found, artifact, events = self._observe(api, service, name)
                current = view.stages(found, artifact, datetime.datetime.now(datetime.UTC))
                live.update(view.render(title, current, [view.event_line(e) for e in events[-5:]]))
                time.sleep(1)
