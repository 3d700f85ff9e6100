"""The serving side of the plan: a service's engine ConfigMap, Deployment, Service and PodDisruptionBudget."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from neuronfleet.contract.hardware import INSTANCE_TYPE_LABEL, NEURON_DEVICE_RESOURCE, NEURON_TAINT_KEY
from neuronfleet.contract.invocation import ServeInvocation
from neuronfleet.contract.names import (
    HTTP_PORT,
    HTTP_PORT_NAME,
    KV_EVENTS_PORT,
    KV_EVENTS_REPLAY_PORT,
    LABEL_ARTIFACT,
    LABEL_QUARANTINED,
    LABEL_TRACK,
    REPLICA_ENV,
    TRACK_CANARY,
)
from neuronfleet.contract.sim_settings import START_TIME_SCALE_ENV, Device
from neuronfleet.contract.start_time import predict_model_start
from neuronfleet.operator import api
from neuronfleet.operator.plan.devices import NEURON_CLAIM, claim_template, claims_devices, lnc_env, pod_claims
from neuronfleet.operator.plan.shared import (
    CONFIG_DIR,
    ENGINE_COMMAND,
    ENGINE_FILE,
    HOSTNAME_LABEL,
    MANAGED_BY,
    Obj,
    Owner,
    container_security,
    engine_config_volume,
    engine_configmap_name,
    engine_yaml,
    env_from,
    pod_metadata,
    pod_security,
    service_account,
    service_labels,
    serving_labels,
    store_access,
    store_path,
)

#: What a replica on the simulated device asks for when resources.cpu and resources.memory are unset:
#: vLLM's API server and engine core with a small model, on CPU.
SIM_CPU = "2"
SIM_MEMORY = "6Gi"


@dataclass(frozen=True)
class ServedArtifact:
    """The artifact serving pods load: its hash and the store it was compiled into."""

    name: str
    hash: str
    store: api.CompileSettings


def engine_configmap(owner: Owner, namespace: str, spec: api.NeuronInferenceServiceSpec, artifact_hash: str) -> Obj:
    """The engine configuration serving pods mount."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owner.child_metadata(
            engine_configmap_name(owner.name, spec.engine),
            namespace,
            {**service_labels(owner.name), LABEL_ARTIFACT: artifact_hash, **MANAGED_BY},
        ),
        "data": {ENGINE_FILE: engine_yaml(spec.engine)},
    }


def serve_invocation(spec: api.NeuronInferenceServiceSpec, served: ServedArtifact) -> ServeInvocation:
    """The engine's serve command, pinned to one artifact, on the instance type it runs on.

    The instance type picks the simulated device's cost model, and on Neuron the step times the prefill cap
    (``auto``) is derived from.
    """
    return ServeInvocation(
        config=f"{CONFIG_DIR}/{ENGINE_FILE}",
        model=spec.model.uri,
        revision=spec.model.revision,
        artifact_store=store_path(served.store),
        artifact_hash=served.hash,
        port=HTTP_PORT,
        drain_timeout=spec.drain.drain_timeout_seconds,
        device=spec.device,
        instance_type=spec.instance_type,
        logical_neuron_cores=spec.identity().logical_neuron_cores,
        **lora_options(spec.lora),
        kv_events_port=KV_EVENTS_PORT if publishes_kv_events(spec) else None,
    )


def publishes_kv_events(spec: api.NeuronInferenceServiceSpec) -> bool:
    """Whether the serving pods publish their KV cache events (``spec.routing.kvEvents``)."""
    return spec.routing is not None and spec.routing.kv_events


def lora_options(lora: api.Lora | None) -> dict[str, Any]:
    """The serve command's LoRA options: the slots and every adapter; none without ``spec.lora``."""
    if lora is None:
        return {}
    adapters = tuple(adapter.cli_value() for adapter in lora.adapters)
    return {"max_loras": lora.max_loras, "max_lora_rank": lora.max_lora_rank, "lora_adapter": adapters}


#: How often the startup probe asks, by device: a Neuron replica loads for minutes, a simulated one
#: answers within seconds and would otherwise wait up to a whole period more to become Ready.
STARTUP_PROBE_PERIOD_S: dict[Device, int] = {"neuron": 10, "sim": 2}


#: How many times a replica's predicted start the startup probe waits: the prediction is a model, and a busy store
#: or node is slower than its figures.
STARTUP_MARGIN = 2.0


def startup_window_seconds(spec: api.NeuronInferenceServiceSpec) -> int:
    """Seconds a replica may take to start before it is restarted: ``startupTimeoutSeconds``, or twice the start
    predicted for its model (``contract/start_time.py``) when that is longer."""
    predicted = predict_model_start(spec.model.uri)
    if predicted is None:
        return spec.rollout.startup_timeout_seconds
    return max(spec.rollout.startup_timeout_seconds, math.ceil(STARTUP_MARGIN * predicted.total_s))


def _start_time_env(spec: api.NeuronInferenceServiceSpec, start_time_scale: float) -> list[Obj]:
    """A simulated replica's share of a Neuron replica's start time, when the operator's setting is not the whole."""
    if spec.device != "sim" or start_time_scale == 1.0:
        return []
    return [{"name": START_TIME_SCALE_ENV, "value": f"{start_time_scale:g}"}]


def _probes(spec: api.NeuronInferenceServiceSpec) -> Obj:
    period = STARTUP_PROBE_PERIOD_S[spec.device]
    return {
        # Loading weights and NEFFs takes minutes: the startup probe holds the others off until then.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": HTTP_PORT_NAME},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": -(-startup_window_seconds(spec) // period),
        },
        # Model-aware readiness: the model is listed only once it is loaded.
        "readinessProbe": {
            "httpGet": {"path": "/v1/models", "port": HTTP_PORT_NAME},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": HTTP_PORT_NAME},
            "periodSeconds": 15,
            "timeoutSeconds": 5,
            "failureThreshold": 4,
        },
    }


def _resources(spec: api.NeuronInferenceServiceSpec, claim: Obj | None) -> Obj:
    """A replica's requests and limits: Neuron devices (from the device plugin, or its ``claim``), or on the
    simulated device CPU and memory."""
    requests: Obj = {}
    limits: Obj = {}
    cpu, memory = spec.resources.cpu, spec.resources.memory
    if spec.device == "sim":
        cpu, memory = cpu or SIM_CPU, memory or SIM_MEMORY
    elif claim is None:
        requests[NEURON_DEVICE_RESOURCE] = limits[NEURON_DEVICE_RESOURCE] = str(spec.neuron_devices)
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = limits["memory"] = memory
    resources: Obj = {"requests": requests, "limits": limits}
    if claim is not None:
        resources["claims"] = [{"name": NEURON_CLAIM}]
    return resources


def _placement(spec: api.NeuronInferenceServiceSpec) -> Obj:
    """Neuron replicas go to the instance type's nodes, tolerating their taint; simulated ones where the user says."""
    selector = dict(spec.node_selector)
    tolerations = [t.model_dump(mode="json", exclude_none=True) for t in spec.tolerations]
    if spec.device == "neuron":
        selector[INSTANCE_TYPE_LABEL] = spec.instance_type
        tolerations.insert(0, {"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    placement: Obj = {"affinity": _away_from_faults()}
    if selector:
        placement["nodeSelector"] = selector
    if tolerations:
        placement["tolerations"] = tolerations
    return placement


def _away_from_faults() -> Obj:
    """Off the nodes of pods quarantined for a Neuron fault, any service's (``neuronfleet.operator.policy.health``):
    strictly for a node's fault, by preference for a device's (healing in place beats staying short)."""

    def near(selector: Obj) -> Obj:
        return {"labelSelector": selector, "namespaceSelector": {}, "topologyKey": HOSTNAME_LABEL}

    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [near({"matchLabels": {LABEL_QUARANTINED: "node"}})],
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": near({"matchExpressions": [{"key": LABEL_QUARANTINED, "operator": "Exists"}]}),
                }
            ],
        }
    }


def deployment(
    owner: Owner,
    namespace: str,
    spec: api.NeuronInferenceServiceSpec,
    served: ServedArtifact,
    claim: Obj | None = None,
    *,
    start_time_scale: float = 1.0,
) -> Obj:
    """The serving Deployment: Neuron nodes, pinned to one artifact, surge-first, draining on stop; with a
    ``claim`` template, its pods get their Neuron devices through DRA. Replicas on the simulated device spend
    ``start_time_scale`` of a Neuron replica's start time (``contract/start_time.py``)."""
    config_volume, config_mount = engine_config_volume(engine_configmap_name(owner.name, spec.engine))
    # Who the pods are is the service's business; where the artifact is, the artifact's.
    who = served.store.model_copy(
        update={
            "service_account_name": spec.compile.service_account_name or served.store.service_account_name,
            "s3": spec.compile.s3 or served.store.s3,
        }
    )
    access = store_access(who, read_only=True)
    adapter_volumes, adapter_mounts = node_adapters(spec.lora)
    container: Obj = {
        "name": "engine",
        "image": spec.image,
        "command": [ENGINE_COMMAND],
        "args": serve_invocation(spec, served).args(),
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "NEURONFLEET_ARTIFACT_HASH", "value": served.hash},
            # Every answer names its replica (X-Neuronfleet-Replica).
            {"name": REPLICA_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            *lnc_env(spec, claim),
            *_start_time_env(spec, start_time_scale),
            *access.env,
        ],
        **env_from(access),
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": HTTP_PORT, "protocol": "TCP"}, *_kv_event_ports(spec)],
        "resources": _resources(spec, claim),
        **_probes(spec),
        "securityContext": container_security(),
        # A device fault is the engine's own last line (neuronfleet.contract.faults); any other crash, its log's tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [config_mount, *access.mounts, {"name": "tmp", "mountPath": "/tmp"}, *adapter_mounts],
    }
    if spec.drain.pre_stop_seconds:
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": spec.drain.pre_stop_seconds}}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owner.child_metadata(owner.name, namespace, {**service_labels(owner.name), **MANAGED_BY}),
        "spec": {
            "replicas": spec.desired_replicas,
            "selector": {"matchLabels": service_labels(owner.name)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": spec.rollout.max_surge,
                    "maxUnavailable": spec.rollout.max_unavailable,
                },
            },
            "progressDeadlineSeconds": startup_window_seconds(spec) + 600,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": pod_metadata(serving_labels(owner.name, served.hash), spec.pod_annotations),
                "spec": {
                    **_placement(spec),
                    "terminationGracePeriodSeconds": spec.drain.grace_seconds,
                    **service_account(who),
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(),
                    "containers": [container],
                    "volumes": [config_volume, *access.volumes, {"name": "tmp", "emptyDir": {}}, *adapter_volumes],
                    **pod_claims(claim),
                },
            },
        },
    }


def _kv_event_ports(spec: api.NeuronInferenceServiceSpec) -> list[Obj]:
    if not publishes_kv_events(spec):
        return []
    return [
        {"name": "kv-events", "containerPort": KV_EVENTS_PORT, "protocol": "TCP"},
        {"name": "kv-replay", "containerPort": KV_EVENTS_REPLAY_PORT, "protocol": "TCP"},
    ]


def node_adapters(lora: api.Lora | None) -> tuple[list[Obj], list[Obj]]:
    """The node's folders of the LoRA adapters given by path, mounted read-only where the engine reads them."""
    local = [adapter for adapter in lora.adapters if adapter.source.startswith("/")] if lora is not None else []
    volumes = [
        {"name": f"lora-{adapter.name.lower()}"[:63], "hostPath": {"path": adapter.source, "type": "Directory"}}
        for adapter in local
    ]
    mounts = [
        {"name": volume["name"], "mountPath": adapter.source, "readOnly": True}
        for volume, adapter in zip(volumes, local, strict=True)
    ]
    return volumes, mounts


def service(owner: Owner, namespace: str) -> Obj:
    """The Service in front of the ready serving pods."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": owner.child_metadata(owner.name, namespace, {**service_labels(owner.name), **MANAGED_BY}),
        "spec": {
            "selector": service_labels(owner.name),
            "ports": [{"name": HTTP_PORT_NAME, "port": HTTP_PORT, "targetPort": HTTP_PORT_NAME, "protocol": "TCP"}],
        },
    }


def disruption_budget(owner: Owner, namespace: str) -> Obj:
    """Voluntary evictions (node drains) take one replica at a time; stuck unready pods never block them."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": owner.child_metadata(owner.name, namespace, {**service_labels(owner.name), **MANAGED_BY}),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": service_labels(owner.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


@dataclass(frozen=True)
class ServingPlan:
    """Everything a service serves with, by name."""

    configmap: Obj
    deployment: Obj
    service: Obj
    disruption_budget: Obj
    #: The ResourceClaimTemplate of the pods' Neuron devices, when DRA hands them out.
    claim_template: Obj | None = None

    @property
    def configmap_name(self) -> str:
        """The engine ConfigMap the Deployment's pods mount: kept while they run."""
        return str(self.configmap["metadata"]["name"])

    @property
    def pod_inputs(self) -> frozenset[str]:
        """The objects the pods read by name (the ConfigMap and claim template): kept while they run."""
        claim = () if self.claim_template is None else (str(self.claim_template["metadata"]["name"]),)
        return frozenset({self.configmap_name, *claim})


def serving_plan(
    owner: Owner,
    namespace: str,
    spec: api.NeuronInferenceServiceSpec,
    served: ServedArtifact,
    devices: api.DeviceAllocation = "devicePlugin",
    *,
    start_time_scale: float = 1.0,
) -> ServingPlan:
    """What a service serves ``served`` with; ``devices``: how Neuron replicas get theirs (the spec's, else the
    operator's default); ``start_time_scale``: the share of a Neuron replica's start simulated replicas spend."""
    claim = claim_template(owner, namespace, spec) if claims_devices(spec, devices) else None
    return ServingPlan(
        configmap=engine_configmap(owner, namespace, spec, served.hash),
        deployment=deployment(owner, namespace, spec, served, claim, start_time_scale=start_time_scale),
        service=service(owner, namespace),
        disruption_budget=disruption_budget(owner, namespace),
        claim_template=claim,
    )


def serving_objects(
    owner: Owner,
    namespace: str,
    spec: api.NeuronInferenceServiceSpec,
    served: ServedArtifact,
    devices: api.DeviceAllocation = "devicePlugin",
) -> list[Obj]:
    """Everything a service serves with, in apply order (what the pods read before the pods), for whoever
    applies them all alike: the bench, tests."""
    planned = serving_plan(owner, namespace, spec, served, devices)
    claim = [] if planned.claim_template is None else [planned.claim_template]
    return [planned.configmap, *claim, planned.deployment, planned.service, planned.disruption_budget]


def canary_name(service: str) -> str:
    """The Deployment of a service's canary replicas."""
    return f"{service}-canary"


def canary_plan(
    owner: Owner,
    namespace: str,
    spec: api.NeuronInferenceServiceSpec,
    served: ServedArtifact,
    replicas: int,
    devices: api.DeviceAllocation = "devicePlugin",
    *,
    start_time_scale: float = 1.0,
) -> ServingPlan:
    """What a canary of ``served`` runs with: ``replicas`` of it beside the stable revision's, in a Deployment of
    their own whose pods carry the canary track (the Service and the budget are the service's, selecting both)."""
    planned = serving_plan(owner, namespace, spec, served, devices, start_time_scale=start_time_scale)
    canary = planned.deployment
    track = {LABEL_TRACK: TRACK_CANARY}
    canary["metadata"]["name"] = canary_name(owner.name)
    canary["spec"]["replicas"] = replicas
    canary["spec"]["selector"]["matchLabels"].update(track)
    canary["spec"]["template"]["metadata"]["labels"].update(track)
    return replace(planned, deployment=canary)
