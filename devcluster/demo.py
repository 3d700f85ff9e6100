"""``neuronfleet-dev demo``: the path a user takes, end to end, on the local control plane.

Starts a cluster with fake trn2/inf2/CPU nodes, installs the Helm chart (CRDs, ServiceAccount, RBAC,
the operator's Deployment), runs the operator with the chart's ServiceAccount token (a local process:
no image runs on KWOK's nodes, so the chart's pod is a stand-in), applies an example service and shows
it live until Ready. Then it prints how to poke at it and waits for Ctrl-C (or exits at once with
``--exit-when-ready``); either way it tears everything down.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from rich.console import Console
from rich.live import Live

from neuronfleet.devcluster import demo_view, sim_engine
from neuronfleet.devcluster.api import Api
from neuronfleet.devcluster.cluster import LocalCluster, reap_orphans
from neuronfleet.devcluster.credentials import service_account_kubeconfig
from neuronfleet.devcluster.kwok import COMPLETE_AFTER_ANNOTATION, READY_AFTER_ANNOTATION
from neuronfleet.devcluster.operator_process import OperatorProcess
from neuronfleet.devcluster.storage import artifact_volume
from neuronfleet.devcluster.waiting import WaitTimeoutError, wait_for

Obj = dict[str, Any]

RELEASE = "neuronfleet"
OPERATOR_NAMESPACE = "neuronfleet-system"
NAMESPACE = "demo"
DEFAULT_EXAMPLE = Path("examples/llama-3.1-8b-inf2.yaml")
#: How long the service may take to be Ready (it takes about 20 s).
READY_TIMEOUT = 180.0
#: The fake kubelet's pace, so each stage stays on screen long enough to see (KWOK annotations).
COMPILE_PACE = {COMPLETE_AFTER_ANNOTATION: "8s"}
SERVING_PACE = {READY_AFTER_ANNOTATION: "3s"}
SERVICE_KIND, ARTIFACT_KIND = "NeuronInferenceService", "NeuronCompiledArtifact"
#: The events that tell the story (``kubectl describe``): the operator's, on its two kinds.
STORY_KINDS = frozenset({SERVICE_KIND, ARTIFACT_KIND})


class DemoError(RuntimeError):
    """A step of the demo failed; the message says which and why."""


def checkout() -> Path:
    """The neuronfleet checkout this package is installed from (the chart and examples live there)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "charts" / "neuronfleet" / "Chart.yaml").is_file():
            return parent
    raise DemoError("charts/neuronfleet not found: run the demo from a neuronfleet checkout (`make demo`)")


def load_example(path: Path) -> Obj:
    """The example's NeuronInferenceService, checked to be one."""
    try:
        body = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise DemoError(f"cannot read example {path}: {error}") from None
    if not isinstance(body, dict) or body.get("kind") != SERVICE_KIND:
        raise DemoError(f"{path} is not a NeuronInferenceService")
    return body


def store_claim(service: Obj) -> str | None:
    """The ReadWriteMany claim of a service's ``pvc://`` artifact store (None for another store)."""
    store = str(service["spec"]["compile"]["artifactStore"])
    return store.removeprefix("pvc://").split("/", 1)[0] if store.startswith("pvc://") else None


def paced(service: Obj) -> Obj:
    """The example with the fake kubelet's pace added (pod annotations; nothing else changes)."""
    body = copy.deepcopy(service)
    spec = body["spec"]
    spec["podAnnotations"] = {**spec.get("podAnnotations", {}), **SERVING_PACE}
    spec.setdefault("compile", {})
    spec["compile"]["podAnnotations"] = {**spec["compile"].get("podAnnotations", {}), **COMPILE_PACE}
    return body


@dataclass(frozen=True)
class Options:
    """What ``neuronfleet-dev demo`` was asked to do."""

    example: Path
    name: str = "demo"
    exit_when_ready: bool = False
    engine: bool = True
    pace: bool = True


def _terminate_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


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
        self.say(f"starting the local control plane {self.options.name!r} (etcd, API server, KWOK nodes) ...")
        cluster = LocalCluster.start(self.options.name, owner_pid=os.getpid())
        teardown.callback(self._stop_cluster, cluster)
        nodes = cluster.kubectl("get", "nodes", "--no-headers")
        self.say(f"cluster up at {cluster.server}: {len(nodes.stdout.splitlines())} fake nodes (trn2, inf2, CPU)")

        self._install_chart(cluster)
        workdir = cluster.state.workdir / "demo"
        workdir.mkdir(exist_ok=True)
        kubeconfig = service_account_kubeconfig(cluster, OPERATOR_NAMESPACE, RELEASE, workdir / "operator.kubeconfig")
        operator = OperatorProcess(kubeconfig, [], workdir, resync_seconds=30)
        operator.start(wait_for)
        teardown.callback(operator.stop)
        self.say(
            f"operator running as serviceaccount {OPERATOR_NAMESPACE}/{RELEASE} (the chart's RBAC, not admin); "
            f"log {operator.log}"
        )

        name = self._apply(cluster, service, workdir)
        self._watch(cluster, service, name)
        refused = [line for line in operator.log.read_text(errors="replace").splitlines() if "Forbidden" in line]
        if refused:
            raise DemoError(f"the chart's RBAC refused the operator {len(refused)} times; first: {refused[0]}")
        engine = self._start_engine(cluster, service, teardown) if self.options.engine else None
        self._instructions(cluster, name, operator.log, engine)
        if self.options.exit_when_ready:
            return
        self.console.print("[bold]Ctrl-C[/] tears it all down.")
        self._follow(cluster, service, name)

    def _stop_cluster(self, cluster: LocalCluster) -> None:
        self.say(f"tearing down: stopping cluster {cluster.name!r} ...")
        cluster.stop()
        self.say("done: every process stopped, every file removed")

    def _install_chart(self, cluster: LocalCluster) -> None:
        chart = self.root / "charts" / "neuronfleet"
        # The operator's namespace enforces the restricted Pod Security Standard: the chart's pod must pass.
        for args in (
            ("create", "namespace", OPERATOR_NAMESPACE),
            ("label", "namespace", OPERATOR_NAMESPACE, "pod-security.kubernetes.io/enforce=restricted"),
        ):
            done = cluster.kubectl(*args)
            if done.returncode != 0:
                raise DemoError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        self.say(f"helm install {RELEASE} charts/neuronfleet --namespace {OPERATOR_NAMESPACE} --wait ...")
        installed = cluster.helm(
            "install", RELEASE, str(chart), "--namespace", OPERATOR_NAMESPACE, "--wait", "--timeout", "120s"
        )
        if installed.returncode != 0:
            raise DemoError(f"helm install failed: {installed.stderr.strip()}")
        crds = cluster.kubectl("get", "crd", "-o", "name").stdout.split()
        names = [n.rsplit("/", 1)[-1] for n in crds if n.endswith(".neuronfleet.io")]
        self.say(f"chart installed: CRDs {', '.join(names)}, ServiceAccount, RBAC, operator Deployment")

    def _apply(self, cluster: LocalCluster, service: Obj, workdir: Path) -> str:
        done = cluster.kubectl("create", "namespace", NAMESPACE)
        if done.returncode != 0:
            raise DemoError(f"kubectl create namespace {NAMESPACE}: {done.stderr.strip()}")
        manifest = workdir / self.options.example.name
        manifest.write_text(yaml.safe_dump(paced(service) if self.options.pace else service, sort_keys=False))
        apply = ("apply", "--server-side", "-n", NAMESPACE, "-f", str(manifest))
        # The server's dry run fills in the CRD's defaults (the artifact store among them) without creating it.
        defaulted = cluster.kubectl(*apply, "--dry-run=server", "-o", "json")
        if defaulted.returncode != 0:
            raise DemoError(f"kubectl apply --dry-run=server: {defaulted.stderr.strip()}")
        claim = store_claim(json.loads(defaulted.stdout))
        if claim is not None:
            # A pvc:// store needs its ReadWriteMany claim first; on EKS an admin provisions it (EFS, FSx).
            volume = workdir / "artifact-volume.yaml"
            store = workdir / "artifacts"
            volume.write_text(yaml.safe_dump_all(artifact_volume(NAMESPACE, claim, str(store))))
            self.say(f"kubectl apply -f {volume.name}  (a ReadWriteMany claim {claim!r} for the artifact store)")
            bound = cluster.kubectl("apply", "-f", str(volume))
            if bound.returncode != 0:
                raise DemoError(f"kubectl apply {volume.name}: {bound.stderr.strip()}")
        try:
            shown = self.options.example.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = self.options.example
        pace = "  (paced for the fake kubelet)" if self.options.pace else ""
        self.say(f"kubectl apply --server-side -n {NAMESPACE} -f {shown}{pace}")
        applied = cluster.kubectl(*apply)
        if applied.returncode != 0:
            raise DemoError(f"kubectl apply: {applied.stderr.strip()}")
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

            def step() -> list[demo_view.Stage]:
                found, artifact, events = self._observe(api, service, name)
                current = demo_view.stages(found, artifact, datetime.datetime.now(datetime.UTC))
                for event in events:
                    if event["metadata"]["uid"] not in seen_events:
                        seen_events.add(event["metadata"]["uid"])
                        self.say(f"[dim]  event {demo_view.event_line(event)}[/]")
                for stage in current:
                    if stage.state != "waiting" and told.get(stage.name) != stage.state:
                        told[stage.name] = stage.state
                        mark = {"failed": "[red]✗[/]", "done": "[green]✓[/]"}.get(stage.state, "[cyan]…[/]")
                        self.say(f"{mark} [bold]{stage.name}[/]  {stage.detail}")
                live.update(demo_view.render(title, current, [demo_view.event_line(e) for e in events[-5:]]))
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
                    show=demo_view.headline,
                    fatal=(DemoError,),
                )
            except WaitTimeoutError as error:
                raise DemoError(str(error)) from None

    def _start_engine(
        self, cluster: LocalCluster, service: Obj, teardown: contextlib.ExitStack
    ) -> sim_engine.SimEngine:
        """One engine on the simulated device for the service's model, asked for a completion."""
        engine = sim_engine.SimEngine(cluster.state.workdir / "demo", service)
        self.say(f"starting one engine on the simulated Neuron device for {engine.served_name} (vLLM) ...")
        teardown.callback(engine.stop)
        try:
            engine.start()
            prompt = "The capital of France is"
            answer = engine.complete(prompt)
        except sim_engine.EngineError as error:
            raise DemoError(str(error)) from None
        self.say(f"engine up at {engine.url}; {prompt!r} -> {answer!r}")
        return engine

    def _instructions(
        self, cluster: LocalCluster, name: str, operator_log: Path, engine: sim_engine.SimEngine | None
    ) -> None:
        kubectl = f"kubectl --kubeconfig {cluster.kubeconfig}"
        lines = [
            "",
            f"[bold green]{name} is Ready.[/] Poke at it from another terminal:",
            f"  export PATH={cluster.state.tools}:$PATH   # the pinned kubectl and helm",
            f"  {kubectl} get neuron -n {NAMESPACE}",
            f"  {kubectl} get nis -n {NAMESPACE} -o wide",
            f"  {kubectl} describe nis {name} -n {NAMESPACE}",
            f"  {kubectl} get pods -n {NAMESPACE} -o wide",
            f"  {kubectl} scale nis {name} -n {NAMESPACE} --replicas 1",
            f"  helm --kubeconfig {cluster.kubeconfig} status {RELEASE} -n {OPERATOR_NAMESPACE}",
            f"  tail -f {operator_log}   # the operator",
        ]
        if engine is not None:
            lines.append(f"  {engine.curl('The capital of France is')}")
        for line in lines:
            self.console.print(line, highlight=False, soft_wrap=True)

    def _follow(self, cluster: LocalCluster, service: Obj, name: str) -> None:
        """Keep the view live (scale it, edit it) until Ctrl-C."""
        title = f"{SERVICE_KIND} {NAMESPACE}/{name} (Ctrl-C to tear down)"
        with cluster.admin_api() as api, Live(console=self.console, refresh_per_second=4, transient=True) as live:
            while True:
                found, artifact, events = self._observe(api, service, name)
                current = demo_view.stages(found, artifact, datetime.datetime.now(datetime.UTC))
                live.update(demo_view.render(title, current, [demo_view.event_line(e) for e in events[-5:]]))
                time.sleep(1)
