"""The engine image on the real node, in the operator's own pod template: probes, Service, completion, drain,
and its devices claimed through DRA, prepared by the node's kubelet and handed to its container.

The Deployment, its ConfigMap, its Neuron ResourceClaimTemplate and its Service are what
:mod:`neuronfleet.operator.plan` renders for a ``device: sim`` trn2.48xlarge service with ``placement.devices:
dra`` placed on the real node, changed in one way only: the engine is given no artifact to load (it compiles its
simulated graphs at start), since nothing was compiled here. The node's DRA kubelet plugin (``tools/dra``)
publishes its simulated Neuron devices under the Neuron driver's name; the test adds the driver's DeviceClass.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from harness.cluster_fixtures import NodeImage

from neuronfleet.contract import dra
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.names import HTTP_PORT
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane import devices
from neuronfleet.devcluster.controlplane.api import Api
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode.node import RealNode, pinned_here
from neuronfleet.operator import api as nis_api
from neuronfleet.operator import plan

Obj = dict[str, Any]
NAMESPACE = "default"
NAME = "tiny"
MAX_TOKENS = 7
SPEC = {
    "model": {"uri": "hf://neuronfleet/tiny", "revision": "main"},
    "instanceType": "trn2.48xlarge",
    "device": "sim",
    "resources": {"cpu": "250m", "memory": "4Gi"},
    **pinned_here(),
    "engine": {"max_num_seqs": 4, "max_model_len": 256, "max_num_batched_tokens": 256, "tensor_parallel_size": 4},
    "compile": {"artifactStore": "s3://unused/neff"},
    "drain": {"preStopSeconds": 2, "drainTimeoutSeconds": 5},
    # One device (TP 4 at LNC=2), claimed from the node's DRA plugin.
    "placement": {"devices": "dra"},
}
#: Only the serve command's artifact pins go: the flags and their values.
ARTIFACT_FLAGS = ("--artifact-store", "--artifact-hash")


def unpinned(args: list[str]) -> list[str]:
    """``serve`` arguments with the artifact pins (the flags and their values) dropped."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in ARTIFACT_FLAGS:
            skip = True
        else:
            kept.append(arg)
    return kept


def rendered(image: str) -> tuple[Obj, Obj, Obj, Obj]:
    """The operator's ConfigMap, claim template, Deployment and Service for :data:`SPEC`, without owner references."""
    spec = nis_api.parse_service_spec({**SPEC, "image": image})
    owner = plan.Owner(nis_api.API_VERSION, "NeuronInferenceService", NAME, "not-applied")
    served = plan.ServedArtifact("unused", "0" * 16, spec.compile)
    configmap, claim, deployment, service, _ = plan.serving_objects(owner, NAMESPACE, spec, served)
    for obj in (configmap, claim, deployment, service):
        # No NeuronInferenceService exists: the garbage collector would delete what it owns.
        obj["metadata"].pop("ownerReferences")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["args"] = unpinned(container["args"])
    return configmap, claim, deployment, service


def pods(api: Api) -> list[Obj]:
    """The serving pods not being deleted."""
    selector = ",".join(f"{k}={v}" for k, v in plan.service_labels(NAME).items())
    found = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")["items"]
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def ready(pod: Obj) -> bool:
    """Whether the pod's Ready condition is True."""
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def engine(real_cluster: LocalCluster, node_image: NodeImage) -> Iterator[tuple[Api, Obj, Obj]]:
    """The engine Deployment and Service applied; the API, the Deployment and the created Service."""
    image = node_image("engine")
    configmap, claim, deployment, service = rendered(image.name)
    with real_cluster.admin_api() as api:
        api.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", devices.device_class())
        api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", configmap)
        api.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates", claim)
        api.request("POST", f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments", deployment)
        created = api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", service)
        try:
            yield api, deployment, created
        finally:
            for path in (
                f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}",
                f"/api/v1/namespaces/{NAMESPACE}/services/{NAME}",
                f"/api/v1/namespaces/{NAMESPACE}/configmaps/{configmap['metadata']['name']}",
                f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates/{claim['metadata']['name']}",
                f"/apis/resource.k8s.io/v1/deviceclasses/{dra.DEVICE_CLASS}",
            ):
                api.request("DELETE", path)


def fetch(node: RealNode, url: str, document: Obj | None = None) -> subprocess.CompletedProcess[str]:
    """GET ``url``, or POST ``document`` as JSON, from the node's network namespace (a client on the node)."""
    data = "None" if document is None else f"{json.dumps(document)!r}.encode()"
    script = (
        "import urllib.request\n"
        f"request = urllib.request.Request({url!r}, data={data}, headers={{'Content-Type': 'application/json'}})\n"
        "print(urllib.request.urlopen(request, timeout=60).read().decode())\n"
    )
    return node.in_netns(["python3", "-I", "-c", script], timeout=90)


def running_pod(api: Api) -> Obj:
    """The one serving pod, once its container runs."""
    return wait_for(
        lambda: pods(api),
        lambda found: len(found) == 1 and found[0].get("status", {}).get("phase") == "Running",
        timeout=120,
        what="the engine pod Running",
        show=lambda found: [p.get("status") for p in found],
    )[0]


def ready_pod(api: Api) -> Obj:
    """The one serving pod, once it is Ready."""
    found = wait_for(lambda: pods(api), lambda pods: len(pods) == 1 and ready(pods[0]), timeout=600, what="Ready pod")
    return found[0]


def log_tail(cluster: LocalCluster, pod: str) -> str:
    """The end of the pod's log, to show why it is not Ready."""
    return cluster.kubectl("logs", pod).stdout[-2000:]


def test_engine_pod_is_ready_only_once_the_engine_answers(
    engine: tuple[Api, Obj, Obj], real_cluster: LocalCluster, real_node: RealNode
) -> None:
    api, _, _ = engine
    pod = running_pod(api)
    # vLLM takes far longer than a poll to start: Running is seen while the probes still hold it back.
    assert not ready(pod), pod["status"]
    assert pod["spec"]["nodeName"] == REAL_NODE
    name = pod["metadata"]["name"]
    pod = wait_for(
        lambda: api.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") or {},
        ready,
        timeout=600,
        interval=2,
        what=f"engine pod {name} Ready",
        show=lambda found: (found.get("status", {}).get("containerStatuses"), log_tail(real_cluster, name)),
    )
    models = fetch(real_node, f"http://{pod['status']['podIP']}:{HTTP_PORT}/v1/models")
    assert models.returncode == 0, models.stderr
    assert [m["id"] for m in json.loads(models.stdout)["data"]] == ["neuronfleet/tiny"]
    # The engine runs as the image's non-root user, as the pod's security context demands.
    uid = real_cluster.kubectl("exec", name, "--", "id", "-u")
    assert uid.returncode == 0, uid.stderr
    assert uid.stdout.strip() == str(plan.RUN_AS)


def test_the_claim_hands_its_container_the_device_node_and_the_cores_the_runtime_reserves(
    engine: tuple[Api, Obj, Obj], real_cluster: LocalCluster
) -> None:
    api, _, _ = engine
    # The first pod, Ready since the test above.
    pod = ready_pod(api)
    name = pod["metadata"]["name"]
    (allocated,) = claim_of(api, pod)["status"]["allocation"]["devices"]["results"]
    published = devices.resource_slice(REAL_NODE, SPEC["instanceType"])["spec"]["devices"]
    (device,) = [d for d in published if d["name"] == allocated["device"]]
    device_id = device["attributes"][dra.DEVICE_ID]["int"]
    # The claim's NeuronConfig asks for the chip's default LNC (2): a device's 8 cores are 4 logical ones.
    chip = get_instance_type(SPEC["instanceType"]).chip
    lnc = chip.default_lnc
    per_device = chip.logical_cores(lnc)
    cores = list(range(device_id * per_device, (device_id + 1) * per_device))
    env = real_cluster.kubectl("exec", name, "--", "printenv", dra.VISIBLE_CORES_ENV, dra.LNC_ENV)
    assert env.returncode == 0, env.stderr
    assert env.stdout.split() == [f"{cores[0]}-{cores[-1]}", str(lnc)]
    # The device's node, through CDI: a character device (the simulated one has /dev/null's numbers).
    node = real_cluster.kubectl("exec", name, "--", "stat", "-c", "%F %t:%T", f"/dev/neuron{device_id}")
    assert node.returncode == 0, node.stderr
    assert node.stdout.strip() == "character special file 1:3"
    # The simulated runtime started on them, as the Neuron runtime reserves what it is handed.
    log = real_cluster.kubectl("logs", name).stdout
    assert f"reserving logical NeuronCores {cores} at LNC={lnc}" in log, log[-6000:]


def test_completion_through_the_service_returns_the_requested_tokens(
    engine: tuple[Api, Obj, Obj], real_node: RealNode
) -> None:
    api, _, service = engine
    ready_pod(api)
    document = {"model": "neuronfleet/tiny", "prompt": "The fleet", "max_tokens": MAX_TOKENS, "ignore_eos": True}
    # The ClusterIP, DNATed by kube-proxy's rules to the Ready pod.
    answer = fetch(real_node, f"http://{service['spec']['clusterIP']}:{HTTP_PORT}/v1/completions", document)
    assert answer.returncode == 0, answer.stderr
    completion = json.loads(answer.stdout)
    assert completion["usage"]["completion_tokens"] == MAX_TOKENS
    assert completion["choices"][0]["finish_reason"] == "length"


def test_deleted_pod_runs_its_prestop_and_stops_within_its_grace(engine: tuple[Api, Obj, Obj]) -> None:
    api, deployment, _ = engine
    pod_spec = deployment["spec"]["template"]["spec"]
    grace = pod_spec["terminationGracePeriodSeconds"]
    pre_stop = pod_spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    name = ready_pod(api)["metadata"]["name"]
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"
    deleted = time.monotonic()
    api.request("DELETE", path)
    wait_for(lambda: api.get(path), lambda found: not found, timeout=grace + 15, what=f"pod {name} gone")
    stopped_after = time.monotonic() - deleted
    # The preStop sleep holds the stop signal back; the engine (pid 1) then exits on SIGTERM, not at the kill.
    assert pre_stop <= stopped_after < grace, stopped_after
    events = api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name={name}")
    reasons = [e["reason"] for e in events["items"] if e["source"].get("component") == "kubelet"]
    assert "Killing" in reasons, reasons
    assert "FailedPreStopHook" not in reasons, reasons


def plugin_records(cluster: LocalCluster) -> list[Obj]:
    """What the node's DRA kubelet plugin was asked, in order: its JSON log lines."""
    (plugin,) = [p for p in cluster.state.processes if p.name == "neuron-dra"]
    lines = plugin.log.read_text().splitlines()
    return [json.loads(line) for line in lines if line.startswith('{"event"')]


def claim_of(api: Api, pod: Obj) -> Obj:
    """The pod's Neuron claim, made by Kubernetes from the claim template."""
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim: Obj = api.request(
        "GET", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{status['resourceClaimName']}"
    )
    return claim


def test_the_kubelet_prepared_each_replicas_claimed_device_before_it_ran_and_released_it_after(
    engine: tuple[Api, Obj, Obj], real_cluster: LocalCluster
) -> None:
    api, _, _ = engine
    # The replacement of the pod the drain test deleted: its container runs only once its claim is prepared.
    pod = running_pod(api)
    claim = claim_of(api, pod)
    (allocated,) = claim["status"]["allocation"]["devices"]["results"]
    assert (allocated["driver"], allocated["pool"]) == (dra.DRIVER, REAL_NODE)
    records = wait_for(
        lambda: plugin_records(real_cluster),
        lambda found: any(r["event"] == "prepare" and r["uid"] == claim["metadata"]["uid"] for r in found),
        timeout=30,
        what=f"the plugin preparing {claim['metadata']['name']}",
    )
    prepared = [r for r in records if r["event"] == "prepare"]
    print(f"the DRA plugin's records: {records}")
    assert {"devices": [allocated["device"]], "claim": claim["metadata"]["name"]}.items() <= next(
        r for r in prepared if r["uid"] == claim["metadata"]["uid"]
    ).items()
    # The pod the drain test deleted had a claim of its own: prepared, then unprepared once it stopped.
    gone = {r["uid"] for r in prepared} - {claim["metadata"]["uid"]}
    assert gone, "the deleted pod's claim was prepared too"
    assert gone <= {r["uid"] for r in records if r["event"] == "unprepare"}
