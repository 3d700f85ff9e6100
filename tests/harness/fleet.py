"""A ``device: sim`` service on the real node, and what its tests need to drive and watch it under load.

The service is rolled out by the operator running in-cluster from its image (installed by the chart),
its artifacts in an ``s3://`` store: a real S3 server inside the node's network namespace, which compile
pods upload to and serving pods download from. Load goes through the Service's ClusterIP (the open-loop
load tool, from the node's network namespace), and every response is checked: its status, and the
``X-Neuronfleet-Artifact`` header that says which revision answered.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.cluster_fixtures import NodeImage
from harness.engine_server import START_TIME_SCALE
from harness.node_load import LoadResult, NodeLoad
from neuronfleet.contract.model_shapes import served_name
from neuronfleet.contract.names import HTTP_PORT, LABEL_ARTIFACT, REPLICA_HEADER
from neuronfleet.devcluster.addons.s3_server import REGION, S3Server
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.demo import operator_release
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode.node import NODE_IP, RealNode, pinned_here
from neuronfleet.engine.serving.readiness import ARTIFACT_HEADER
from neuronfleet.engine.sim.faults import FAULTS_PATH
from neuronfleet.operator import plan
from neuronfleet.operator.api import API_VERSION, SERVICE_KIND, parse_service_spec
from neuronfleet.operator.plan import RouterImages, envoy

Obj = dict[str, Any]
CHART = Path(__file__).resolve().parents[2] / "charts" / "neuronfleet"
NAME = "fleet"
BUCKET = "neff-store"
KEYS, WRONG_KEYS = "neff-keys", "neff-keys-revoked"
#: Requests per second through the Service, and the tokens each asks for (about a second on two cores).
RATE, MAX_TOKENS = 3.0, 24
#: Tokens of each completion in the drain test: with the Llama 3.1 8B shape on trn2.48xlarge (about 31 ms
#: a token on the simulated clock), about 8 s each, longer than the preStop sleep (5 s) with room to spare.
DRAIN_TOKENS = 240
#: A model the simulated device runs as Llama 3.1 8B: slow enough on its clock for generations that outlive a
#: preStop sleep within the services' max_model_len (256).
LLAMA_8B_MODEL = "hf://neuronfleet/llama-3.1-8b"
#: How long the load goes on once a rollout is over: every answer then must come from the new revision.
AFTER_S = 6.0
#: vLLM's gauge of the requests an engine runs, as a labelled sample line starts.
RUNNING_GAUGE_PREFIX = "vllm:num_requests_running{"
#: vLLM's gauge of the requests an engine holds waiting, as a labelled sample line starts.
WAITING_GAUGE_PREFIX = "vllm:num_requests_waiting{"
#: Both gauges: the requests an engine holds.
GAUGES = (RUNNING_GAUGE_PREFIX, WAITING_GAUGE_PREFIX)
#: vLLM's counter of prompt tokens prefilled: it rises when an engine starts a request.
PROMPT_TOKENS_PREFIX = "vllm:prompt_tokens_total{"
#: The model every service serves unless a test asks for another (the tiny simulated shape).
TINY_MODEL = "hf://neuronfleet/tiny"
#: Response headers each load records besides the artifact: the replica that answered, and the drain's signs.
RECORDED_HEADERS = (REPLICA_HEADER, "connection", "retry-after")
#: A pod's start on two shared cores (vLLM on CPU), with room for two at once.
POD_TIMEOUT_S = 600
#: The fleet's node cache: room for a few of its artifacts (a simulated 8B's are graphs alone, under 1 MB).
NODE_CACHE_SIZE = "64Mi"


def service_manifest(
    image: str,
    endpoint: str,
    buckets: list[int],
    *,
    secret: str = KEYS,
    autoscaling: Obj | None = None,
    max_num_seqs: int = 4,
    model: str = TINY_MODEL,
    routing: Obj | None = None,
    engine: Obj | None = None,
    replicas: int = 2,
    lora: Obj | None = None,
    node_cache: Path | None = None,
) -> Obj:
    """The service of ``model``, with ``buckets`` as its prefill buckets (a new compiled identity per bucket set).

    ``replicas``, or ``autoscaling`` in their place; ``routing`` is its ``spec.routing``, ``lora`` its
    ``spec.lora``; ``engine`` overrides engine fields; ``node_cache``, a directory on the node, the replicas'
    shared copy of the artifacts.
    """
    s3: Obj = {"endpointUrl": endpoint, "region": REGION, "credentialsSecret": secret}
    if node_cache is not None:
        s3["nodeCache"] = {"hostPath": str(node_cache), "sizeLimit": NODE_CACHE_SIZE}
    scale: Obj = {"replicas": replicas} if autoscaling is None else {"autoscaling": autoscaling}
    if routing is not None:
        scale["routing"] = routing
    if lora is not None:
        scale["lora"] = lora
    return {
        "apiVersion": API_VERSION,
        "kind": SERVICE_KIND.kind,
        "metadata": {"name": NAME},
        "spec": {
            "model": {"uri": model, "revision": "main"},
            "instanceType": "trn2.48xlarge",
            "device": "sim",
            "image": image,
            **scale,
            "engine": {
                "max_num_seqs": max_num_seqs,
                "max_model_len": 256,
                "max_num_batched_tokens": 256,
                "num_batched_tokens_buckets": buckets,
                **(engine or {}),
            },
            "resources": {"cpu": "250m", "memory": "4Gi"},
            **pinned_here(),
            "compile": {
                "artifactStore": f"s3://{BUCKET}/fleet",
                "s3": s3,
                "backoffLimit": 0,
                "resources": {"cpu": "500m", "memory": "2Gi"},
                **pinned_here(),
            },
            "rollout": {"startupTimeoutSeconds": POD_TIMEOUT_S},
            "drain": {"preStopSeconds": 5, "drainTimeoutSeconds": 30},
        },
    }


def identity_hash(manifest: Obj) -> str:
    """The artifact hash the operator will compute for ``manifest``."""
    return parse_service_spec(manifest["spec"]).identity().hash()


def ready_condition(body: Obj) -> Obj:
    """The service's Ready condition (empty while there is none)."""
    return next((c for c in body.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})


@dataclass
class Fleet:
    """The service under test, the cluster it runs in and what reaches it."""

    cluster: LocalCluster
    node: RealNode
    namespace: str
    operator_namespace: str
    image: str
    s3: S3Server
    workdir: Path
    manifest: Obj
    #: The first replicas' ``/metrics``, read once the service was first Ready.
    first_metrics: list[str] | None = None

    def kubectl(self, *args: str) -> str:
        """kubectl in the service's namespace; its output (a failure fails the test)."""
        done = self.cluster.kubectl("--namespace", self.namespace, *args)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def get(self, kind: str, name: str = "", *selector: str) -> Obj:
        """An object (or a list) as JSON."""
        return dict(json.loads(self.kubectl("get", kind, *([name] if name else []), *selector, "-o", "json")))

    def apply(self, manifest: Obj) -> float:
        """Apply ``manifest`` as the service; when (Unix seconds)."""
        path = self.workdir / f"service-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(manifest))
        applied_at = time.time()
        self.kubectl("apply", "--server-side", "-f", str(path))
        self.manifest = manifest
        return applied_at

    def with_buckets(self, buckets: list[int], secret: str | None = None) -> Obj:
        """The current manifest with other prefill buckets (and, given one, another credentials Secret)."""
        manifest = copy.deepcopy(self.manifest)
        manifest["spec"]["engine"]["num_batched_tokens_buckets"] = buckets
        if secret is not None:
            manifest["spec"]["compile"]["s3"]["credentialsSecret"] = secret
        return manifest

    def status(self) -> Obj:
        """The service's status."""
        return dict(self.get("nis", NAME).get("status") or {})

    def pods(self) -> list[Obj]:
        """The serving pods, the terminating ones included."""
        selector = ",".join(f"{k}={v}" for k, v in plan.service_labels(NAME).items())
        items: list[Obj] = self.get("pods", "", f"--selector={selector}")["items"]
        return items

    def wait(self, check: Callable[[], Any], what: str, timeout: float = POD_TIMEOUT_S) -> Any:
        """Poll ``check`` until it returns something true; show the service's status and pods if it never does."""
        return wait_for(
            check,
            timeout=timeout,
            interval=2,
            what=what,
            show=lambda _: (
                self.status(),
                [(p["metadata"]["name"], p.get("status", {}).get("phase")) for p in self.pods()],
            ),
        )

    def engine_metrics(self, pod: Obj) -> str:
        """The replica's ``/metrics``, read from the node."""
        url = f"http://{pod['status']['podIP']}:{HTTP_PORT}/metrics"
        script = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=5).read().decode())"
        done = self.node.in_netns(["python3", "-I", "-c", script])
        assert done.returncode == 0, done.stderr
        return done.stdout

    def rolled_out_to(self, artifact_hash: str, replicas: int = 2) -> bool:
        """Ready, every serving pod (terminating ones too) of ``artifact_hash`` and Ready, ``replicas`` of them."""
        status = self.status()
        pods = self.pods()
        return (
            status.get("phase") == "Ready"
            and status.get("currentRevision") == artifact_hash
            and len(pods) == replicas
            and all(p["metadata"]["labels"][LABEL_ARTIFACT] == artifact_hash for p in pods)
            and all(pod_ready(p) and not p["metadata"].get("deletionTimestamp") for p in pods)
        )

    def load(
        self,
        name: str,
        *,
        rate: float = RATE,
        max_tokens: int = MAX_TOKENS,
        through: str = NAME,
        prompt: str | None = None,
        distinct_prompts: bool = False,
        keep_alive: bool = True,
        model: str | None = None,
        poisson_seed: int | None = None,
    ) -> NodeLoad:
        """Completions through a Service (the engines', or ``through`` another: the router's) from the node's
        network namespace, until stopped. Each answer records the replica that served it, where Envoy says.
        ``distinct_prompts`` marks each prompt, so the engines' prefix cache never serves one unprefilled;
        without ``keep_alive`` each request opens its own connection, which kube-proxy sends to any replica, and each
        answer's ``server`` names the pod IP its connection reached (refused and cut-off ones too).
        ``model``: another model name than the service's (a LoRA adapter's). ``poisson_seed``: Poisson arrivals
        from that seed, not one every 1/rate s."""
        cluster_ip = self.get("service", through)["spec"]["clusterIP"]
        workdir = self.workdir / f"load-{name}"
        workdir.mkdir()
        url = f"http://{cluster_ip}:{HTTP_PORT}/v1/completions"
        model = model or served_name(self.manifest["spec"]["model"]["uri"])
        return NodeLoad(
            self.node.netns,
            url,
            workdir,
            rate=rate,
            max_tokens=max_tokens,
            header=ARTIFACT_HEADER,
            model=model,
            record=(*RECORDED_HEADERS, envoy.UPSTREAM_HEADER, envoy.ROUTER_HEADER, envoy.TRACK_HEADER),
            prompt=prompt,
            distinct_prompts=distinct_prompts,
            keep_alive=keep_alive,
            poisson_seed=poisson_seed,
            # A connection per request: each one's endpoint is known from the node's connection tracking.
            track=None if keep_alive else (cluster_ip, HTTP_PORT),
        )

    def routed(self) -> bool:
        """Whether the service's router (picker and Envoy) is Ready, as its Routing condition says."""
        found = [c for c in self.status().get("conditions", []) if c["type"] == "Routing"]
        return bool(found) and found[0]["reason"] == "PickerReady"

    def next_request_started(self, *pods: Obj, timeout: float = 60) -> Obj:
        """Return the first of the pods whose engine starts a request (its prompt-token counter rises), as soon
        as one does."""
        names = [pod["metadata"]["name"] for pod in pods]
        script = watching(pods, timeout) + "print(started)\n"
        started = self.node.in_netns(["python3", "-I", "-c", script], timeout=timeout + 30)
        assert started.returncode == 0, f"no request started on {names}: {started.stderr}"
        return pods[int(started.stdout.split()[-1])]

    def in_service(self, pod_name: str, service: str = NAME) -> bool:
        """Whether the Service (the engines', or another) sends to the pod: a ready endpoint of its
        EndpointSlices names it."""
        slices = self.get("endpointslices", "", f"--selector=kubernetes.io/service-name={service}")["items"]
        return any(
            (endpoint.get("targetRef") or {}).get("name") == pod_name and endpoint["conditions"].get("ready")
            for found in slices
            for endpoint in found.get("endpoints") or []
        )

    def complete_on(self, pod: Obj, max_tokens: int = MAX_TOKENS, port: int = HTTP_PORT) -> Obj:
        """One completion sent straight to the pod (not through the Service), from the node; its body."""
        url = f"http://{pod['status']['podIP']}:{port}/v1/completions"
        model = served_name(self.manifest["spec"]["model"]["uri"])
        body = json.dumps({"model": model, "prompt": "The fleet", "max_tokens": max_tokens}).encode()
        script = (
            "import urllib.request\n"
            "headers = {'Content-Type': 'application/json'}\n"
            f"request = urllib.request.Request({url!r}, data={body!r}, headers=headers)\n"
            "print(urllib.request.urlopen(request, timeout=60).read().decode())\n"
        )
        answered = self.node.in_netns(["python3", "-I", "-c", script], timeout=90)
        assert answered.returncode == 0, answered.stderr
        return dict(json.loads(answered.stdout))

    def container_pid(self, pod: Obj, container: str | None = None) -> int:
        """The node's PID of the main process of the pod's container (its first by default), from the node's
        containerd."""
        statuses = pod["status"]["containerStatuses"]
        (status,) = [s for s in statuses if s["name"] == container] if container else statuses[:1]
        container_id = status["containerID"].removeprefix("containerd://")
        return int(json.loads(self.node.crictl("inspect", container_id))["info"]["pid"])

    def kill_engine(self, pod: Obj, timeout: float = 60) -> tuple[float, float]:
        """SIGKILL the pod's engine (its container's main process) as a request starts on it.

        From one process on the node, a moment apart: the engine's metrics show a request started, then
        the kill. Returns when it was killed (Unix seconds), and how many requests the engine was running
        or holding waiting in those last metrics (vLLM's gauges).
        """
        pid = self.container_pid(pod)
        return self._as_a_request_starts(pod, f"import os, signal\nos.kill({pid}, signal.SIGKILL)\n", timeout)

    def inject_fault(self, pod: Obj, fault: Obj, timeout: float = 60) -> tuple[float, float]:
        """Post ``fault`` to the pod's simulated device as a request starts on it; as :meth:`kill_engine` returns."""
        url = f"http://{pod['status']['podIP']}:{HTTP_PORT}{FAULTS_PATH}"
        post = (
            f"request = urllib.request.Request({url!r}, data={json.dumps(fault).encode()!r}, "
            "headers={'Content-Type': 'application/json'})\n"
            "urllib.request.urlopen(request, timeout=30).read()\n"
        )
        return self._as_a_request_starts(pod, post, timeout)

    def _as_a_request_starts(self, pod: Obj, action: str, timeout: float) -> tuple[float, float]:
        """Run ``action`` (Python) on the node once a request starts on the pod: when, and what its engine held."""
        script = watching([pod], timeout) + action + f"print(time.time(), total(text, {GAUGES!r}))\n"
        done = self.node.in_netns(["python3", "-I", "-c", script], timeout=timeout + 30)
        assert done.returncode == 0, done.stderr
        acted_at, held = done.stdout.split()
        return float(acted_at), float(held)

    def compile_jobs(self, artifact_hash: str) -> list[Obj]:
        """The compile Jobs of one artifact."""
        items: list[Obj] = self.get("jobs", "", f"--selector={LABEL_ARTIFACT}={artifact_hash}")["items"]
        return items

    def operator_pods(self) -> list[Obj]:
        """The operator's running pods (not being deleted): the leader and its standby."""
        found = self.cluster.kubectl(
            "get",
            "pods",
            "--namespace",
            self.operator_namespace,
            "-o",
            "json",
            "--selector",
            f"app.kubernetes.io/instance={operator_release.RELEASE}",
        )
        assert found.returncode == 0, found.stderr
        return [p for p in json.loads(found.stdout)["items"] if not p["metadata"].get("deletionTimestamp")]

    def operator_leader(self) -> str:
        """The operator pod that holds the Lease (``""`` while none does)."""
        return operator_release.leader(self.cluster, self.operator_namespace)


def watching(pods: Sequence[Obj], timeout: float) -> str:
    """A script, run on the node, that polls the pods' engine metrics until a request starts on one of them.

    It ends with ``started``, that pod's index, ``text``, the metrics in which its prompt-token counter rose,
    and ``total``.
    """
    urls = [f"http://{pod['status']['podIP']}:{HTTP_PORT}/metrics" for pod in pods]
    return (
        "import time, urllib.request\n"
        "def total(text, prefixes):\n"
        "    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefixes))\n"
        "scrape = lambda url: urllib.request.urlopen(url, timeout=5).read().decode()\n"
        f"urls, deadline, started = {urls!r}, time.monotonic() + {timeout}, None\n"
        f"first = [total(scrape(url), {PROMPT_TOKENS_PREFIX!r}) for url in urls]\n"
        "while started is None:\n"
        "    assert time.monotonic() < deadline, 'no request started'\n"
        "    time.sleep(0.05)\n"
        "    for index, url in enumerate(urls):\n"
        "        text = scrape(url)\n"
        f"        if total(text, {PROMPT_TOKENS_PREFIX!r}) > first[index]:\n"
        "            started = index\n"
        "            break\n"
    )


def pod_ready(pod: Obj) -> bool:
    """Whether the pod's Ready condition is True."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def report(test: str, result: LoadResult, **moments: float) -> None:
    """The figures, for the log and the issue's note; any failures, and the test's moments, from the load's start."""
    start = result.answers[0].sent_at if result.answers else 0.0
    print(f"==> {test}: {result.line()}", flush=True)
    print("    moments: " + ", ".join(f"{name} {at - start:.1f} s" for name, at in moments.items()), flush=True)
    for answer in [a for a in result.answers if not a.ok][:20]:
        print(
            f"    failed: sent {answer.sent_at - start:.1f} s, {answer.result} after {answer.latency_s:.2f} s",
            flush=True,
        )


def create_secret(cluster: LocalCluster, namespace: str, name: str, access_key: str, secret_key: str) -> None:
    """An S3 credentials Secret, sent in the request body (never on a command line)."""
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key},
    }
    with cluster.admin_api() as api:
        api.request("POST", f"/api/v1/namespaces/{namespace}/secrets", body)


@contextlib.contextmanager
def started(
    real_cluster: LocalCluster,
    real_node: RealNode,
    node_image: NodeImage,
    workdir: Path,
    *,
    prometheus: str | None = None,
    autoscaling: Obj | None = None,
    max_num_seqs: int = 4,
    model: str = TINY_MODEL,
    router_images: RouterImages | None = None,
    engine_config: Obj | None = None,
    replicas: int = 2,
    lora: Obj | None = None,
) -> Iterator[Fleet]:
    """The service of ``model`` Ready (``replicas``, or ``autoscaling``'s minimum), rolled out by the operator.

    A ``prometheus`` URL installs the operator with autoscaling on, its ScaledObjects querying it.
    ``router_images`` gives the service ``spec.routing`` (one router pod) and the operator those images, and
    waits for the router too. ``engine_config`` overrides fields of the service's engine configuration; ``lora``
    is its ``spec.lora``.
    """
    engine, operator = node_image("engine"), node_image("operator")
    s3 = S3Server.start(workdir / "s3", host=NODE_IP, netns=real_node.netns)
    s3.create_bucket(BUCKET)
    suffix = uuid.uuid4().hex[:6]
    namespace, operator_namespace = f"fleet-{suffix}", f"fleet-op-{suffix}"
    for name in (namespace, operator_namespace):
        assert real_cluster.kubectl("create", "namespace", name).returncode == 0
    assert (
        real_cluster.kubectl(
            "label", "namespace", operator_namespace, "pod-security.kubernetes.io/enforce=restricted"
        ).returncode
        == 0
    )
    try:
        installed = operator_release.install(
            real_cluster,
            CHART,
            operator_namespace,
            operator.name,
            watch_namespaces=[namespace],
            resync_seconds=5,
            prometheus=prometheus,
            # The fleet's replicas are 8B-shaped: at the whole of a Neuron replica's start, each would take 36 s.
            values=["--set", f"simulatedStartTimeScale={START_TIME_SCALE}"]
            + (
                []
                if router_images is None
                else [
                    "--set",
                    f"routing.pickerImage={router_images.picker}",
                    "--set",
                    f"routing.envoyImage={router_images.envoy}",
                    "--set",
                    f"routing.pickerInFlightTokens={str(router_images.picker_inflight_tokens).lower()}",
                ]
            ),
        )
        assert installed.returncode == 0, installed.stderr
        wait_for(
            lambda: real_cluster.kubectl("get", "serviceaccount", "default", "--namespace", namespace).returncode == 0,
            timeout=30,
            what=f"ServiceAccount default in {namespace}",
        )
        keys = s3.credentials
        create_secret(real_cluster, namespace, KEYS, keys.access_key, keys.secret_key)
        create_secret(real_cluster, namespace, WRONG_KEYS, keys.access_key, f"revoked-{keys.secret_key[::-1]}")
        # The node's directory for the replicas' shared copies, writable by the engine's user, as a node's
        # bootstrap would make it.
        node_cache = real_cluster.state.workdir / REAL_NODE / f"node-cache-{suffix}"
        node_cache.mkdir()
        node_cache.chmod(0o777)
        manifest = service_manifest(
            engine.name,
            s3.endpoint,
            [128, 256],
            node_cache=node_cache,
            autoscaling=autoscaling,
            max_num_seqs=max_num_seqs,
            model=model,
            routing=None if router_images is None else {"replicas": 1, **pinned_here()},
            engine=engine_config,
            replicas=replicas,
            lora=lora,
        )
        service = Fleet(real_cluster, real_node, namespace, operator_namespace, engine.name, s3, workdir, manifest)
        service.apply(manifest)
        first = identity_hash(manifest)
        ready = replicas if autoscaling is None else int(autoscaling.get("minReplicas", 1))
        service.wait(
            lambda: service.rolled_out_to(first, ready),
            f"{NAME} Ready on artifact {first}",
            timeout=2 * POD_TIMEOUT_S,
        )
        service.first_metrics = [service.engine_metrics(pod) for pod in service.pods()]
        if router_images is not None:
            service.wait(service.routed, f"{NAME}'s Endpoint Picker and Envoy Ready")
        yield service
    finally:
        log = operator_release.leader_log(real_cluster, operator_namespace, tail=40)
        print(f"--- operator log ---\n{log.stdout}{log.stderr}")
        real_cluster.helm("uninstall", operator_release.RELEASE, "--namespace", operator_namespace)
        for name in (namespace, operator_namespace):
            real_cluster.kubectl("delete", "namespace", name, "--wait=false")
        s3.stop()
