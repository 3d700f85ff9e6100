"""The compile side of the plan: a service's artifact, and the artifact's ConfigMap and compile Job."""

from __future__ import annotations

import re

from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.contract.invocation import CompileInvocation
from neuronfleet.operator import api
from neuronfleet.operator.plan.shared import (
    CONFIG_DIR,
    ENGINE_COMMAND,
    ENGINE_FILE,
    Obj,
    Owner,
    artifact_labels,
    container_security,
    engine_config_volume,
    engine_yaml,
    env_from,
    pod_metadata,
    pod_security,
    service_account,
    store_access,
    store_path,
)


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


def artifact(owner: Owner, namespace: str, spec: api.NeuronInferenceServiceSpec) -> Obj:
    """The NeuronCompiledArtifact a service needs, owned (not controlled) by it: services share it."""
    identity = spec.identity()
    artifact_spec = api.NeuronCompiledArtifactSpec.compiling(identity, spec.compile)
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


def compile_invocation(spec: api.NeuronCompiledArtifactSpec) -> CompileInvocation:
    """The engine's compile command: it recomputes the hash and refuses a mismatch."""
    return CompileInvocation(
        config=f"{CONFIG_DIR}/{ENGINE_FILE}",
        model=spec.model.uri,
        revision=spec.model.revision,
        target=spec.target,
        engine_image=spec.image,
        artifact_store=store_path(spec.compile),
        artifact_hash=spec.hash(),
        device=spec.device,
        logical_neuron_cores=spec.logical_neuron_cores,
        max_loras=None if spec.lora is None else spec.lora.max_loras,
        max_lora_rank=None if spec.lora is None else spec.lora.max_lora_rank,
    )


def compile_job(owner: Owner, namespace: str, spec: api.NeuronCompiledArtifactSpec) -> Obj:
    """The artifact's one compile Job: on CPU nodes, with a deadline and retries."""
    settings = spec.compile
    labels = artifact_labels(spec.hash())
    config_volume, config_mount = engine_config_volume(owner.name)
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
                "metadata": pod_metadata(labels, settings.pod_annotations),
                "spec": {
                    "restartPolicy": "Never",
                    **service_account(settings),
                    # IRSA and Pod Identity project their own token; the API token is never needed.
                    "automountServiceAccountToken": False,
                    "nodeSelector": dict(settings.node_selector),
                    "tolerations": [t.model_dump(mode="json", exclude_none=True) for t in settings.tolerations],
                    "securityContext": pod_security(),
                    "containers": [
                        {
                            "name": "compile",
                            "image": spec.image,
                            "command": [ENGINE_COMMAND],
                            "args": compile_invocation(spec).args(),
                            "env": [{"name": "HOME", "value": "/tmp"}, *access.env],
                            **env_from(access),
                            "resources": {"requests": resources, "limits": resources},
                            "securityContext": container_security(),
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
