"""What both kinds share: how compile Jobs run and where they keep what they build.

A service's ``spec.compile`` is copied into the ``NeuronCompiledArtifact`` it
creates, so the artifact's compile Job runs as the service asked.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from neuronfleet.operator.api.k8s import (
    ENDPOINT_PATTERN,
    HOST_PATH_PATTERN,
    OBJECT_NAME_PATTERN,
    QUANTITY_PATTERN,
    REGION_PATTERN,
    SIZE_PATTERN,
    STORE_PATTERN,
    AnnotationValue,
    K8sModel,
    LabelValue,
    Toleration,
)


class CompileResources(K8sModel):
    """CPU and memory for a compile pod (neuronx-cc runs on CPU)."""

    cpu: str = Field("4", pattern=QUANTITY_PATTERN, max_length=32, description="CPU request and limit.")
    memory: str = Field("16Gi", pattern=QUANTITY_PATTERN, max_length=32, description="Memory request and limit.")


class NodeCache(K8sModel):
    """A directory on each node in which the serving replicas there share their copies of ``s3://`` artifacts."""

    host_path: str = Field(
        pattern=HOST_PATH_PATTERN,
        max_length=256,
        description=(
            "The node's directory (a hostPath volume of type Directory): it must exist and be writable by the "
            "engine's user, uid and gid 1000 (the node's bootstrap makes it; docs/operator.md shows how)."
        ),
    )
    size_limit: str = Field(
        "200Gi",
        pattern=SIZE_PATTERN,
        max_length=32,
        description=(
            "What the cache may hold: before a copy, the artifacts no replica on the node serves are evicted, "
            "least recently used first, until the new one fits."
        ),
    )


class S3Access(K8sModel):
    """How compile and serving pods reach an ``s3://`` artifact store; credentials never appear here."""

    region: str | None = Field(
        None,
        pattern=REGION_PATTERN,
        max_length=32,
        description="The bucket's region (AWS_REGION). Default: the pods' own (IRSA and Pod Identity set it).",
    )
    endpoint_url: str | None = Field(
        None,
        pattern=ENDPOINT_PATTERN,
        max_length=256,
        description="An S3-compatible endpoint instead of AWS's (AWS_ENDPOINT_URL_S3; STS stays AWS's).",
    )
    credentials_secret: str | None = Field(
        None,
        pattern=OBJECT_NAME_PATTERN,
        max_length=253,
        description=(
            "A Secret in the service's namespace whose keys become the pods' environment "
            "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), for clusters without IRSA or EKS Pod Identity."
        ),
    )
    node_cache: NodeCache | None = Field(
        None,
        description=(
            "Serving replicas on one node share their copies of each artifact in this directory: the first copies "
            "it from the store, the next start from local disk. Default: each pod copies into its own emptyDir."
        ),
    )


class CompileSettings(K8sModel):
    """How and where compile Jobs run, and where they keep what they build."""

    artifact_store: str = Field(
        "pvc://neuronfleet-artifacts",
        pattern=STORE_PATTERN,
        max_length=512,
        description=(
            "Where compiled artifacts are kept, one directory per artifact hash: pvc://CLAIM[/PATH] "
            "(a ReadWriteMany claim in the service's namespace, mounted by compile and serving pods) "
            "or s3://BUCKET[/PREFIX] (compile Jobs upload each artifact, serving pods download it "
            "before the engine starts; no volume)."
        ),
    )
    service_account_name: str | None = Field(
        None,
        pattern=OBJECT_NAME_PATTERN,
        max_length=253,
        description=(
            "The ServiceAccount compile and serving pods run as: for an s3:// store, the one IRSA "
            "(its eks.amazonaws.com/role-arn annotation) or an EKS Pod Identity association grants the "
            "bucket. Default: the namespace's default ServiceAccount."
        ),
    )
    s3: S3Access | None = Field(None, description="Region, endpoint and credentials for an s3:// store.")
    timeout_seconds: int = Field(
        7200,
        ge=60,
        le=172_800,
        description="Deadline of the compile Job (activeDeadlineSeconds), all retries included.",
    )
    backoff_limit: int = Field(2, ge=0, le=10, description="Compile retries before the artifact is Failed.")
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=16,
        description=(
            "Node labels compile pods require. Compile pods do not tolerate the Neuron taint, "
            "so by default they run on CPU nodes."
        ),
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16, description="Compile pod tolerations.")
    resources: CompileResources = Field(default_factory=CompileResources, description="Compile pod CPU and memory.")
    pod_annotations: dict[str, AnnotationValue] = Field(
        default_factory=dict, max_length=16, description="Annotations on compile pods (sidecar or policy opt-outs)."
    )

    @property
    def store_kind(self) -> Literal["pvc", "s3"]:
        """``pvc`` or ``s3``."""
        return "pvc" if self.artifact_store.startswith("pvc://") else "s3"

    @property
    def store_claim(self) -> str | None:
        """The PersistentVolumeClaim name of a ``pvc://`` store."""
        if self.store_kind != "pvc":
            return None
        return self.artifact_store.removeprefix("pvc://").split("/", 1)[0]

    @property
    def store_subpath(self) -> str:
        """The directory inside a ``pvc://`` claim ("" for its root)."""
        rest = self.artifact_store.removeprefix("pvc://").split("/", 1)
        return rest[1].strip("/") if len(rest) == 2 else ""
