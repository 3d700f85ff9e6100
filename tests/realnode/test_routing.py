"""Routing through the real Endpoint Picker and Envoy, on real pods, under load.

One ``device: sim`` service with two replicas and ``spec.routing`` on the real node: the operator (in-cluster,
from the chart) applies its InferencePool and runs GIE v1.5.0's Endpoint Picker with Envoy 1.40 in front of it
(images built here, ``tools/gie`` and ``tools/envoy``). Load goes through the router's Service, from the node's
network namespace; Envoy names the replica that served each request (``x-neuronfleet-endpoint``), so each
test sees where the picker sent what. The tests share the service and leave it Ready with two replicas.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.canary import GOOD_CANARY_LATENCY_LIMIT, latency_checks
from harness.cluster_fixtures import NodeImage
from harness.fleet import (
    AFTER_S,
    DRAIN_TOKENS,
    LLAMA_8B_MODEL,
    NAME,
    POD_TIMEOUT_S,
    RATE,
    Fleet,
    Obj,
    identity_hash,
    pod_ready,
    report,
    started,
)
from harness.node_load import Answer

from neuronfleet.contract.model_shapes import served_name
from neuronfleet.contract.names import HTTP_PORT
from neuronfleet.devcluster.addons.routing import install_gie_crds, remove_gie_crds
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.demo.load import REFUSED, TRANSPORT_ERROR
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.devcluster.realnode.node import RealNode
from neuronfleet.engine.artifacts.adapters import adapter_digest
from neuronfleet.operator.plan import RouterImages, routing
from neuronfleet.operator.plan import envoy as envoy_plan

#: Long generations a second (about 8 s each): two replicas run them with room, one alone just keeps up.
DRAIN_RATE = 0.5
ROUTER = routing.router_name(NAME)
#: The LoRA adapter the rollout adds, by the name clients ask for it.
ADAPTER = "support-fr"
#: From an endpoint's change to kube-proxy's rules: its minSyncPeriod (1 s), and the rewrite on a busy node.
KUBE_PROXY_SYNC_S = 2.0


@pytest.fixture(scope="module")
def routed(
    real_cluster: LocalCluster,
    real_node: RealNode,
    node_image: NodeImage,
    router_images: RouterImages,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    """The service Ready with two replicas (and a LoRA slot) and its router Ready, GIE's CRDs served for the
    module."""
    install_gie_crds(real_cluster)
    try:
        with started(
            real_cluster,
            real_node,
            node_image,
            tmp_path_factory.mktemp("routed"),
            model=LLAMA_8B_MODEL,
            router_images=router_images,
            # A LoRA slot from the start: an adapter added later rolls the replicas, not the picker's scoring.
            lora={"maxLoras": 1},
        ) as service:
            yield service
    finally:
        remove_gie_crds(real_cluster)


def replica(answer_endpoint: str | None) -> str | None:
    """The pod IP in Envoy's ``ip:port`` of the replica that answered."""
    return None if not answer_endpoint else answer_endpoint.rsplit(":", 1)[0]


def served_by(answer: Answer) -> str | None:
    """The pod IP of the replica the picker sent a request to, as Envoy named it in the answer."""
    return replica(answer.recorded.get(envoy_plan.UPSTREAM_HEADER))


def endpoints(pods: list[Obj]) -> dict[str, str]:
    """Pod IP -> pod name."""
    return {p["status"]["podIP"]: p["metadata"]["name"] for p in pods if p.get("status", {}).get("podIP")}


def scrape(fleet: Fleet, pod: Obj) -> dict[str, list[str]]:
    """The engine's metrics the picker reads, from the node: each family's sample lines."""
    families = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
    found: dict[str, list[str]] = {name: [] for name in (*families, "vllm:cache_config_info")}
    for line in fleet.engine_metrics(pod).splitlines():
        for name in found:
            if line.startswith(name + "{"):
                found[name].append(line)
    return found


def value(line: str) -> float:
    return float(line.rsplit(" ", 1)[1])


def lora_adapter(directory: Path) -> Obj:
    """A LoRA adapter folder on the node, readable by the engine's user, as ``spec.lora.adapters`` names it."""
    directory.mkdir()
    directory.chmod(0o755)
    config = directory / "adapter_config.json"
    config.write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}))
    config.chmod(0o644)
    return {"name": ADAPTER, "source": str(directory), "sha256": adapter_digest(directory)}


@pytest.fixture(scope="module")
def node_folder() -> Iterator[Path]:
    """A folder on the node that any user may read (pytest's own temporary folders are the test user's alone),
    for the module: a replica that starts after the test that added the adapter mounts it too."""
    folder = Path(tempfile.mkdtemp(prefix="neuronfleet-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def test_the_picker_spreads_load_reads_the_engines_metrics_and_a_rollout_adding_an_adapter_loses_nothing(
    routed: Fleet, node_folder: Path
) -> None:
    fleet = routed
    old = fleet.status()["currentRevision"]
    pods = endpoints(fleet.pods())
    old_routers = {p["metadata"]["name"] for p in router_pods(fleet)}
    # New buckets (a new artifact) and an adapter in the LoRA slot, served from a folder on the node; and a new
    # router pod template (a toleration), so the router pod is replaced too under the load's kept-alive connections.
    changed = fleet.with_buckets([64, 256])
    changed["spec"]["lora"] = {"maxLoras": 1, "adapters": [lora_adapter(node_folder / ADAPTER)]}
    placed = changed["spec"]["routing"]
    placed["tolerations"] = [*placed.get("tolerations", []), {"key": "neuronfleet.io/test", "operator": "Exists"}]
    new = identity_hash(changed)
    with fleet.load("routed-rollout", through=ROUTER) as load:
        # What the picker reads, from a serving pod while it serves.
        busy = wait_busy(fleet)
        applied_at = fleet.apply(changed)
        compiled_at = fleet.wait(
            lambda: (
                (fleet.status().get("artifact") or {}).get("hash") == new
                and (fleet.status().get("artifact") or {}).get("phase") == "Ready"
                and time.time()
            ),
            f"artifact {new} compiled",
        )
        done_at = fleet.wait(
            lambda: fleet.rolled_out_to(new) and time.time(), f"every replica on {new}", timeout=2 * POD_TIMEOUT_S
        )
        new_pods = endpoints(fleet.pods())
        # The old router pod drains (its Envoy closes each kept-alive connection as it answers) and goes.
        fleet.wait(
            lambda: (routers := {p["metadata"]["name"] for p in router_pods(fleet)}) and not routers & old_routers,
            "the old router pod replaced",
            timeout=120,
        )
        fleet.wait(
            lambda: not [p for p in fleet.get("pods", "")["items"] if p["metadata"]["name"] in old_routers],
            "the old router pod gone",
            timeout=120,
        )
        # The adapter, asked for by name through the picker beside the base model's load.
        with fleet.load("routed-adapter", through=ROUTER, model=ADAPTER) as adapter_load:
            time.sleep(AFTER_S)
            adapter = adapter_load.stop()
        result = load.stop()
    report("rollout through the picker", result, applied=applied_at, compiled=compiled_at, rolled_out=done_at)
    report("the adapter added, through the picker", adapter)
    assert result.failed == {}, result.summary
    assert adapter.failed == {}, adapter.summary
    assert len(adapter.answers) >= RATE * AFTER_S * 0.8, adapter.summary
    assert {a.header for a in adapter.answers} == {new}
    # Both router pods routed the load: the old one until it went, the new one after.
    routers = Counter(a.recorded.get(envoy_plan.ROUTER_HEADER) for a in result.answers)
    assert set(routers) & old_routers, routers
    assert set(routers) - old_routers, routers
    before = result.sent_between(result.answers[0].sent_at, applied_at)
    # Both replicas took requests through the picker before the change: it spreads, it does not pin.
    assert {replica(a.recorded.get(envoy_plan.UPSTREAM_HEADER)) for a in before} == set(pods)
    after = result.sent_between(done_at)
    assert len(after) >= RATE * AFTER_S * 0.8, len(after)
    assert {a.header for a in after} == {new}
    assert {replica(a.recorded.get(envoy_plan.UPSTREAM_HEADER)) for a in after} <= set(new_pods)
    assert {a.header for a in result.answers} == {old, new}
    # The metrics, read under load: integer cache labels, the request gauges, a KV usage fraction.
    assert busy["running"] >= 1, busy
    assert 0 < busy["kv_cache_usage_perc"] <= 1, busy
    assert busy["block_size"] > 0
    assert busy["num_gpu_blocks"] > 0


#: Pairs of a long prompt then a short one 15 ms behind it: a picker going by the engines' metrics alone (scraped
#: every 50 ms) sends about 3 in 10 of the short ones after the long one, so it splits 8 pairs by chance 6% of
#: the time.
PAIRS = 8


def test_a_short_request_sent_right_behind_a_long_one_goes_to_the_other_replica(routed: Fleet) -> None:
    """The picker counts the tokens it has just sent each replica (neuronfleet's build: ``inflight-tokens-scorer``),
    so it knows where a long prompt went before the engine's figures show it."""
    fleet = routed
    url = f"http://{fleet.get('service', ROUTER)['spec']['clusterIP']}:{HTTP_PORT}/v1/completions"
    model = served_name(fleet.manifest["spec"]["model"]["uri"])
    script = (
        "import json, threading, time, urllib.request\n"
        "def send(prompt, max_tokens, out, key):\n"
        f"    body = json.dumps({{'model': {model!r}, 'prompt': prompt, 'max_tokens': max_tokens}}).encode()\n"
        f"    request = urllib.request.Request({url!r}, data=body, headers={{'Content-Type': 'application/json'}})\n"
        "    with urllib.request.urlopen(request, timeout=60) as answer:\n"
        f"        out[key] = answer.headers[{envoy_plan.UPSTREAM_HEADER!r}]\n"
        "pairs = []\n"
        f"for pair in range({PAIRS}):\n"
        "    out = {}\n"
        "    long = threading.Thread(target=send, args=(f'pair {pair} ' + 'bada ' * 200, 16, out, 'long'))\n"
        "    long.start()\n"
        "    time.sleep(0.015)\n"
        "    send(f'pair {pair} short', 1, out, 'short')\n"
        "    long.join()\n"
        "    pairs.append(out)\n"
        "print(json.dumps(pairs))\n"
    )
    done = fleet.node.in_netns(["python3", "-I", "-c", script], timeout=120)
    assert done.returncode == 0, done.stderr
    pairs = json.loads(done.stdout)
    split = [pair for pair in pairs if replica(pair["short"]) != replica(pair["long"])]
    print(f"==> a short request 15 ms behind a long one: {len(split)} of {PAIRS} sent to the other replica", flush=True)
    assert len({replica(pair["long"]) for pair in pairs} | {replica(pair["short"]) for pair in pairs}) == 2, pairs
    assert split == pairs, pairs


def wait_busy(fleet: Fleet) -> dict[str, float]:
    """The picker's metrics of a serving pod while it runs a request: its gauges and its cache's integers."""

    def read() -> dict[str, float]:
        for pod in fleet.pods():
            metrics = scrape(fleet, pod)
            (info,) = metrics["vllm:cache_config_info"]
            labels = dict(part.split("=", 1) for part in info[info.index("{") + 1 : info.index("}")].split(","))
            running = sum(value(line) for line in metrics["vllm:num_requests_running"])
            if running:
                return {
                    "running": running,
                    "waiting": sum(value(line) for line in metrics["vllm:num_requests_waiting"]),
                    "kv_cache_usage_perc": max(value(line) for line in metrics["vllm:kv_cache_usage_perc"]),
                    # int() fails on anything but an integer, as the picker's parse does.
                    "block_size": int(labels["block_size"].strip('"')),
                    "num_gpu_blocks": int(labels["num_gpu_blocks"].strip('"')),
                }
        return {}

    found: dict[str, float] = fleet.wait(read, "a serving pod running a request", timeout=60)
    return found


def test_a_pod_that_is_not_ready_is_never_picked(routed: Fleet) -> None:
    fleet = routed
    serving = fleet.status()["currentRevision"]
    victim, other = fleet.pods()
    victim_ip, name = victim["status"]["podIP"], victim["metadata"]["name"]
    pid = fleet.container_pid(victim)
    with fleet.load("not-ready", through=ROUTER) as load:
        # A frozen engine cannot serve: its readiness probe times out and the pod goes NotReady.
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped_at = time.time()
            fleet.wait(lambda: not pod_ready(fleet.get("pod", name)), f"{name} NotReady", timeout=90)
            unready_at = time.time()
            time.sleep(AFTER_S)
        finally:
            # Read before the signal: once it is sent, a held request may be answered before this thread runs again.
            resumed_at = time.time()
            os.kill(pid, signal.SIGCONT)
        # Requests the other replica answered while the victim was frozen were sent after all the victim held.
        paused_bound = max(o["index"] for o in load.answered_so_far())
        fleet.wait(lambda: pod_ready(fleet.get("pod", name)), f"{name} Ready again", timeout=120)
        ready_at = time.time()
        # Ready again, it is picked again (once the picker has seen it drain what it held): its readiness was
        # what kept it out.
        fleet.wait(
            lambda: any(
                o["index"] > paused_bound and replica(o["recorded"].get(envoy_plan.UPSTREAM_HEADER)) == victim_ip
                for o in load.answered_so_far()
            ),
            f"{name} picked again",
            timeout=90,
        )
        picked_at = time.time()
        result = load.stop()
    report(
        "not ready",
        result,
        stopped=stopped_at,
        unready=unready_at,
        resumed=resumed_at,
        ready=ready_at,
        picked=picked_at,
    )
    # Over the whole window, only what the frozen pod held before it went NotReady may fail: it waited until
    # the pod resumed. (Most of it is then answered; Envoy has answered a few of the first 503 as the pod resumed.)
    held = [a for a in result.in_flight_at(unready_at) if served_by(a) == victim_ip]
    failed = [a for a in result.answers if not a.ok]
    print(
        f"    {len(held)} held by the frozen pod when it went NotReady, answered after it resumed; "
        f"{len(failed)} of them failed",
        flush=True,
    )
    assert all(a.done_at > resumed_at for a in held), held
    assert all(a in held for a in failed), failed
    # From the moment the API server said NotReady until it was resumed, nothing went to the frozen pod:
    # the other replica took it all.
    while_unready = result.sent_between(unready_at, resumed_at)
    assert len(while_unready) >= RATE * AFTER_S * 0.8, len(while_unready)
    assert {served_by(a) for a in while_unready} == {other["status"]["podIP"]}
    assert {a.header for a in result.answers if a.ok} == {serving}
    fleet.wait(lambda: fleet.rolled_out_to(serving), "both replicas Ready")


def test_a_drained_replica_finishes_what_the_picker_sent_it_and_none_fails(routed: Fleet) -> None:
    fleet = routed
    serving = fleet.status()["currentRevision"]
    victim = fleet.pods()[0]
    victim_ip, name = victim["status"]["podIP"], victim["metadata"]["name"]
    grace = victim["spec"]["terminationGracePeriodSeconds"]
    with fleet.load("routed-drain", rate=DRAIN_RATE, max_tokens=DRAIN_TOKENS, through=ROUTER) as load:
        fleet.next_request_started(victim)
        deleted_at = time.time()
        fleet.kubectl("delete", "pod", name, "--wait=false")
        fleet.wait(lambda: name not in {p["metadata"]["name"] for p in fleet.pods()}, f"pod {name} gone", grace + 30)
        gone_at = time.time()
        time.sleep(AFTER_S)
        result = load.stop()
    on_victim = [a for a in result.answers if served_by(a) == victim_ip]
    in_flight = [a for a in on_victim if a.sent_at <= deleted_at < a.done_at]
    report("drain through the picker", result, deleted=deleted_at, gone=gone_at)
    print(f"    on {name}: {len(on_victim)} answered, {len(in_flight)} in flight at the deletion", flush=True)
    assert in_flight, f"no request was running on {name} when it was deleted"
    assert result.failed == {}, result.summary
    assert all(a.tokens == DRAIN_TOKENS for a in result.answers)
    # Once it was deleted, the picker sent new requests elsewhere.
    assert all(served_by(a) != victim_ip for a in result.sent_between(deleted_at + 2))
    assert {a.header for a in result.answers} == {serving}
    fleet.wait(lambda: fleet.rolled_out_to(serving), "the replacement pod Ready")


def router_pods(fleet: Fleet) -> list[Obj]:
    """The router's pods, not being deleted, by name."""
    selector = ",".join(f"{k}={v}" for k, v in routing.router_pods(NAME).items())
    items: list[Obj] = fleet.get("pods", "", f"--selector={selector}")["items"]
    return sorted((p for p in items if not p["metadata"].get("deletionTimestamp")), key=lambda p: p["metadata"]["name"])


def when_router_routes(fleet: Fleet, pod: Obj, action: str = "", timeout: float = 60) -> tuple[float, int]:
    """Run ``action`` (Python) once a router pod's Envoy has just taken a request; when (Unix seconds), and how
    many requests it was routing then (Envoy's own gauges, read from its admin port inside the pod).

    It waits for a request to start, not for one to be in flight: one seen in its last milliseconds would be
    answered before the action lands."""
    envoy = fleet.container_pid(pod, "envoy")
    stat = f"http://127.0.0.1:{envoy_plan.ENVOY_ADMIN_PORT}/stats?filter=^http\\.router\\.downstream_rq_(active|total)$"
    script = (
        "import os, signal, time, urllib.request\n"
        "def gauges():\n"
        f"    text = urllib.request.urlopen({stat!r}, timeout=5).read().decode()\n"
        "    return dict((k.rsplit('_', 1)[1], int(v)) for k, v in (l.split(':') for l in text.splitlines()))\n"
        f"deadline = time.time() + {timeout}\n"
        "started = gauges()['total']\n"
        "while time.time() < deadline:\n"
        "    now = gauges()\n"
        "    if now['active'] and now['total'] > started:\n"
        + "".join(f"        {line}\n" for line in action.splitlines())
        + "        print(time.time(), now['active'])\n"
        "        break\n"
        "    started = now['total']\n"
        "    time.sleep(0.02)\n"
        "else:\n"
        "    raise SystemExit('the router routed nothing')\n"
    )
    # In the pod's own network namespace, where Envoy's admin port listens on localhost.
    done = subprocess.run(
        ["nsenter", "-t", str(envoy), "-n", "python3", "-I", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout + 30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    at, active = done.stdout.split()
    return float(at), int(active)


def routes(fleet: Fleet, router: Obj) -> bool:
    """Whether the router pod answers a completion itself: Ready says its containers started (a restarted
    picker too), this that its picker has replicas to pick."""
    try:
        fleet.complete_on(router, max_tokens=1, port=envoy_plan.ENVOY_PORT)
    except AssertionError:
        return False
    return True


def two_routers_routing(fleet: Fleet) -> list[Obj]:
    """The two router pods, once both are Ready and each routes."""
    pods: list[Obj] = fleet.wait(
        lambda: len(pods := [p for p in router_pods(fleet) if pod_ready(p)]) == 2 and pods, "two router pods Ready"
    )
    for pod in pods:
        fleet.wait(functools.partial(routes, fleet, pod), f"{pod['metadata']['name']} routes")
    return pods


def kill_router_while_it_routes(fleet: Fleet, pod: Obj) -> tuple[float, int]:
    """SIGKILL a router pod's picker and Envoy once its Envoy is routing a request (:func:`when_router_routes`)."""
    pids = [fleet.container_pid(pod, name) for name in ("epp", "envoy")]
    return when_router_routes(fleet, pod, f"for pid in {pids!r}:\n    os.kill(pid, signal.SIGKILL)")


def test_a_router_pod_killed_under_load_fails_only_what_went_to_it_and_the_other_routes_on(routed: Fleet) -> None:
    fleet = routed
    serving = fleet.status()["currentRevision"]
    two = copy.deepcopy(fleet.manifest)
    two["spec"]["routing"]["replicas"] = 2
    fleet.apply(two)
    victim, other = two_routers_routing(fleet)
    name = victim["metadata"]["name"]
    assert fleet.get("pdb", ROUTER)["spec"]["maxUnavailable"] == 1
    # Each request on its own connection: kube-proxy sends each to either router.
    with fleet.load("router-lost", through=ROUTER, keep_alive=False) as load:
        fleet.wait(
            lambda: (
                {o["recorded"].get(envoy_plan.ROUTER_HEADER) for o in load.answered_so_far()}
                >= {name, other["metadata"]["name"]}
            ),
            "both routers routing",
        )
        killed_at, routing_then = kill_router_while_it_routes(fleet, victim)
        # The kubelet restarts both containers at once; the pod is back once Ready in the router Service.
        back_at = fleet.wait(
            lambda: (
                restarts(p := fleet.get("pod", name)) >= restarts(victim) + 2
                and pod_ready(p)
                and fleet.in_service(name, ROUTER)
                and time.time()
            ),
            f"{name} restarted and back in {ROUTER}",
            timeout=120,
        )
        time.sleep(AFTER_S)
        result = load.stop()
    report("a router pod killed", result, killed=killed_at, back=back_at)
    failed = [a for a in result.answers if not a.ok]
    by_router = Counter(a.recorded.get(envoy_plan.ROUTER_HEADER) for a in result.answers if a.ok)
    print(
        f"    {routing_then} routed by {name} as it was killed; {len(failed)} failed "
        f"({dict(Counter(a.result for a in failed))}); answers by router: {dict(by_router)}",
        flush=True,
    )
    # Only what went to the killed router failed: in flight on it, or sent to it before it was back: refused, cut
    # off, or answered 500 by its restarted Envoy (it names itself) while its restarted picker was still starting.
    assert routing_then >= 1
    for answer in failed:
        assert answer.done_at > killed_at - 1, answer
        assert answer.sent_at < back_at, answer
        from_it = answer.result == "500" and answer.recorded.get(envoy_plan.ROUTER_HEADER) == name
        assert answer.result in {REFUSED, TRANSPORT_ERROR} or from_it, answer
    # The other router routed on throughout, and the killed one routes again once back.
    assert other["metadata"]["name"] in {
        a.recorded.get(envoy_plan.ROUTER_HEADER) for a in result.sent_between(killed_at)
    }
    after = result.sent_between(back_at)
    assert len(after) >= RATE * AFTER_S * 0.8, len(after)
    assert all(a.ok for a in after), [a for a in after if not a.ok]
    assert name in {a.recorded.get(envoy_plan.ROUTER_HEADER) for a in after}
    assert {a.header for a in result.answers if a.ok} == {serving}


def restarts(pod: Obj) -> int:
    """The restarts of all a pod's containers."""
    return sum(int(s.get("restartCount", 0)) for s in pod.get("status", {}).get("containerStatuses") or [])


def test_a_router_pod_deleted_under_load_finishes_what_it_routes_and_none_fails(routed: Fleet) -> None:
    fleet = routed
    serving = fleet.status()["currentRevision"]
    victim, other = two_routers_routing(fleet)
    name = victim["metadata"]["name"]
    # Generations of about 8 s, each on its own connection: the deleted router holds some as it stops.
    with fleet.load(
        "router-deleted", rate=DRAIN_RATE, max_tokens=DRAIN_TOKENS, through=ROUTER, keep_alive=False
    ) as load:
        routing_then = when_router_routes(fleet, victim)[1]
        deleted_at = time.time()
        fleet.kubectl("delete", "pod", name, "--wait=false")
        left_at = wait_for(
            lambda: not fleet.in_service(name, ROUTER) and time.time(),
            interval=0.1,
            timeout=30,
            what=f"{name} out of {ROUTER}'s endpoints",
        )
        fleet.wait(
            lambda: len([p for p in router_pods(fleet) if pod_ready(p) and p["metadata"]["name"] != name]) == 2,
            "a new router pod Ready beside the other",
            timeout=120,
        )
        replaced_at = time.time()
        time.sleep(AFTER_S)
        result = load.stop()
    report("a router pod deleted", result, deleted=deleted_at, left=left_at, replaced=replaced_at)
    held = [a for a in result.in_flight_at(deleted_at) if a.recorded.get(envoy_plan.ROUTER_HEADER) == name]
    print(f"    {routing_then} routed by {name} as it was deleted, {len(held)} of them answered", flush=True)
    assert routing_then >= 1
    assert held, f"nothing {name} held at its deletion was answered through it"
    assert result.failed == {}, result.summary
    assert all(a.tokens == DRAIN_TOKENS for a in result.answers)
    # Once out of the endpoints it took nothing new; kube-proxy rewrites its rules at most once a second.
    after = result.sent_between(left_at + KUBE_PROXY_SYNC_S)
    late = [a for a in after if a.recorded.get(envoy_plan.ROUTER_HEADER) == name]
    assert not late, (left_at - deleted_at, late)
    assert other["metadata"]["name"] in {a.recorded.get(envoy_plan.ROUTER_HEADER) for a in result.answers}
    assert {a.header for a in result.answers} == {serving}


#: A canary behind the router: each step held long enough for over 200 requests at CANARY_RATE once every
#: router pod routes by its split. Short generations: two stable replicas (4 sequences each) keep up with 16
#: a second of 8 tokens, where 24 tokens saturate them at 8 a second.
CANARY_RATE, CANARY_TOKENS, SPLIT_PAUSE_S = 16.0, 8, 15
CANARY = {
    "steps": [{"weight": 10, "pauseSeconds": SPLIT_PAUSE_S}, {"weight": 50, "pauseSeconds": SPLIT_PAUSE_S}],
    # Two cores run four engines (one just started, as the router pods roll), the routers and the load: limits
    # between a good canary's noise and a slow device's, so the analysis decides the promotion.
    "analysis": {
        "minRequests": 15,
        "maxTtftP99Ratio": GOOD_CANARY_LATENCY_LIMIT,
        "maxItlP99Ratio": GOOD_CANARY_LATENCY_LIMIT,
    },
}


def canary_state(fleet: Fleet) -> Obj:
    return dict(fleet.status().get("canary") or {})


def step_started(fleet: Fleet, step: int) -> float:
    """When the canary's ``step`` (0: the first) began its pause, as its status says (Unix seconds, to the
    second): its replicas Ready and every router pod routing by its split."""
    started = fleet.wait(
        lambda: (c := canary_state(fleet)).get("step") == step and c.get("stepStartedAt"),
        f"step {step + 1} started",
        timeout=POD_TIMEOUT_S,
    )
    return datetime.datetime.fromisoformat(str(started)).timestamp()


def within_chance(share: float, expected: float, count: int) -> bool:
    """Whether a share of ``count`` independent picks lies within 3.5 standard deviations of ``expected``."""
    return abs(share - expected) <= 3.5 * math.sqrt(expected * (1 - expected) / max(count, 1))


def test_a_canary_behind_the_router_takes_each_steps_weight_and_is_promoted_without_a_failed_request(
    routed: Fleet,
) -> None:
    fleet = routed
    old = fleet.status()["currentRevision"]
    # Buckets no other test of the module serves: a new revision whatever ran before.
    changed = fleet.with_buckets([64, 128, 256])
    changed["spec"]["rollout"]["canary"] = CANARY
    # One router pod (the tests before left two): the node's 2 CPUs hold four engines, the operator's two pods
    # and two router pods (300m each) at most, and a router rolls to each step's split one surge pod at a time.
    changed["spec"]["routing"]["replicas"] = 1
    new = identity_hash(changed)
    with fleet.load("routed-canary", through=ROUTER, rate=CANARY_RATE, max_tokens=CANARY_TOKENS) as load:
        applied_at = fleet.apply(changed)
        steps = [step_started(fleet, 0), step_started(fleet, 1)]
        promoted = fleet.wait(lambda: (c := canary_state(fleet)).get("phase") == "Promoted" and c, "promoted")
        promoted_at = time.time()
        done_at = fleet.wait(
            lambda: fleet.rolled_out_to(new) and time.time(), f"every replica on {new}", timeout=2 * POD_TIMEOUT_S
        )
        fleet.wait(lambda: not router_pods_split(fleet), "every router pod without the split")
        time.sleep(AFTER_S)
        result = load.stop()
    report(
        "canary through the router",
        result,
        applied=applied_at,
        step_1=steps[0],
        step_2=steps[1],
        promoted=promoted_at,
        done=done_at,
    )
    assert result.failed == {}, result.summary
    # Promoted by the analysis: its last figures within both latency limits.
    checks = latency_checks(promoted.get("analysis") or "")
    print(f"    promoted on: {promoted.get('analysis')}", flush=True)
    assert {name for name, _, _ in checks} == {"TTFT", "ITL"}, promoted
    assert all(ratio <= limit == GOOD_CANARY_LATENCY_LIMIT for _, ratio, limit in checks), promoted
    # Within each step's pause every request went by its weight; the router named the revision it chose, and
    # that revision's engine answered.
    for started_at, weight in zip(steps, (10, 50), strict=True):
        # Its pause, less the second the status rounds its start to.
        window = result.sent_between(started_at + 1, started_at + SPLIT_PAUSE_S)
        tracks = Counter(a.recorded.get(envoy_plan.TRACK_HEADER) for a in window)
        share = tracks["canary"] / len(window)
        print(f"    step at {weight}%: the canary took {share:.1%} of {len(window)} ({dict(tracks)})", flush=True)
        assert len(window) >= 200, len(window)
        assert within_chance(share, weight / 100, len(window)), (share, len(window))
        assert all((a.recorded.get(envoy_plan.TRACK_HEADER) == "canary") == (a.header == new) for a in window)
    assert {a.header for a in result.sent_between(done_at)} == {new}
    assert {a.header for a in result.sent_between(result.answers[0].sent_at, applied_at)} == {old}
    # Back to a spec without a canary for whatever runs after.
    plain = copy.deepcopy(changed)
    del plain["spec"]["rollout"]["canary"]
    fleet.apply(plain)
    fleet.wait(lambda: "canary" not in fleet.status(), "no canary in the status", timeout=60)


def router_pods_split(fleet: Fleet) -> list[str]:
    """The router pods made for a canary's split, by name."""
    return [
        p["metadata"]["name"]
        for p in router_pods(fleet)
        if routing.SPLIT_ANNOTATION in p["metadata"].get("annotations", {})
    ]
