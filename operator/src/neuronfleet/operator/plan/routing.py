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

This module wires the router's objects; the picker's own config and container are in ``plan/picker.py``, Envoy's
in ``plan/envoy.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from neuronfleet.contract.names import (
    HTTP_PORT,
    HTTP_PORT_NAME,
    LABEL_ARTIFACT,
    LABEL_INSTANCE,
    LABEL_SERVICE,
    LABEL_TRACK,
    TRACK_CANARY,
)
from neuronfleet.contract.picker import PickerScoring
from neuronfleet.operator import api
from neuronfleet.operator.plan.envoy import (
    ENVOY_FILE,
    ENVOY_PORT,
    ENVOY_VOLUME,
    RevisionSplit,
    envoy_config,
    envoy_container,
)
from neuronfleet.operator.plan.picker import (
    CANARY_PICKER_PORT,
    CANARY_PICKER_PORTS,
    PICKER_PORT,
    ROUTER_DRAIN_SECONDS,
    PickerPorts,
    picker_container,
)
from neuronfleet.operator.plan.shared import (
    HOSTNAME_LABEL,
    LABEL_COMPONENT,
    MANAGED_BY,
    Obj,
    Owner,
    service_labels,
)

POOL_API_VERSION = "inference.networking.k8s.io/v1"
#: The router pods' annotation naming the split they route by (absent: no canary); a new one rolls them.
SPLIT_ANNOTATION = "neuronfleet.io/revision-split"


@dataclass(frozen=True)
class RouterImages:
    """The images router pods run: the operator's flags (the chart's ``routing`` values).

    ``picker_inflight_tokens``: the picker image is neuronfleet's build (``tools/gie``), which has the
    :data:`INFLIGHT_TOKENS_SCORER`; GIE's own image refuses a config that names it.
    """

    picker: str = "registry.k8s.io/gateway-api-inference-extension/epp:v1.5.0"
    envoy: str = "docker.io/envoyproxy/envoy:v1.40.0"
    picker_inflight_tokens: bool = False


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
        LABEL_INSTANCE: service,
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


def router_configmap(owner: Owner, namespace: str) -> Obj:
    """Envoy's bootstrap, as JSON (YAML's subset), for the router pods."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, router_name(owner.name), namespace),
        "data": {ENVOY_FILE: json.dumps(envoy_config(), indent=1, sort_keys=True)},
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
    containers = [picker_container("epp", owner.name, namespace, images.picker, scoring, PickerPorts())]
    template_metadata: Obj = {"labels": router_pods(owner.name)}
    if split is not None:
        canary = picker_container(
            "epp-canary", canary_pool_name(owner.name), namespace, images.picker, scoring, CANARY_PICKER_PORTS
        )
        containers.append(canary)
        template_metadata["annotations"] = {SPLIT_ANNOTATION: split.describe()}
    containers.append(envoy_container(images.envoy, split))
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
                    "volumes": [{"name": ENVOY_VOLUME, "configMap": {"name": router_name(owner.name)}}],
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


def router_removal(owner: Owner, namespace: str) -> list[Obj]:
    """What :func:`router_objects` applies for any router of the service, in the order to delete it: the pods
    first, then what they used, the last applied first (the pools are not the router's)."""
    applied = router_objects(owner, namespace, api.Routing(), RouterImages())
    pods = [obj for obj in applied if obj["kind"] == "Deployment"]
    return pods + [obj for obj in reversed(applied) if obj["kind"] != "Deployment"]
