"""What the compile and the serving objects share: owners, names, labels, the engine file, the store, security."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from neuronfleet.contract.buckets import NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import ARTIFACT_CACHE_ENV, ARTIFACT_CACHE_LIMIT_ENV
from neuronfleet.contract.names import LABEL_ARTIFACT, LABEL_INSTANCE, LABEL_SERVICE, MANAGED_BY_LABEL, OPERATOR_NAME
from neuronfleet.operator import api

Obj = dict[str, Any]

LABEL_COMPONENT = "app.kubernetes.io/component"
MANAGED_BY = {MANAGED_BY_LABEL: OPERATOR_NAME}
#: Where two pods count as on the same node.
HOSTNAME_LABEL = "kubernetes.io/hostname"

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
        LABEL_INSTANCE: service,
        LABEL_COMPONENT: "serving",
        **MANAGED_BY,
        **service_labels(service),
        LABEL_ARTIFACT: artifact_hash,
    }


def serving_pod_selector(service: str) -> str:
    """The label selector of a service's serving pods, of every revision, quarantined ones included."""
    return f"{LABEL_INSTANCE}={service},{LABEL_COMPONENT}=serving"


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
    # Every service reconcile renders it twice (the ConfigMap and its name), and a fleet has few configurations:
    # rendered once each, by content.
    return _engine_yaml(engine.model_dump_json())


@functools.lru_cache(maxsize=256)
def _engine_yaml(engine_json: str) -> str:
    engine = EngineConfig.model_validate_json(engine_json)
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
    """A ``pvc://`` store is a mounted claim; an ``s3://`` one is the AWS environment and a local cache: the
    node's, shared and bounded, for serving pods (``read_only``) when the store names one, else the pod's own."""
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
    secrets = [] if s3.credentials_secret is None else [{"secretRef": {"name": s3.credentials_secret}}]
    cache: Obj = {"name": "artifact-cache", "emptyDir": {}}
    if read_only and s3.node_cache is not None:
        cache = {"name": "artifact-cache", "hostPath": {"path": s3.node_cache.host_path, "type": "Directory"}}
        env.append({"name": ARTIFACT_CACHE_LIMIT_ENV, "value": str(int(parse_quantity(s3.node_cache.size_limit)))})
    return StoreAccess([cache], [{"name": "artifact-cache", "mountPath": CACHE_MOUNT}], env, secrets)


def service_account(settings: api.CompileSettings) -> Obj:
    """The pod's ServiceAccount, when the user names one (IRSA or Pod Identity grant it the bucket)."""
    return {} if settings.service_account_name is None else {"serviceAccountName": settings.service_account_name}


def env_from(access: StoreAccess) -> Obj:
    """The container's ``envFrom``, when the store names a credentials Secret."""
    return {"envFrom": access.env_from} if access.env_from else {}


def pod_security() -> Obj:
    """The pod security context of compile and serving pods: the image's non-root user, seccomp."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> Obj:
    """The container security context: no privilege escalation, a read-only root, no capabilities."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_metadata(labels: dict[str, str], annotations: dict[str, str]) -> Obj:
    """A pod template's metadata: its labels, and the user's annotations when there are any."""
    meta: Obj = {"labels": labels}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def engine_config_volume(configmap: str) -> tuple[Obj, Obj]:
    """The volume of the engine ConfigMap ``configmap`` and its mount at :data:`CONFIG_DIR`."""
    return (
        {"name": CONFIG_VOLUME, "configMap": {"name": configmap}},
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
    )
