"""Routing, from the spec alone: the InferencePool, the picker's objects, Envoy's bootstrap, the condition."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from neuronfleet.contract import picker
from neuronfleet.contract.metrics import LORA_INFO, REQUESTS_IN_FLIGHT
from neuronfleet.contract.names import HTTP_PORT, LABEL_SERVICE, LABEL_TRACK, TRACK_CANARY
from neuronfleet.operator import api, plan
from neuronfleet.operator.plan import envoy as envoy_plan
from neuronfleet.operator.plan import picker as picker_plan
from neuronfleet.operator.policy.conditions import Reason
from neuronfleet.operator.policy.rollout import ArtifactView, decide
from neuronfleet.operator.policy.service_status import RoutingState, ServiceStatusInput, service_status

OWNER = plan.Owner(api.API_VERSION, "NeuronInferenceService", "llama", "uid-1")
NS = "serving"
MODEL = {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"}
IMAGES = plan.RouterImages(picker="localhost/epp:test", envoy="localhost/envoy:test")
T0 = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)

Obj = dict[str, Any]


def spec(**fields: Any) -> api.NeuronInferenceServiceSpec:
    return api.parse_service_spec({"model": MODEL, **fields})


def by_kind_and_name(objects: list[Obj]) -> dict[tuple[str, str], Obj]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_the_pool_selects_serving_pods_of_every_revision_at_the_engine_port() -> None:
    pool = plan.inference_pool(OWNER, NS)
    serving_pod_labels = plan.serving_labels("llama", "any-artifact-hash")
    selector = pool["spec"]["selector"]["matchLabels"]
    # Every revision's serving pods match (no artifact label in the selector); compile pods never do.
    assert selector.items() <= serving_pod_labels.items()
    assert not selector.items() <= plan.artifact_labels("any-artifact-hash").items()
    assert pool["spec"]["targetPorts"] == [{"number": HTTP_PORT}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "llama-epp",
        "port": {"number": picker_plan.PICKER_PORT},
        "failureMode": "FailClose",
    }
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_router_pods_are_never_selected_by_the_engine_service() -> None:
    objects = by_kind_and_name(plan.router_objects(OWNER, NS, api.Routing(), IMAGES))
    pod_labels = objects[("Deployment", "llama-router")]["spec"]["template"]["metadata"]["labels"]
    engine_selector = plan.service(OWNER, NS)["spec"]["selector"]
    assert not engine_selector.items() <= pod_labels.items()
    # Yet the Deployment carries the service label: the operator's watch of Deployments sees it.
    assert objects[("Deployment", "llama-router")]["metadata"]["labels"][LABEL_SERVICE] == "llama"


def test_removing_a_router_deletes_everything_any_router_applies_its_pods_first() -> None:
    removal = [(obj["kind"], obj["metadata"]["name"]) for obj in plan.router_removal(OWNER, NS)]
    assert removal[0] == ("Deployment", "llama-router")
    # Whatever a service's routing asks for (replicas, placement, a canary's picker), the same objects.
    routing = api.Routing(replicas=3, node_selector={"pool": "cpu"})
    split = plan.RevisionSplit("0123456789abcdef", 10)
    applied = plan.router_objects(OWNER, NS, routing, IMAGES, split=split, canary_pool=True)
    assert sorted(removal) == sorted((obj["kind"], obj["metadata"]["name"]) for obj in applied)
    assert "InferencePool" not in {kind for kind, _ in removal}


def test_the_router_runs_the_picker_for_its_pool_with_envoy_beside_it() -> None:
    objects = by_kind_and_name(plan.router_objects(OWNER, NS, api.Routing(replicas=2), IMAGES))
    assert set(objects) == {
        ("ServiceAccount", "llama-epp"),
        ("Role", "llama-epp"),
        ("RoleBinding", "llama-epp"),
        ("ConfigMap", "llama-router"),
        ("Deployment", "llama-router"),
        ("PodDisruptionBudget", "llama-router"),
        ("Service", "llama-router"),
        ("Service", "llama-epp"),
    }
    deployment = objects[("Deployment", "llama-router")]
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == "llama-epp"
    picker, envoy = pod["containers"]
    assert (picker["image"], envoy["image"]) == (IMAGES.picker, IMAGES.envoy)
    assert "--pool-name=llama" in picker["args"]
    assert "--pool-namespace=serving" in picker["args"]
    # Ready once the pool has synced, and not before ext_proc listens (GIE's health says nothing of it).
    assert picker["readinessProbe"]["grpc"]["port"] == picker_plan.PICKER_HEALTH_PORT
    assert picker["startupProbe"]["tcpSocket"]["port"] == picker_plan.PICKER_PORT == picker["ports"][0]["containerPort"]
    # Stopping, a router pod leaves the endpoints at once and routes what it holds for a while: both containers
    # wait before their SIGTERM (the picker too, which Envoy asks about every request), the kubelet longer.
    # Envoy first starts its own drain, so that each answer closes its kept-alive connection (the real-node
    # routing rollout shows it), then waits as long.
    drain = picker_plan.ROUTER_DRAIN_SECONDS
    assert pod["terminationGracePeriodSeconds"] > drain
    assert picker["lifecycle"] == {"preStop": {"sleep": {"seconds": drain}}}
    (shell, flag, script) = envoy["lifecycle"]["preStop"]["exec"]["command"]
    assert (shell, flag) == ("/bin/bash", "-c")
    assert f"/dev/tcp/127.0.0.1/{envoy_plan.ENVOY_ADMIN_PORT}" in script
    assert "POST /drain_listeners?graceful HTTP/1.1" in script
    assert script.endswith(f"; sleep {drain}")
    assert envoy["args"][-4:] == ["--drain-strategy", "immediate", "--drain-time-s", str(drain - 5)]
    for container in (picker, envoy):
        assert container["securityContext"]["runAsUser"] != 0
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Router pods spread over nodes, and a drain takes one at a time: with two, routing never stops.
    (spread,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    selector = deployment["spec"]["selector"]
    assert spread["podAffinityTerm"] == {"labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}
    budget = objects[("PodDisruptionBudget", "llama-router")]["spec"]
    assert (budget["selector"], budget["maxUnavailable"]) == (selector, 1)
    # Users send requests to the router's port 8000; a Gateway reaches the picker at the pool's reference.
    services = {name: o["spec"]["ports"][0] for (kind, name), o in objects.items() if kind == "Service"}
    assert services["llama-router"]["port"] == HTTP_PORT
    assert services["llama-router"]["targetPort"] == envoy_plan.ENVOY_PORT
    assert (
        services["llama-epp"]["port"] == plan.inference_pool(OWNER, NS)["spec"]["endpointPickerRef"]["port"]["number"]
    )


def picker_config_of(objects: dict[tuple[str, str], Obj]) -> Obj:
    picker = objects[("Deployment", "llama-router")]["spec"]["template"]["spec"]["containers"][0]
    (text,) = [arg.removeprefix("--config-text=") for arg in picker["args"] if arg.startswith("--config-text=")]
    config: Obj = json.loads(text)
    return config


def test_the_picker_scores_running_requests_beside_the_queue_and_kv_cache() -> None:
    config = picker_config_of(by_kind_and_name(plan.router_objects(OWNER, NS, api.Routing(), IMAGES)))
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p["type"] for p in config["plugins"]}
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    scrape = {"metrics-data-source", "core-metrics-extractor"}
    assert set(weights) == plugins - scrape, "every profile entry names a declared plugin, and every scorer is used"
    # A replica busy with one long prefill waits for nothing: only its running requests show it.
    assert weights["running-requests-size-scorer"] == 1.0
    assert weights["queue-scorer"] == 2.0
    assert weights["kv-cache-utilization-scorer"] == 1.0
    assert weights["max-score-picker"] is None
    # Load alone unless the service weighs prefix locality.
    assert "prefix-cache-scorer" not in plugins
    # Running requests come from the engine's live count, not vLLM's gauge of the last step.
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    (engine,) = extractor["parameters"]["engineConfigs"]
    assert extractor["parameters"]["defaultEngine"] == engine["name"]
    assert engine["runningRequestsSpec"] == REQUESTS_IN_FLIGHT
    assert engine["queuedRequestsSpec"] == "vllm:num_requests_waiting"
    (source,) = config["dataLayer"]["sources"]
    assert source["extractors"] == [{"pluginRef": "core-metrics-extractor"}]
    # No adapters, no LoRA series read (the engine exports none) and no LoRA affinity.
    assert engine["loraSpec"] == ""
    assert "lora-affinity-scorer" not in plugins


def test_a_service_with_lora_slots_is_routed_to_replicas_running_the_adapter_asked_for() -> None:
    config = routed_config(spec(routing={}, lora={"maxLoras": 2}))
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights["lora-affinity-scorer"] == picker.LORA_AFFINITY_WEIGHT
    assert {"type": "lora-affinity-scorer"} in config["plugins"]
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    (engine,) = extractor["parameters"]["engineConfigs"]
    assert engine["loraSpec"] == LORA_INFO


def test_router_pods_go_where_routing_places_them() -> None:
    placed = api.Routing.model_validate(
        {"nodeSelector": {"pool": "cpu"}, "tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    )
    pod = plan.router_objects(OWNER, NS, placed, IMAGES)[4]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "cpu"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    unplaced = plan.router_objects(OWNER, NS, api.Routing(), IMAGES)[4]["spec"]["template"]["spec"]
    assert "nodeSelector" not in unplaced
    assert "tolerations" not in unplaced


def test_the_pickers_role_reads_only_what_it_watches() -> None:
    objects = by_kind_and_name(plan.router_objects(OWNER, NS, api.Routing(), IMAGES))
    rules = objects[("Role", "llama-epp")]["rules"]
    assert all(rule["verbs"] == ["get", "list", "watch"] for rule in rules)
    assert {r for rule in rules for r in rule["resources"]} == {
        "pods",
        "inferencepools",
        "inferenceobjectives",
        "inferencemodelrewrites",
    }
    binding = objects[("RoleBinding", "llama-epp")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llama-epp", "namespace": NS}]


def test_envoy_asks_the_picker_and_sends_each_request_where_it_says() -> None:
    configmap = plan.router_objects(OWNER, NS, api.Routing(), IMAGES)[3]
    config = json.loads(configmap["data"][envoy_plan.ENVOY_FILE])
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    assert clusters["pool"]["type"] == "ORIGINAL_DST"
    assert clusters["pool"]["original_dst_lb_config"]["http_header_name"] == envoy_plan.DESTINATION_HEADER
    picker_address = clusters["picker"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert picker_address["address"]["socket_address"]["port_value"] == picker_plan.PICKER_PORT
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"]["port_value"] == envoy_plan.ENVOY_PORT
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc, router = manager["http_filters"]
    assert ext_proc["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == "picker"
    assert router["name"] == "envoy.filters.http.router"
    # The bodies go to the picker (it reads the prompt), streamed both ways.
    mode = ext_proc["typed_config"]["processing_mode"]
    assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
    # Each answer names the replica that served it and the router pod that sent it there.
    named = {
        h["header"]["key"]: h["header"]["value"]
        for h in manager["route_config"]["virtual_hosts"][0]["response_headers_to_add"]
    }
    assert named == {envoy_plan.UPSTREAM_HEADER: "%UPSTREAM_HOST%", envoy_plan.ROUTER_HEADER: "%HOSTNAME%"}


def test_routing_is_checked_at_admission() -> None:
    with pytest.raises(ValueError, match="replicas"):
        spec(routing={"replicas": 0})
    assert spec(routing={}).routing == api.Routing(replicas=1)
    assert spec().routing is None


def routing_condition(routing_spec: Obj | None, state: RoutingState) -> tuple[str, str, str, list[Any]]:
    target = ArtifactView("llama-abc", "abc", "Ready")
    s = spec(replicas=1) if routing_spec is None else spec(replicas=1, routing=routing_spec)
    given = ServiceStatusInput(
        name="llama",
        generation=1,
        spec=s,
        target=target,
        deployment=None,
        unschedulable=(),
        decision=decide(target, None, None),
        routing_state=state,
    )
    status, events = service_status(given, api.NeuronInferenceServiceStatus(), T0)
    (found,) = [c for c in status.conditions if c.type == "Routing"]
    return found.status, found.reason, found.message, [e for e in events if e.reason in Reason.__members__.values()]


def test_without_the_pool_crd_the_condition_says_so_and_only_a_routing_service_is_warned() -> None:
    status, reason, message, events = routing_condition(None, RoutingState(pool_served=False))
    assert (status, reason) == ("False", Reason.POOL_UNAVAILABLE)
    assert "install its CRD" in message
    assert not any(e.reason == Reason.POOL_UNAVAILABLE for e in events)
    status, reason, message, events = routing_condition({}, RoutingState(pool_served=False))
    assert (status, reason) == ("False", Reason.ROUTING_UNAVAILABLE)
    assert "Service llama serves" in message
    assert [e.type for e in events if e.reason == Reason.ROUTING_UNAVAILABLE] == ["Warning"]


def test_the_condition_follows_the_router_pods() -> None:
    assert routing_condition(None, RoutingState(pool_served=True))[:2] == ("True", Reason.POOL_READY)
    assert routing_condition({"replicas": 2}, RoutingState(True, ready=1))[:2] == ("False", Reason.PICKER_STARTING)
    status, reason, message, _ = routing_condition({"replicas": 2}, RoutingState(True, ready=2))
    assert (status, reason) == ("True", Reason.PICKER_READY)
    assert "Service llama-router" in message


def routed_config(service: api.NeuronInferenceServiceSpec, images: plan.RouterImages = IMAGES) -> Obj:
    """The picker config the operator writes for ``service`` (with ``spec.routing``), its pickers run from
    ``images``."""
    assert service.routing is not None
    scoring = plan.scoring_of(service, images)
    return picker_config_of(by_kind_and_name(plan.router_objects(OWNER, NS, service.routing, images, scoring)))


def test_a_prefix_cache_weight_adds_gies_scorer_in_the_engines_kv_blocks() -> None:
    config = routed_config(spec(routing={"prefixCacheWeight": 2}, engine={"block_size": 16}))
    (prefix,) = [p for p in config["plugins"] if p["type"] == "prefix-cache-scorer"]
    # Its producer comes with it (GIE's loader adds it); autoTune reads the engines' block size and capacity.
    assert prefix["parameters"] == {"autoTune": True, "blockSizeTokens": 16}
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights["prefix-cache-scorer"] == 2
    # Beside the load scorers, not instead of them.
    assert (weights["queue-scorer"], weights["running-requests-size-scorer"]) == (2.0, 1.0)


def test_neuronfleets_picker_build_also_scores_the_tokens_each_picker_has_in_flight() -> None:
    """GIE's image has no in-flight tokens scorer, and refuses a config naming it: only ours gets it."""
    assert "inflight-tokens-scorer" not in json.dumps(routed_config(spec(routing={})))
    ours = plan.RouterImages("localhost/neuronfleet/epp:test", IMAGES.envoy, picker_inflight_tokens=True)
    config = routed_config(spec(routing={}, engine={"max_num_batched_tokens": 2048}), ours)
    plugins = [p["type"] for p in config["plugins"]]
    # The scorer reads what GIE's producer counts as the picker routes and as answers end.
    assert {"inflight-load-producer", "inflight-tokens-scorer"} <= set(plugins)
    # A full prefill step, in the producer's count: 2.5 for each prompt token (1 for it, 1.5 for the output).
    (scorer,) = [p for p in config["plugins"] if p["type"] == "inflight-tokens-scorer"]
    assert scorer["parameters"] == {"stepTokens": 5120}
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p.get("weight") for p in profile["plugins"]}
    assert weights["inflight-tokens-scorer"] == weights["queue-scorer"] == 2.0
    # The producer only counts: it is no scorer of the profile.
    assert "inflight-load-producer" not in weights
    assert (weights["running-requests-size-scorer"], weights["kv-cache-utilization-scorer"]) == (1.0, 1.0)


SPLIT = plan.RevisionSplit("rev-a", 10)


def test_a_canary_behind_the_router_has_a_pool_of_its_own_and_the_stable_pool_holds_to_its_revision() -> None:
    stable_pool = plan.inference_pool(OWNER, NS, "rev-a")["spec"]["selector"]["matchLabels"]
    canary_pool = plan.canary_inference_pool(OWNER, NS)
    selector = canary_pool["spec"]["selector"]["matchLabels"]
    stable_pod = plan.serving_labels("llama", "rev-a")
    canary_pod = {**plan.serving_labels("llama", "rev-b"), LABEL_TRACK: TRACK_CANARY}
    assert stable_pool.items() <= stable_pod.items()
    assert not stable_pool.items() <= canary_pod.items()
    assert selector.items() <= canary_pod.items()
    assert not selector.items() <= stable_pod.items()
    assert canary_pool["metadata"]["name"] == plan.canary_pool_name("llama") == "llama-canary"
    # Its picker is the router pods' second one, on a port of the picker's Service of its own.
    ref = canary_pool["spec"]["endpointPickerRef"]
    assert (ref["name"], ref["port"]["number"]) == ("llama-epp", picker_plan.CANARY_PICKER_PORT)
    services = by_kind_and_name(plan.router_objects(OWNER, NS, api.Routing(), IMAGES, canary_pool=True))
    ports = {p["name"]: p["port"] for p in services[("Service", "llama-epp")]["spec"]["ports"]}
    assert ports == {"grpc": picker_plan.PICKER_PORT, "canary-grpc": picker_plan.CANARY_PICKER_PORT}


def test_with_a_split_each_router_pod_runs_a_picker_for_each_pool_and_names_the_split() -> None:
    objects = by_kind_and_name(plan.router_objects(OWNER, NS, api.Routing(replicas=2), IMAGES, split=SPLIT))
    template = objects[("Deployment", "llama-router")]["spec"]["template"]
    assert template["metadata"]["annotations"] == {plan.SPLIT_ANNOTATION: "stable rev-a 90%, canary 10%"}
    containers = {c["name"]: c for c in template["spec"]["containers"]}
    assert set(containers) == {"epp", "epp-canary", "envoy"}
    canary_args = containers["epp-canary"]["args"]
    assert "--pool-name=llama-canary" in canary_args
    assert f"--grpc-port={picker_plan.CANARY_PICKER_PORT}" in canary_args
    assert "--pool-name=llama" in containers["epp"]["args"]
    # Every port of the pod is its own, by number and by name (15 characters at most).
    ports = [p for c in containers.values() for p in c.get("ports", [])]
    assert len({p["containerPort"] for p in ports}) == len({p["name"] for p in ports}) == len(ports)
    assert max(len(p["name"]) for p in ports) <= 15
    assert containers["epp-canary"]["startupProbe"]["tcpSocket"]["port"] == picker_plan.CANARY_PICKER_PORT
    # The split is the pod's own (inline), so a pod never routes by a split it was not made for.
    args = containers["envoy"]["args"]
    assert json.loads(args[args.index("--config-yaml") + 1]) == envoy_plan.envoy_config(SPLIT)
    # Without a split, nothing of it: the pods a router ran before canaries existed stay as they are.
    plain = by_kind_and_name(plan.router_objects(OWNER, NS, api.Routing(replicas=2), IMAGES))
    plain_template = plain[("Deployment", "llama-router")]["spec"]["template"]
    assert "annotations" not in plain_template["metadata"]
    assert [c["name"] for c in plain_template["spec"]["containers"]] == ["epp", "envoy"]


def test_envoy_sends_each_request_to_one_revisions_listener_by_weight_and_each_asks_its_own_picker() -> None:
    config = envoy_plan.envoy_config(SPLIT)["static_resources"]
    listeners = {listener["name"]: listener for listener in config["listeners"]}
    clusters = {cluster["name"]: cluster for cluster in config["clusters"]}

    def manager(listener: Obj) -> Obj:
        typed: Obj = listener["filter_chains"][0]["filters"][0]["typed_config"]
        return typed

    def port(cluster: Obj) -> int:
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        return int(endpoint["address"]["socket_address"]["port_value"])

    front = manager(listeners["http"])
    assert listeners["http"]["address"]["socket_address"]["port_value"] == envoy_plan.ENVOY_PORT
    # The front listener asks no picker: it only splits.
    assert [f["name"] for f in front["http_filters"]] == ["envoy.filters.http.router"]
    (route,) = front["route_config"]["virtual_hosts"][0]["routes"]
    weights = {c["name"]: c["weight"] for c in route["route"]["weighted_clusters"]["clusters"]}
    assert weights == {"stable": 90, "canary": 10}
    pickers = {"stable": picker_plan.PICKER_PORT, "canary": picker_plan.CANARY_PICKER_PORT}
    for track, picker_port in pickers.items():
        listener = listeners[track]
        # Each revision's listener is on loopback, reached through its cluster, and asks its picker.
        assert listener["address"]["socket_address"]["address"] == "127.0.0.1"
        assert port(clusters[track]) == listener["address"]["socket_address"]["port_value"]
        ext_proc = manager(listener)["http_filters"][0]["typed_config"]
        assert port(clusters[ext_proc["grpc_service"]["envoy_grpc"]["cluster_name"]]) == picker_port
        host = manager(listener)["route_config"]["virtual_hosts"][0]
        assert host["routes"][0]["route"]["cluster"] == "pool"
        headers = {h["header"]["key"]: h["header"]["value"] for h in host["response_headers_to_add"]}
        assert headers[envoy_plan.TRACK_HEADER] == track
        assert headers[envoy_plan.UPSTREAM_HEADER] == "%UPSTREAM_HOST%"
