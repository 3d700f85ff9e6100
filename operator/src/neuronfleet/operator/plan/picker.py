"""The Endpoint Picker of a router pod (GIE's EPP): its config, its command line, its container.

The picker scores replicas for Neuron (:func:`picker_config`): by their waiting queue, their *running*
requests and their KV cache. A Neuron replica runs one prefill per step, so one holding a long prompt is busy
for its whole prefill while vLLM counts it as one running request, which GIE's default queue scorer (waiting
requests only) does not see.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from neuronfleet.contract import metrics
from neuronfleet.contract.picker import PickerScoring
from neuronfleet.operator.plan.shared import Obj, container_security

#: The picker's gRPC port (ext_proc), its gRPC health port, and its metrics port: GIE's defaults.
PICKER_PORT = 9002


PICKER_HEALTH_PORT = 9003


PICKER_METRICS_PORT = 9090


#: With a canary behind the router, its own picker's ports, beside the stable picker's in the router pod.
CANARY_PICKER_PORT = 9012


CANARY_PICKER_HEALTH_PORT = 9013


CANARY_PICKER_METRICS_PORT = 9091


#: How long a stopping router pod keeps routing what it holds: it leaves the Service's endpoints at once,
#: both containers wait this long before their SIGTERM (Envoy ends its streams then), the kubelet 5 s more.
ROUTER_DRAIN_SECONDS = 30


#: GIE's distroless EPP image runs as nonroot (65532), Envoy's image as envoy (101).
PICKER_USER = 65532


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


def picker_container(
    name: str, pool: str, namespace: str, image: str, scoring: PickerScoring, ports: PickerPorts
) -> Obj:
    """A picker of the router pod, for ``pool``, ready only once its ext_proc port listens."""
    grpc_probe = {"grpc": {"port": ports.health, "service": "inference-extension"}}
    return {
        "name": name,
        "image": image,
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
