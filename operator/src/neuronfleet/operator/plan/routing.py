"""The routing side of the plan: a service's InferencePool, and with ``spec.routing`` its Endpoint Picker.

Every service gets an InferencePool (Gateway API Inference Extension, ``inference.networking.k8s.io/v1``)
that selects its serving pods of every revision, at the engine's port: an inference-aware Gateway's
HTTPRoute points at it. With ``spec.routing`` the operator also runs GIE's standalone pattern: one
Deployment whose pods hold the Endpoint Picker (EPP) and an Envoy in front of it, which asks the picker
over ext_proc (on localhost, in the same pod) which replica takes each request, and sends it there.

Names follow GIE's charts: the pool is the service's name, the picker's Service ``<name>-epp``; what users
send requests to is the Service ``<name>-router``.

A canary behind the router (``spec.rollout.canary`` with ``spec.routing``) splits by revision, as GIE's
conformance does for weighted splits: each revision has its pool (``<name>`` the stable one's, ``<name>-canary``
the canary's), each router pod a picker for each, and Envoy sends each request to one revision by weight
(:class:`RevisionSplit`); within it, that revision's picker chooses the replica. A router pod reads its split
once, at its start, so a new weight rolls the router pods (they drain what they hold).

The picker scores replicas for Neuron (:func:`picker_config`): by their waiting queue, their *running*
requests and their KV cache. A Neuron replica runs one prefill per step, so one holding a long prompt is busy
for its whole prefill while vLLM counts it as one running request, which GIE's default queue scorer (waiting
requests only) does not see.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from neuronfleet.contract import metrics
from neuronfleet.contract.names import (
    HTTP_KEEP_ALIVE_S,
    HTTP_PORT,
    HTTP_PORT_NAME,
    LABEL_ARTIFACT,
    LABEL_SERVICE,
    LABEL_TRACK,
    TRACK_CANARY,
)
from neuronfleet.contract.picker import PickerScoring
from neuronfleet.operator import api
from neuronfleet.operator.plan.shared import (
    HOSTNAME_LABEL,
    LABEL_COMPONENT,
    MANAGED_BY,
    Obj,
    Owner,
    container_security,
    service_labels,
)

POOL_API_VERSION = "inference.networking.k8s.io/v1"
#: The picker's gRPC port (ext_proc), its gRPC health port, and its metrics port: GIE's defaults.
PICKER_PORT = 9002
PICKER_HEALTH_PORT = 9003
PICKER_METRICS_PORT = 9090
#: Envoy's listener, and its admin port (on localhost only).
ENVOY_PORT = 8081
ENVOY_ADMIN_PORT = 19000
#: With a canary behind the router, its own picker's ports, beside the stable picker's in the router pod.
CANARY_PICKER_PORT = 9012
CANARY_PICKER_HEALTH_PORT = 9013
CANARY_PICKER_METRICS_PORT = 9091
#: With a canary, the loopback listeners, one a revision, that Envoy's listener splits requests between.
STABLE_LISTENER_PORT = 8091
CANARY_LISTENER_PORT = 8092
#: With a canary, the response header naming the revision the router sent the request to: stable or canary.
TRACK_HEADER = "x-neuronfleet-track"
TRACK_STABLE = "stable"
#: The router pods' annotation naming the split they route by (absent: no canary); a new one rolls them.
SPLIT_ANNOTATION = "neuronfleet.io/revision-split"
#: The header through which the picker tells Envoy the replica it chose (GIE's protocol).
DESTINATION_HEADER = "x-gateway-destination-endpoint"
#: The response header naming the replica (``ip:port``) that answered: what a client sees of the choice.
UPSTREAM_HEADER = "x-neuronfleet-endpoint"
#: The response header naming the router pod (Envoy's host name) that routed the request.
ROUTER_HEADER = "x-neuronfleet-router"
#: How long a stopping router pod keeps routing what it holds: it leaves the Service's endpoints at once,
#: both containers wait this long before their SIGTERM (Envoy ends its streams then), the kubelet 5 s more.
ROUTER_DRAIN_SECONDS = 30
ENVOY_FILE = "envoy.yaml"
ENVOY_CONFIG_DIR = "/etc/envoy"
#: GIE's distroless EPP image runs as nonroot (65532), Envoy's image as envoy (101).
PICKER_USER = 65532
ENVOY_USER = 101


@dataclass(frozen=True)
class RouterImages:
    """The images router pods run: the operator's flags (the chart's ``routing`` values).

    ``picker_inflight_tokens``: the picker image is neuronfleet's build (``tools/gie``), which has the
    :data:`INFLIGHT_TOKENS_SCORER`; GIE's own image refuses a config that names it.
    """

    picker: str = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    envoy: str = "docker.io/envoyproxy/envoy:v1.40.0"
    picker_inflight_tokens: bool = False


@dataclass(frozen=True)
class RevisionSplit:
    """A canary behind the router: the stable revision's pool takes ``100 - canary_weight`` percent of the
    requests, the canary's ``canary_weight``."""

    stable_revision: str
    canary_weight: int

    def describe(self) -> str:
        """The split in words, as the router pods' :data:`SPLIT_ANNOTATION` carries it."""
        return f"stable {self.stable_revision} {100 - self.canary_weight}%, canary {self.canary_weight}%"


def serving_pods(service: str, revision: str | None = None) -> dict[str, str]:
    """The serving pods of a service, of every revision or of one: the pool's selector."""
    pods = {LABEL_SERVICE: service, LABEL_COMPONENT: "serving"}
    return pods if revision is None else {**pods, LABEL_ARTIFACT: revision}


def canary_pool_name(service: str) -> str:
    """The InferencePool of a service's canary replicas, with a canary behind the router."""
    return f"{service}-canary"


def picker_name(service: str) -> str:
    """The picker's Service (and ServiceAccount, Role, RoleBinding): ``<name>-epp``, as GIE names it."""
    return f"{service}-epp"


def router_name(service: str) -> str:
    """The router's Deployment, ConfigMap and the Service users send requests to."""
    return f"{service}-router"


def inference_pool(owner: Owner, namespace: str, revision: str | None = None) -> Obj:
    """The service's InferencePool: its serving pods at the engine's port, picked by ``<name>-epp``. With a
    ``revision`` (a canary behind the router), that revision's pods alone: the canary's have a pool of their own."""
    return _pool(owner, namespace, owner.name, serving_pods(owner.name, revision), PICKER_PORT)


def canary_inference_pool(owner: Owner, namespace: str) -> Obj:
    """The pool of the service's canary replicas, picked by the canary's picker (``<name>-epp``, its own port)."""
    selector = {**serving_pods(owner.name), LABEL_TRACK: TRACK_CANARY}
    return _pool(owner, namespace, canary_pool_name(owner.name), selector, CANARY_PICKER_PORT)


def _pool(owner: Owner, namespace: str, name: str, selector: dict[str, str], picker_port: int) -> Obj:
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": owner.child_metadata(name, namespace, {**service_labels(owner.name), **MANAGED_BY}),
        "spec": {
            "selector": {"matchLabels": selector},
            "targetPorts": [{"number": HTTP_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": picker_name(owner.name),
                "port": {"number": picker_port},
                # No picker, no request: a replica is never chosen blind.
                "failureMode": "FailClose",
            },
        },
    }


def router_pods(service: str) -> dict[str, str]:
    """The labels of a service's router pods (never the service label alone: the engine's Service selects on it)."""
    return {
        "app.kubernetes.io/name": "neuronfleet-router",
        "app.kubernetes.io/instance": service,
        LABEL_COMPONENT: "router",
        **MANAGED_BY,
    }


def _metadata(owner: Owner, name: str, namespace: str) -> Obj:
    return owner.child_metadata(name, namespace, {**service_labels(owner.name), **MANAGED_BY})


def picker_access(owner: Owner, namespace: str) -> list[Obj]:
    """The picker's ServiceAccount, and a Role bound to it: read its pool, the pods, GIE's objectives."""
    name = picker_name(owner.name)
    read = ["get", "list", "watch"]
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(owner, name, namespace)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(owner, name, namespace),
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": read},
                {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"], "verbs": read},
                {
                    "apiGroups": ["inference.networking.x-k8s.io"],
                    "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                    "verbs": read,
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(owner, name, namespace),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


#: The prefix of the type URLs of Envoy's typed configs.
_ENVOY_TYPES = "type.googleapis.com/envoy.extensions"


def envoy_config(split: RevisionSplit | None = None) -> Obj:
    """Envoy's bootstrap: every request asks the picker (ext_proc, both bodies streamed) and goes to the
    replica it names in :data:`DESTINATION_HEADER` (an original-destination cluster).

    With a ``split``, the listener first sends each request, by weight, to one of two loopback listeners, the
    stable revision's and the canary's, each of which asks its own picker; the response names the revision
    (:data:`TRACK_HEADER`)."""
    admin = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": ENVOY_ADMIN_PORT}}}
    if split is None:
        listeners = [_listener("http", "0.0.0.0", ENVOY_PORT, _connection_manager("router", _picked_route()))]
        return {
            "admin": admin,
            "static_resources": {"listeners": listeners, "clusters": [_picker_cluster(), _pool_cluster()]},
        }
    weights = {TRACK_STABLE: 100 - split.canary_weight, TRACK_CANARY: split.canary_weight}
    revisions = {
        TRACK_STABLE: (STABLE_LISTENER_PORT, PICKER_PORT),
        TRACK_CANARY: (CANARY_LISTENER_PORT, CANARY_PICKER_PORT),
    }
    listeners = [
        _listener("http", "0.0.0.0", ENVOY_PORT, _connection_manager("router", _split_route(weights), picker=None))
    ]
    clusters = [_pool_cluster()]
    for track, (listener_port, picker_port) in revisions.items():
        picked = _connection_manager(track, _picked_route(track), picker=f"picker-{track}")
        listeners.append(_listener(track, "127.0.0.1", listener_port, picked))
        clusters += [_picker_cluster(f"picker-{track}", picker_port), _revision_cluster(track, listener_port)]
    return {"admin": admin, "static_resources": {"listeners": listeners, "clusters": clusters}}


def _listener(name: str, address: str, port: int, connection_manager: Obj) -> Obj:
    return {
        "name": name,
        "address": {"socket_address": {"address": address, "port_value": port}},
        "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": connection_manager}]}
        ],
    }


#: Generations stream for minutes: no route timeout, the engine's own limits hold.
_STREAMING = {"timeout": "0s", "idle_timeout": "3600s"}


def _picked_route(track: str | None = None) -> Obj:
    """Requests to the replica the picker named; the response names it, the router pod and, with a ``track``,
    the revision."""
    named = [(UPSTREAM_HEADER, "%UPSTREAM_HOST%"), (ROUTER_HEADER, "%HOSTNAME%")]
    if track is not None:
        named.append((TRACK_HEADER, track))
    return {
        "name": "pool",
        "domains": ["*"],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "pool", **_STREAMING}}],
        "response_headers_to_add": [{"header": {"key": key, "value": value}} for key, value in named],
    }


def _split_route(weights: dict[str, int]) -> Obj:
    """Each request to one revision's listener, at random by ``weights`` (percent)."""
    clusters = [{"name": track, "weight": weight} for track, weight in weights.items() if weight]
    return {
        "name": "revisions",
        "domains": ["*"],
        "routes": [{"match": {"prefix": "/"}, "route": {"weighted_clusters": {"clusters": clusters}, **_STREAMING}}],
    }


def _connection_manager(stat_prefix: str, virtual_host: Obj, picker: str | None = "picker") -> Obj:
    """Requests routed by ``virtual_host``; with a ``picker``, each asks it first (:func:`_ask_the_picker`)."""
    filters = [_ask_the_picker(picker)] if picker is not None else []
    return {
        "@type": f"{_ENVOY_TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": stat_prefix,
        "route_config": {"virtual_hosts": [virtual_host]},
        "http_filters": [
            *filters,
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": f"{_ENVOY_TYPES}.filters.http.router.v3.Router"},
            },
        ],
    }


def _ask_the_picker(cluster: str) -> Obj:
    """The ext_proc filter: headers, bodies (streamed both ways) and trailers go to the picker at ``cluster``."""
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": f"{_ENVOY_TYPES}.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster}, "timeout": "10s"},
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "FULL_DUPLEX_STREAMED",
                "response_body_mode": "FULL_DUPLEX_STREAMED",
                "request_trailer_mode": "SEND",
                "response_trailer_mode": "SEND",
            },
            "message_timeout": "1000s",
        },
    }


def _picker_cluster(name: str = "picker", port: int = PICKER_PORT) -> Obj:
    """A picker beside Envoy in the pod, over HTTP/2 and TLS."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [_endpoint(port)]}]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_ENVOY_TYPES}.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        # The picker serves TLS with a certificate of its own making (as Gateways expect): on localhost,
        # in the same pod, it is not verified.
        "transport_socket": {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": f"{_ENVOY_TYPES}.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {"alpn_protocols": ["h2"]},
            },
        },
    }


#: How long Envoy keeps an idle connection to a serving pod: less than the engine's own keep-alive
#: (:data:`~neuronfleet.contract.names.HTTP_KEEP_ALIVE_S`). Otherwise the engine may close a connection just as
#: Envoy sends a request on it, and the client gets Envoy's 503 (one busy-chat turn of 868 in a bench-prefix run).
POOL_IDLE_TIMEOUT_S = HTTP_KEEP_ALIVE_S - 2


def _pool_cluster() -> Obj:
    """The serving pods: whichever address the picker wrote in :data:`DESTINATION_HEADER`, over HTTP/1.1
    connections Envoy closes first when idle (:data:`POOL_IDLE_TIMEOUT_S`)."""
    return {
        "name": "pool",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "5s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_ENVOY_TYPES}.upstreams.http.v3.HttpProtocolOptions",
                "common_http_protocol_options": {"idle_timeout": f"{POOL_IDLE_TIMEOUT_S}s"},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
    }


def _revision_cluster(track: str, port: int) -> Obj:
    """A revision's loopback listener, over HTTP/1.1 connections closed when idle as the pool's are."""
    return {
        "name": track,
        "type": "STATIC",
        "connect_timeout": "5s",
        "load_assignment": {"cluster_name": track, "endpoints": [{"lb_endpoints": [_endpoint(port)]}]},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_ENVOY_TYPES}.upstreams.http.v3.HttpProtocolOptions",
                "common_http_protocol_options": {"idle_timeout": f"{POOL_IDLE_TIMEOUT_S}s"},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
    }


def _endpoint(port: int) -> Obj:
    return {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}


def router_configmap(owner: Owner, namespace: str) -> Obj:
    """Envoy's bootstrap, as JSON (YAML's subset), for the router pods."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, router_name(owner.name), namespace),
        "data": {ENVOY_FILE: json.dumps(envoy_config(), indent=1, sort_keys=True)},
    }


#: GIE's ``EndpointPickerConfig``, the picker's plugins and how it weighs them (:func:`picker_config`).
PICKER_CONFIG_API_VERSION = "inference.networking.x-k8s.io/v1alpha1"


#: The picker's scrape of each pod's ``/metrics``, and what it reads there for an engine of ours.
METRICS_SOURCE, METRICS_EXTRACTOR, ENGINE = "metrics-data-source", "core-metrics-extractor", "neuronfleet"


def engine_metrics(lora_affinity: bool = False) -> Obj:
    """Which series the picker reads from our engine: vLLM's, but running requests from
    :data:`metrics.REQUESTS_IN_FLIGHT`; with ``lora_affinity``, the adapters each replica runs (vLLM's
    :data:`metrics.LORA_INFO`)."""
    return {
        "name": ENGINE,
        "queuedRequestsSpec": metrics.WAITING,
        # vLLM's running gauge changes as each step ends: a replica in a long prefill looks idle in it throughout.
        "runningRequestsSpec": metrics.REQUESTS_IN_FLIGHT,
        "kvUsageSpec": metrics.KV_CACHE_USAGE,
        # Without adapters the engine exports no LoRA series, which the picker would log as missing on every scrape.
        "loraSpec": metrics.LORA_INFO if lora_affinity else "",
        "cacheInfoSpec": metrics.CACHE_CONFIG,
    }


def scoring_of(spec: api.NeuronInferenceServiceSpec, images: RouterImages) -> PickerScoring:
    """The scoring of a service with ``spec.routing``, for a picker run from ``images``."""
    return PickerScoring(
        prefix_cache_weight=0.0 if spec.routing is None else spec.routing.prefix_cache_weight,
        block_size=spec.engine.block_size,
        # With LoRA slots the engines export their adapters (none loaded yet, or some): the picker reads them.
        lora_affinity=spec.lora is not None,
        inflight_tokens=images.picker_inflight_tokens,
        step_tokens=spec.engine.max_num_batched_tokens,
    )


def picker_config(scoring: PickerScoring = PickerScoring()) -> Obj:
    """The picker's scoring for Neuron replicas: the waiting queue, the running requests, the KV cache.

    The scorers and their weights are the contract's (:meth:`PickerScoring.scorers`); this renders them as GIE's
    config. GIE's default weighs the waiting queue and KV usage (and prefix-cache locality, which here is a
    service's choice: ``spec.routing.prefixCacheWeight``). A
    Neuron replica in a long prefill shows none waiting: the running-requests scorer sees it busy, reading
    the engine's live :data:`metrics.REQUESTS_IN_FLIGHT` (:func:`engine_metrics`), since vLLM's gauges change only
    as each step ends and a long prefill is one long step. GIE's in-flight token scorer would do as well from
    the picker's side, but GIE v1.5.0's config loader refuses it (its producer's and scorer's declared
    types never compare equal); neuronfleet's picker build scores the same count with a scorer of its own
    (``inflight_tokens``). It matters most within a scrape: a long prompt just sent shows in the engine's
    figures only when the picker next reads them, and a short request routed in between would land behind it.
    With a ``prefix_cache_weight``, locality is weighed beside load. With
    ``lora_affinity`` (a service with LoRA slots), GIE's LoRA affinity scorer prefers replicas already running
    the adapter a request names, so its requests share decode batches.
    """
    scorers = scoring.scorers()
    plugins: list[Obj] = []
    for scorer in scorers:
        if scorer.producer is not None:
            plugins.append({"type": scorer.producer})
        plugins.append({"type": scorer.type, **({"parameters": dict(scorer.parameters)} if scorer.parameters else {})})
    return {
        "apiVersion": PICKER_CONFIG_API_VERSION,
        "kind": "EndpointPickerConfig",
        "plugins": [
            *plugins,
            {"type": "max-score-picker"},
            {"type": METRICS_SOURCE},
            {
                "type": METRICS_EXTRACTOR,
                "parameters": {"defaultEngine": ENGINE, "engineConfigs": [engine_metrics(scoring.lora_affinity)]},
            },
        ],
        "dataLayer": {"sources": [{"pluginRef": METRICS_SOURCE, "extractors": [{"pluginRef": METRICS_EXTRACTOR}]}]},
        "schedulingProfiles": [
            {
                "name": "default",
                "plugins": [
                    *({"pluginRef": scorer.type, "weight": scorer.weight} for scorer in scorers),
                    {"pluginRef": "max-score-picker"},
                ],
            }
        ],
    }


@dataclass(frozen=True)
class PickerPorts:
    """A picker's ports: ext_proc (gRPC), its gRPC health, its metrics."""

    grpc: int = PICKER_PORT
    health: int = PICKER_HEALTH_PORT
    metrics: int = PICKER_METRICS_PORT
    #: Before each port's name: a second picker in the pod names its ports apart (15 characters at most).
    prefix: str = ""

    def container_ports(self) -> list[Obj]:
        """The container's ports, named."""
        health = "health" if self.prefix else "grpc-health"
        named = (("grpc", self.grpc), (health, self.health), ("metrics", self.metrics))
        return [{"name": f"{self.prefix}{name}", "containerPort": port} for name, port in named]


#: The canary's picker, beside the stable revision's in a router pod.
CANARY_PICKER_PORTS = PickerPorts(
    CANARY_PICKER_PORT, CANARY_PICKER_HEALTH_PORT, CANARY_PICKER_METRICS_PORT, prefix="canary-"
)


def picker_args(
    pool: str, namespace: str, scoring: PickerScoring = PickerScoring(), ports: PickerPorts = PickerPorts()
) -> list[str]:
    """The picker's command line: its pool and ``scoring``; no tracing exporter; metrics without token review."""
    return [
        f"--pool-name={pool}",
        f"--pool-namespace={namespace}",
        f"--grpc-port={ports.grpc}",
        f"--grpc-health-port={ports.health}",
        f"--metrics-port={ports.metrics}",
        "--tracing=false",
        "--metrics-endpoint-auth=false",
        "--enable-pprof=false",
        "--zap-encoder=json",
        # Inline (JSON is YAML): a change of scoring rolls the router pods like any other change of theirs.
        f"--config-text={json.dumps(picker_config(scoring), sort_keys=True)}",
    ]


def envoy_drain_command() -> list[str]:
    """Envoy's preStop: start its graceful drain, then wait out the router's drain time.

    Envoy exits on SIGTERM at once, resetting the kept-alive connections it holds: a client that reuses one
    (most do) gets a transport error, though kube-proxy sends it nowhere new. Draining first makes each
    response close its connection (``--drain-strategy immediate``), so clients reconnect to a router that
    stays. The admin API takes only a POST, from the pod itself; the image has bash and no HTTP client, so
    bash's ``/dev/tcp`` sends it.
    """
    request = (
        "POST /drain_listeners?graceful HTTP/1.1\\r\\nHost: localhost\\r\\nContent-Length: 0\\r\\n"
        "Connection: close\\r\\n\\r\\n"
    )
    script = (
        f"exec 3<>/dev/tcp/127.0.0.1/{ENVOY_ADMIN_PORT} && printf '{request}' >&3 && read -r -t 5 status <&3; "
        f"sleep {ROUTER_DRAIN_SECONDS}"
    )
    return ["/bin/bash", "-c", script]


def envoy_container(images: RouterImages, split: RevisionSplit | None = None) -> Obj:
    """The router pod's Envoy: the bootstrap from its ConfigMap (with a ``split``, inline: the pod's own, fixed
    for its life), a drain before it stops."""
    config = (
        ("-c", f"{ENVOY_CONFIG_DIR}/{ENVOY_FILE}")
        if split is None
        else ("--config-yaml", json.dumps(envoy_config(split), sort_keys=True))
    )
    return {
        "name": "envoy",
        "image": images.envoy,
        "args": [
            *config,
            *("--log-level", "warn", "--concurrency", "2"),
            # Once draining, every response closes its connection, and the listener closes before the grace ends.
            *("--drain-strategy", "immediate", "--drain-time-s", str(ROUTER_DRAIN_SECONDS - 5)),
        ],
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": ENVOY_PORT}],
        "readinessProbe": {"tcpSocket": {"port": ENVOY_PORT}, "periodSeconds": 2},
        "lifecycle": {"preStop": {"exec": {"command": envoy_drain_command()}}},
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
        "securityContext": {**container_security(), "runAsUser": ENVOY_USER, "runAsGroup": ENVOY_USER},
        "volumeMounts": [{"name": "envoy", "mountPath": ENVOY_CONFIG_DIR, "readOnly": True}],
    }


def picker_container(
    name: str, pool: str, namespace: str, images: RouterImages, scoring: PickerScoring, ports: PickerPorts
) -> Obj:
    """A picker of the router pod, for ``pool``, ready only once its ext_proc port listens."""
    grpc_probe = {"grpc": {"port": ports.health, "service": "inference-extension"}}
    return {
        "name": name,
        "image": images.picker,
        "args": picker_args(pool, namespace, scoring, ports),
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "ports": ports.container_ports(),
        # GIE's health service turns SERVING once the pool has synced, while its ext_proc server may still be
        # making its 4,096-bit TLS key, refusing Envoy (a 500 for each request, seen after a restart): no
        # readiness before ext_proc listens.
        "startupProbe": {"tcpSocket": {"port": ports.grpc}, "periodSeconds": 1, "failureThreshold": 120},
        "readinessProbe": {**grpc_probe, "periodSeconds": 2},
        "livenessProbe": {**grpc_probe, "initialDelaySeconds": 5, "periodSeconds": 10},
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_DRAIN_SECONDS}}},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {**container_security(), "runAsUser": PICKER_USER, "runAsGroup": PICKER_USER},
    }


def router_deployment(
    owner: Owner,
    namespace: str,
    routing: api.Routing,
    images: RouterImages,
    scoring: PickerScoring,
    split: RevisionSplit | None = None,
) -> Obj:
    """The router pods: the picker (scoring by ``scoring``) and its Envoy side by side, each finishing what it
    holds before it stops. With a ``split``, a second picker for the canary's pool, and the split named on
    the pods (a new one rolls them)."""
    containers = [picker_container("epp", owner.name, namespace, images, scoring, PickerPorts())]
    template_metadata: Obj = {"labels": router_pods(owner.name)}
    if split is not None:
        canary = picker_container(
            "epp-canary", canary_pool_name(owner.name), namespace, images, scoring, CANARY_PICKER_PORTS
        )
        containers.append(canary)
        template_metadata["annotations"] = {SPLIT_ANNOTATION: split.describe()}
    containers.append(envoy_container(images, split))
    pods = router_pods(owner.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, router_name(owner.name), namespace),
        "spec": {
            "replicas": routing.replicas,
            "selector": {"matchLabels": pods},
            "template": {
                "metadata": template_metadata,
                "spec": {
                    **_placement(routing),
                    # Router pods on different nodes where they can be: losing one node loses one router.
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {"matchLabels": pods},
                                        "topologyKey": HOSTNAME_LABEL,
                                    },
                                }
                            ]
                        }
                    },
                    "serviceAccountName": picker_name(owner.name),
                    "terminationGracePeriodSeconds": ROUTER_DRAIN_SECONDS + 5,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": containers,
                    "volumes": [{"name": "envoy", "configMap": {"name": router_name(owner.name)}}],
                },
            },
        },
    }


def _placement(routing: api.Routing) -> Obj:
    placement: Obj = {}
    if routing.node_selector:
        placement["nodeSelector"] = dict(routing.node_selector)
    if routing.tolerations:
        placement["tolerations"] = [t.model_dump(mode="json", exclude_none=True) for t in routing.tolerations]
    return placement


def router_services(owner: Owner, namespace: str, canary_pool: bool = False) -> list[Obj]:
    """``<name>-router`` (HTTP, what users send requests to) and ``<name>-epp`` (the pool's picker, for a Gateway;
    with a ``canary_pool``, the canary pool's picker on a port of its own)."""
    pods = router_pods(owner.name)

    def service(name: str, *ports: Obj) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _metadata(owner, name, namespace),
            "spec": {"selector": pods, "ports": [{"protocol": "TCP", **port} for port in ports]},
        }

    pickers = [("grpc", PICKER_PORT), *([("canary-grpc", CANARY_PICKER_PORT)] if canary_pool else [])]
    return [
        service(router_name(owner.name), {"name": HTTP_PORT_NAME, "port": HTTP_PORT, "targetPort": ENVOY_PORT}),
        service(
            picker_name(owner.name),
            *({"name": name, "port": port, "targetPort": port, "appProtocol": "http2"} for name, port in pickers),
        ),
    ]


def router_disruption_budget(owner: Owner, namespace: str) -> Obj:
    """Voluntary evictions take one router pod at a time: with two or more, a node drain never stops routing."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner, router_name(owner.name), namespace),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": router_pods(owner.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def router_objects(
    owner: Owner,
    namespace: str,
    routing: api.Routing,
    images: RouterImages,
    scoring: PickerScoring = PickerScoring(),
    split: RevisionSplit | None = None,
    canary_pool: bool = False,
) -> list[Obj]:
    """Everything the standalone picker runs with, in apply order (access and config before the pods); with a
    ``split``, the canary's picker and Envoy's weights; with a ``canary_pool``, its picker's port."""
    return [
        *picker_access(owner, namespace),
        router_configmap(owner, namespace),
        router_deployment(owner, namespace, routing, images, scoring, split),
        router_disruption_budget(owner, namespace),
        *router_services(owner, namespace, canary_pool),
    ]
