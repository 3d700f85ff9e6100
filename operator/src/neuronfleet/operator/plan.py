"""Pure planning: a spec in, the Kubernetes objects it wants out.

Nothing here talks to the API server. Every object is built whole, with a
deterministic name, so applying it twice changes nothing and a restarted
operator builds the same objects again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import yaml

from neuronfleet.engine.buckets import NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.engine.config import EngineConfig
from neuronfleet.engine.hardware import INSTANCE_TYPE_LABEL, NEURON_DEVICE_RESOURCE, NEURON_TAINT_KEY
from neuronfleet.engine.identity import ARTIFACT_CACHE_ENV, CompileIdentity
from neuronfleet.engine.names import (
    HTTP_PORT,
    HTTP_PORT_NAME,
    LABEL_ARTIFACT,
    LABEL_SERVICE,
    MANAGED_BY_LABEL,
    OPERATOR_NAME,
)
from neuronfleet.engine.sim_settings import Device
from neuronfleet.operator import api

Obj = dict[str, Any]

LABEL_COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = {MANAGED_BY_LABEL: OPERATOR_NAME}

CONFIG_DIR = "/etc/neuronfleet"
ENGINE_FILE = "engine.yaml"
STORE_MOUNT = "/var/lib/neuronfleet/artifacts"
#: Where pods of an s3:// store keep their local copy of the artifact (an emptyDir).
CACHE_MOUNT = "/var/cache/neuronfleet/artifacts"
ENGINE_COMMAND = "neuronfleet-engine"
CONFIG_HASH_LENGTH = 10
CONFIG_VOLUME = "config"
#: Non-root user and group of the engine image.
RUN_AS = 1000
#: What a replica on the simulated device asks for when resources.cpu and resources.memory are unset:
#: vLLM's API server and engine core with a small model, on CPU.
SIM_CPU = "2"
SIM_MEMORY = "6Gi"


@dataclass(frozen=True)
class Owner:
    """An object that owns others: enough to write an owner reference."""

    api_version: str
    kind: str
    name: str
    uid: str

    def reference(self, *, controller: bool = True) -> Obj:
        """The owner reference; a controller reference unless several owners share the dependent."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": controller,
            "blockOwnerDeletion": controller,
        }

    def child_metadata(self, name: str, namespace: str, labels: dict[str, str], *, controller: bool = True) -> Obj:
        """The metadata of an object this owner owns."""
        return {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [self.reference(controller=controller)],
        }

    @classmethod
    def of(cls, body: Obj) -> Owner:
        """The owner described by an object read from the API server."""
        meta = body["metadata"]
        return cls(body["apiVersion"], body["kind"], meta["name"], meta["uid"])


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].strip("-")
    return slug if slug and slug[0].isalpha() else f"m-{slug}".strip("-")[:limit]


def artifact_name(identity: CompileIdentity) -> str:
    """``<model>-<hash>``: readable, unique per identity, short enough for the Job's name."""
    model = identity.model.uri.rstrip("/").rsplit("/", 1)[-1]
    return f"{_slug(model, 30)}-{identity.hash()}"


def compile_job_name(artifact: str) -> str:
    """The one compile Job of an artifact."""
    return f"{artifact}-compile"


def engine_configmap_name(service: str, engine: EngineConfig) -> str:
    """Named by content: a changed configuration is a new ConfigMap, so the pods roll, and old pods
    keep theirs during the rollout (serving-only settings, such as scheduler options, share an artifact)."""
    digest = hashlib.sha256(engine_yaml(engine).encode()).hexdigest()[:CONFIG_HASH_LENGTH]
    return f"{service}-engine-{digest}"


def service_labels(service: str) -> dict[str, str]:
    """Labels on every object a service owns; the serving pods' selector."""
    return {LABEL_SERVICE: service}


def serving_labels(service: str, artifact_hash: str) -> dict[str, str]:
    """Labels of serving pods: pinned to the artifact they load."""
    return {
        "app.kubernetes.io/name": "neuronfleet-engine",
        "app.kubernetes.io/instance": service,
        LABEL_COMPONENT: "serving",
        **MANAGED_BY,
        **service_labels(service),
        LABEL_ARTIFACT: artifact_hash,
    }


def artifact_labels(artifact_hash: str) -> dict[str, str]:
    """Labels of an artifact and its compile objects."""
    return {
        "app.kubernetes.io/name": "neuronfleet-compile",
        LABEL_COMPONENT: "compile",
        **MANAGED_BY,
        LABEL_ARTIFACT: artifact_hash,
    }


def served_engine(engine: EngineConfig) -> EngineConfig:
    """The engine configuration with its bucket sets written out, as compiled."""
    return engine.model_copy(
        update={
            NUM_BATCHED_TOKENS_BUCKETS: engine.effective_num_batched_tokens_buckets,
            NUM_SEQS_BUCKETS: engine.effective_num_seqs_buckets,
        }
    )


def engine_yaml(engine: EngineConfig) -> str:
    """``engine.yaml`` as mounted into compile and serving pods."""
    return yaml.safe_dump(served_engine(engine).model_dump(mode="json"), sort_keys=False)


# Store


def store_path(settings: api.CompileSettings) -> str:
    """The store root as pods see it: the mounted claim's directory, or the S3 prefix."""
    if settings.store_kind == "s3":
        return settings.artifact_store.rstrip("/")
    return f"{STORE_MOUNT}/{settings.store_subpath}".rstrip("/")


def store_location(settings: api.CompileSettings, artifact_hash: str) -> str:
    """Where one artifact lives, as a URI (for status)."""
    return f"{settings.artifact_store.rstrip('/')}/{artifact_hash}"


@dataclass(frozen=True)
class StoreAccess:
    """What a compile or serving pod needs to reach the store: a claim mounted, or S3's environment."""

    volumes: list[Obj]
    mounts: list[Obj]
    env: list[Obj]
    env_from: list[Obj]


def store_access(settings: api.CompileSettings, *, read_only: bool) -> StoreAccess:
    """A ``pvc://`` store is a mounted claim; an ``s3://`` one is the AWS environment and a local cache."""
    if settings.store_claim is not None:
        volume = {
            "name": "artifacts",
            "persistentVolumeClaim": {"claimName": settings.store_claim, "readOnly": read_only},
        }
        mount = {"name": "artifacts", "mountPath": STORE_MOUNT, "readOnly": read_only}
        return StoreAccess([volume], [mount], [], [])
    s3 = settings.s3 or api.S3Access()
    env = [{"name": ARTIFACT_CACHE_ENV, "value": CACHE_MOUNT}]
    if s3.region is not None:
        env.append({"name": "AWS_REGION", "value": s3.region})
    if s3.endpoint_url is not None:
        # S3's own endpoint variable: a web identity (IRSA) still goes to AWS's STS.
        env.append({"name": "AWS_ENDPOINT_URL_S3", "value": s3.endpoint_url})
    # The credentials stay in their Secret: the pod's environment reads them, no object here holds them.
    env_from = [] if s3.credentials_secret is None else [{"secretRef": {"name": s3.credentials_secret}}]
    cache = {"name": "artifact-cache", "emptyDir": {}}
    return StoreAccess([cache], [{"name": "artifact-cache", "mountPath": CACHE_MOUNT}], env, env_from)


def _service_account(settings: api.CompileSettings) -> Obj:
    """The pod's ServiceAccount, when the user names one (IRSA or Pod Identity grant it the bucket)."""
    return {} if settings.service_account_name is None else {"serviceAccountName": settings.service_account_name}


def _env_from(access: StoreAccess) -> Obj:
    return {"envFrom": access.env_from} if access.env_from else {}


def _pod_security() -> Obj:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_metadata(labels: dict[str, str], annotations: dict[str, str]) -> Obj:
    meta: Obj = {"labels": labels}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def _config_volume(configmap: str) -> tuple[Obj, Obj]:
    return (
        {"name": CONFIG_VOLUME, "configMap": {"name": configmap}},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
    )


# Artifact and compile Job


def artifact(owner: Owner, namespace: str, spec: api.NeuronInferenceServiceSpec) -> Obj:
    """The NeuronCompiledArtifact a service needs, owned (not controlled) by it: services share it."""
    identity = spec.identity()
    artifact_spec = api.NeuronCompiledArtifactSpec(
        model=identity.model,
        engine=identity.engine,
        target=identity.target,
        image=identity.image,
        device=identity.device,
        compile=spec.compile,
    )
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.ARTIFACT_KIND.kind,
        "metadata": owner.child_metadata(
            artifact_name(identity), namespace, artifact_labels(identity.hash()), controller=False
        ),
        "spec": artifact_spec.model_dump(mode="json", exclude_none=True),
    }


def artifact_configmap(owner: Owner, namespace: str, spec: api.NeuronCompiledArtifactSpec) -> Obj:
    """The engine configuration the compile Job reads."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owner.child_metadata(owner.name, namespace, artifact_labels(spec.hash())),
        "data": {ENGINE_FILE: engine_yaml(spec.engine)},
    }


def _device_args(device: Device) -> list[str]:
    """``--device sim``, or nothing: neuron is the engine's default, and pods that ran before keep their spec."""
    return ["--device", device] if device != "neuron" else []


def compile_args(spec: api.NeuronCompiledArtifactSpec) -> list[str]:
    """The engine's compile command: it recomputes the hash and refuses a mismatch."""
    return [
        "compile",
        "--config",
        f"{CONFIG_DIR}/{ENGINE_FILE}",
        "--model",
        spec.model.uri,
        "--revision",
        spec.model.revision,
        "--target",
        spec.target,
        "--engine-image",
        spec.image,
        "--artifact-store",
        store_path(spec.compile),
        "--artifact-hash",
        spec.hash(),
        *_device_args(spec.device),
    ]


def compile_job(owner: Owner, namespace: str, spec: api.NeuronCompiledArtifactSpec) -> Obj:
    """The artifact's one compile Job: on CPU nodes, with a deadline and retries."""
    settings = spec.compile
    labels = artifact_labels(spec.hash())
    config_volume, config_mount = _config_volume(owner.name)
    access = store_access(settings, read_only=False)
    resources = {"cpu": settings.resources.cpu, "memory": settings.resources.memory}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": owner.child_metadata(compile_job_name(owner.name), namespace, labels),
        "spec": {
            "backoffLimit": settings.backoff_limit,
            "activeDeadlineSeconds": settings.timeout_seconds,
            "template": {
                "metadata": _pod_metadata(labels, settings.pod_annotations),
                "spec": {
                    "restartPolicy": "Never",
                    **_service_account(settings),
                    # IRSA and Pod Identity project their own token; the API token is never needed.
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(settings.node_selector),
                    "tolerations": [t.model_dump(mode="json", exclude_none=True) for t in settings.tolerations],
                    "securityContext": _pod_security(),
                    "containers": [
                        {
                            "name": "compile",
                            "image": spec.image,
                            "command": [ENGINE_COMMAND],
                            "args": compile_args(spec),
                            "env": [{"name": "HOME", "value": "/tmp"}, *access.env],
                            **_env_from(access),
                            "resources": {"requests": resources, "limits": resources},
                            "securityContext": _container_security(),
                            # The compiler's last lines become the artifact's failure message.
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                            "volumeMounts": [config_mount, *access.mounts, {"name": "tmp", "mountPath": "/tmp"}],
                        }
                    ],
                    "volumes": [config_volume, *access.volumes, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


# Serving objects


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


def serve_args(spec: api.NeuronInferenceServiceSpec, served: ServedArtifact) -> list[str]:
    """The engine's serve command, pinned to one artifact; on the simulated device, the instance's cost model."""
    device = _device_args(spec.device)
    if spec.device == "sim":
        device += ["--instance-type", spec.instance_type]
    return [
        "serve",
        "--config",
        f"{CONFIG_DIR}/{ENGINE_FILE}",
        "--model",
        spec.model.uri,
        "--revision",
        spec.model.revision,
        "--artifact-store",
        store_path(served.store),
        "--artifact-hash",
        served.hash,
        "--port",
        str(HTTP_PORT),
        "--drain-timeout",
        str(spec.drain.drain_timeout_seconds),
        *device,
    ]


#: How often the startup probe asks, by device: a Neuron replica loads for minutes, a simulated one
#: answers within seconds and would otherwise wait up to a whole period more to become Ready.
STARTUP_PROBE_PERIOD_S: dict[Device, int] = {"neuron": 10, "sim": 2}


def _probes(spec: api.NeuronInferenceServiceSpec) -> Obj:
    period = STARTUP_PROBE_PERIOD_S[spec.device]
    return {
        # Loading weights and NEFFs takes minutes: the startup probe holds the others off until then.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": HTTP_PORT_NAME},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": -(-spec.rollout.startup_timeout_seconds // period),
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


def _resources(spec: api.NeuronInferenceServiceSpec) -> Obj:
    """A replica's requests and limits: Neuron devices, or on the simulated device CPU and memory."""
    requests: Obj = {}
    limits: Obj = {}
    cpu, memory = spec.resources.cpu, spec.resources.memory
    if spec.device == "neuron":
        requests[NEURON_DEVICE_RESOURCE] = limits[NEURON_DEVICE_RESOURCE] = str(spec.neuron_devices)
    else:
        cpu, memory = cpu or SIM_CPU, memory or SIM_MEMORY
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = limits["memory"] = memory
    return {"requests": requests, "limits": limits}


def _placement(spec: api.NeuronInferenceServiceSpec) -> Obj:
    """Neuron replicas go to the instance type's nodes, tolerating their taint; simulated ones where the user says."""
    selector = dict(spec.node_selector)
    tolerations = [t.model_dump(mode="json", exclude_none=True) for t in spec.tolerations]
    if spec.device == "neuron":
        selector[INSTANCE_TYPE_LABEL] = spec.instance_type
        tolerations.insert(0, {"key": NEURON_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    placement: Obj = {}
    if selector:
        placement["nodeSelector"] = selector
    if tolerations:
        placement["tolerations"] = tolerations
    return placement


def deployment(owner: Owner, namespace: str, spec: api.NeuronInferenceServiceSpec, served: ServedArtifact) -> Obj:
    """The serving Deployment: Neuron nodes, pinned to one artifact, surge-first, draining on stop."""
    config_volume, config_mount = _config_volume(engine_configmap_name(owner.name, spec.engine))
    # Who the pods are is the service's business; where the artifact is, the artifact's.
    who = served.store.model_copy(
        update={
            "service_account_name": spec.compile.service_account_name or served.store.service_account_name,
            "s3": spec.compile.s3 or served.store.s3,
        }
    )
    access = store_access(who, read_only=True)
    container: Obj = {
        "name": "engine",
        "image": spec.image,
        "command": [ENGINE_COMMAND],
        "args": serve_args(spec, served),
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "NEURONFLEET_ARTIFACT_HASH", "value": served.hash},
            *access.env,
        ],
        **_env_from(access),
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "resources": _resources(spec),
        **_probes(spec),
        "securityContext": _container_security(),
        "volumeMounts": [config_mount, *access.mounts, {"name": "tmp", "mountPath": "/tmp"}],
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
            "progressDeadlineSeconds": spec.rollout.startup_timeout_seconds + 600,
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": _pod_metadata(serving_labels(owner.name, served.hash), spec.pod_annotations),
                "spec": {
                    **_placement(spec),
                    "terminationGracePeriodSeconds": spec.drain.grace_seconds,
                    **_service_account(who),
                    "automountServiceAccountToken": False,
                    "securityContext": _pod_security(),
                    "containers": [container],
                    "volumes": [config_volume, *access.volumes, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


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


def serving_objects(
    owner: Owner, namespace: str, spec: api.NeuronInferenceServiceSpec, served: ServedArtifact
) -> list[Obj]:
    """Everything a service serves with, in apply order (the config before the pods that mount it)."""
    return [
        engine_configmap(owner, namespace, spec, served.hash),
        deployment(owner, namespace, spec, served),
        service(owner, namespace),
        disruption_budget(owner, namespace),
    ]
