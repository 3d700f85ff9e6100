"""The Envoy of a router pod: it asks the picker beside it (ext_proc, on localhost) which replica takes each
request and sends it there; with a canary behind the router, it first splits requests between the revisions by
weight (:class:`RevisionSplit`), each revision's picker choosing within it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from neuronfleet.contract.names import HTTP_KEEP_ALIVE_S, HTTP_PORT_NAME, TRACK_CANARY
from neuronfleet.operator.plan.picker import CANARY_PICKER_PORT, PICKER_PORT, ROUTER_DRAIN_SECONDS
from neuronfleet.operator.plan.shared import Obj, container_security

#: Envoy's listener, and its admin port (on localhost only).
ENVOY_PORT = 8081


ENVOY_ADMIN_PORT = 19000


#: With a canary, the loopback listeners, one a revision, that Envoy's listener splits requests between.
STABLE_LISTENER_PORT = 8091


CANARY_LISTENER_PORT = 8092


#: With a canary, the response header naming the revision the router sent the request to: stable or canary.
TRACK_HEADER = "x-neuronfleet-track"


TRACK_STABLE = "stable"


#: The header through which the picker tells Envoy the replica it chose (GIE's protocol).
DESTINATION_HEADER = "x-gateway-destination-endpoint"


#: The response header naming the replica (``ip:port``) that answered: what a client sees of the choice.
UPSTREAM_HEADER = "x-neuronfleet-endpoint"


#: The response header naming the router pod (Envoy's host name) that routed the request.
ROUTER_HEADER = "x-neuronfleet-router"


ENVOY_FILE = "envoy.yaml"


ENVOY_CONFIG_DIR = "/etc/envoy"
#: The router pod's volume of Envoy's bootstrap (the router's ConfigMap).
ENVOY_VOLUME = "envoy"


ENVOY_USER = 101


@dataclass(frozen=True)
class RevisionSplit:
    """A canary behind the router: the stable revision's pool takes ``100 - canary_weight`` percent of the
    requests, the canary's ``canary_weight``."""

    stable_revision: str
    canary_weight: int

    def describe(self) -> str:
        """The split in words, as the router pods' :data:`SPLIT_ANNOTATION` carries it."""
        return f"stable {self.stable_revision} {100 - self.canary_weight}%, canary {self.canary_weight}%"


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


def envoy_container(image: str, split: RevisionSplit | None = None) -> Obj:
    """The router pod's Envoy: the bootstrap from its ConfigMap (with a ``split``, inline: the pod's own, fixed
    for its life), a drain before it stops."""
    config = (
        ("-c", f"{ENVOY_CONFIG_DIR}/{ENVOY_FILE}")
        if split is None
        else ("--config-yaml", json.dumps(envoy_config(split), sort_keys=True))
    )
    return {
        "name": "envoy",
        "image": image,
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
        "volumeMounts": [{"name": ENVOY_VOLUME, "mountPath": ENVOY_CONFIG_DIR, "readOnly": True}],
    }
