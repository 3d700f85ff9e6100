"""The operator's API: ``NeuronInferenceService`` and ``NeuronCompiledArtifact``.

These pydantic models are the single source of truth: the CRDs in ``crds/`` are
generated from them (``neuronfleet-operator crds``), including the CEL rules that
reject invalid specs at admission, and the operator validates every object it
reads with the same models, so a spec that slips past admission (an older CRD, a
direct write) gets the same message in its status.

``spec.engine`` is the engine's own ``EngineConfig``: the same fields, defaults
and bucket rules as ``engine.yaml``. Kubernetes fields are camelCase; the engine
block keeps the engine's snake_case names, so it can be copied from an
``engine.yaml`` as is.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from neuronfleet.engine import names
from neuronfleet.engine.buckets import NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.engine.config import EngineConfig
from neuronfleet.engine.hardware import DEFAULT_INSTANCE_TYPE, INSTANCE_TYPES, InstanceType, InstanceTypeName
from neuronfleet.engine.identity import CompileIdentity, ModelSource
from neuronfleet.engine.sim_settings import Device
from neuronfleet.operator import __version__

VERSION = "v1alpha1"
API_VERSION = f"{names.GROUP}/{VERSION}"


@dataclass(frozen=True)
class KindNames:
    """How the API server names one of the operator's kinds (the CRDs and the client take them from here)."""

    kind: str
    plural: str
    short_names: tuple[str, ...]

    @property
    def singular(self) -> str:
        """The kind in lower case."""
        return self.kind.lower()


SERVICE_KIND = KindNames(names.SERVICE_KIND, names.SERVICE_PLURAL, ("nis",))
ARTIFACT_KIND = KindNames(names.ARTIFACT_KIND, names.ARTIFACT_PLURAL, ("nca",))

DEFAULT_IMAGE = f"neuronfleet/engine:{__version__}"

#: Kubernetes resource quantities ("4", "500m", "16Gi").
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
#: A container image reference: registry/path:tag or @digest, no spaces.
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/:@-]*[a-zA-Z0-9._:@-]*$"
#: Where compiled artifacts are kept: a PersistentVolumeClaim (with an optional sub-path) or an S3 prefix.
STORE_PATTERN = r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[A-Za-z0-9._/-]*)?|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9._/-]*)?)$"
#: A DNS-1123 subdomain: the name of a ServiceAccount or a Secret.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
#: An http(s) endpoint for an S3-compatible service.
ENDPOINT_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._/-]*)?$"
#: An AWS region name.
REGION_PATTERN = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$"
#: A Kubernetes condition reason: CamelCase.
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

#: A label value (keys are bounded by the map's size for CEL cost estimates).
LabelValue = Annotated[str, Field(max_length=63)]
AnnotationValue = Annotated[str, Field(max_length=1024)]


def _cel_map(values: dict[str, int]) -> str:
    """A CEL map literal, so admission rules read the hardware catalogue the operator does."""
    return "{" + ", ".join(f"'{key}': {value}" for key, value in sorted(values.items())) + "}"


_CEL_CORES_PER_DEVICE = _cel_map({name: t.cores_per_device for name, t in INSTANCE_TYPES.items()})
_CEL_DEVICES = _cel_map({name: t.devices for name, t in INSTANCE_TYPES.items()})


def field_errors(title: str, errors: list[tuple[tuple[str | int, ...], str, object]]) -> ValidationError:
    """A ``ValidationError`` with one ``(location, message, input)`` entry per broken rule."""
    return ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(type=PydanticCustomError("spec", message), loc=loc, input=value)
            for loc, message, value in errors
        ],
    )


class K8sModel(BaseModel):
    """A Kubernetes-style object part: camelCase on the wire, strict, immutable."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class Toleration(K8sModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(None, max_length=316, description="The taint key; empty with operator Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, max_length=63, description="The taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint effect matched; empty matches all."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="For NoExecute: how long the pod stays bound.")


class CompileResources(K8sModel):
    """CPU and memory for a compile pod (neuronx-cc runs on CPU)."""

    cpu: str = Field("4", pattern=QUANTITY_PATTERN, max_length=32, description="CPU request and limit.")
    memory: str = Field("16Gi", pattern=QUANTITY_PATTERN, max_length=32, description="Memory request and limit.")


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


class ServingResources(K8sModel):
    """What one serving replica asks of a node."""

    neuron_devices: int | None = Field(
        None,
        ge=1,
        le=16,
        description=(
            "Neuron devices (aws.amazon.com/neuron) per replica. Default: the fewest that hold "
            "engine.tensor_parallel_size logical NeuronCores (4 per Trainium2 device with LNC=2, "
            "2 per Trainium or Inferentia2 device)."
        ),
    )
    cpu: str | None = Field(None, pattern=QUANTITY_PATTERN, max_length=32, description="CPU request per replica.")
    memory: str | None = Field(None, pattern=QUANTITY_PATTERN, max_length=32, description="Memory request per replica.")


class RolloutSettings(K8sModel):
    """How a new revision replaces the serving one."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.maxSurge + self.maxUnavailable > 0",
                    "message": "rollout.maxSurge and rollout.maxUnavailable cannot both be 0",
                }
            ]
        }
    )

    max_surge: int = Field(1, ge=0, le=100, description="Extra replicas started during a rollout.")
    max_unavailable: int = Field(
        0,
        ge=0,
        le=100,
        description=(
            "Replicas that may be unready during a rollout. 0 (the default): surge first, "
            "never below the ready replicas."
        ),
    )
    startup_timeout_seconds: int = Field(
        1800,
        ge=60,
        le=14_400,
        description="How long a replica may take to load the model and artifact before it is restarted.",
    )

    @model_validator(mode="after")
    def _check_not_both_zero(self) -> Self:
        if self.max_surge + self.max_unavailable == 0:
            raise field_errors(
                type(self).__name__, [((), "rollout.maxSurge and rollout.maxUnavailable cannot both be 0", 0)]
            )
        return self


class DrainSettings(K8sModel):
    """How a replica stops without dropping the generations it is serving."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": (
                        "!has(self.terminationGracePeriodSeconds) || "
                        "self.terminationGracePeriodSeconds > self.preStopSeconds + self.drainTimeoutSeconds"
                    ),
                    "messageExpression": (
                        "'drain.terminationGracePeriodSeconds (%d) must exceed preStopSeconds + "
                        "drainTimeoutSeconds (%d)'.format([self.terminationGracePeriodSeconds, "
                        "self.preStopSeconds + self.drainTimeoutSeconds])"
                    ),
                }
            ]
        }
    )

    pre_stop_seconds: int = Field(
        10, ge=0, le=300, description="Wait before stopping, while endpoints stop sending new requests."
    )
    drain_timeout_seconds: int = Field(
        120, ge=0, le=3600, description="How long in-flight requests may run after the stop signal."
    )
    termination_grace_period_seconds: int | None = Field(
        None,
        ge=1,
        le=7200,
        description="Pod termination grace. Default: preStopSeconds + drainTimeoutSeconds + 15.",
    )

    @property
    def grace_seconds(self) -> int:
        """The termination grace in force."""
        if self.termination_grace_period_seconds is not None:
            return self.termination_grace_period_seconds
        return self.pre_stop_seconds + self.drain_timeout_seconds + 15

    @model_validator(mode="after")
    def _check_grace(self) -> Self:
        grace = self.termination_grace_period_seconds
        needed = self.pre_stop_seconds + self.drain_timeout_seconds
        if grace is not None and grace <= needed:
            message = (
                f"drain.terminationGracePeriodSeconds ({grace}) must exceed "
                f"preStopSeconds + drainTimeoutSeconds ({needed})"
            )
            raise field_errors(type(self).__name__, [((), message, grace)])
        return self


#: The most replicas autoscaling may ask for: beyond this a fleet is several services, not one.
MAX_AUTOSCALED_REPLICAS = 100


class Autoscaling(K8sModel):
    """Replicas that follow the engine's own load signals: KEDA and the HPA it drives, on the scale subresource.

    The defaults are sized for Neuron: a new replica loads its NEFFs and weights for minutes, so
    replicas are added a few at a time and removed only after the load has stayed low for a while.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "messageExpression": (
                        "'autoscaling.minReplicas (%d) must not exceed autoscaling.maxReplicas (%d)'"
                        ".format([self.minReplicas, self.maxReplicas])"
                    ),
                }
            ]
        }
    )

    min_replicas: int = Field(
        1,
        ge=0,
        le=MAX_AUTOSCALED_REPLICAS,
        description=(
            "Fewest replicas. 0 scales an idle service to zero; requests sent while no replica exists fail "
            "unless a request buffer (a gateway's endpoint picker) holds them."
        ),
    )
    max_replicas: int = Field(ge=1, le=MAX_AUTOSCALED_REPLICAS, description="Most replicas.")
    waiting_requests_per_replica: int = Field(
        4,
        ge=1,
        le=10_000,
        description="Target of vllm:num_requests_waiting per replica: requests queued beyond this add replicas.",
    )
    activation_waiting_requests: int = Field(
        0,
        ge=0,
        le=10_000,
        description="With minReplicas 0: waiting requests above this wake the service from zero.",
    )
    kv_cache_usage: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Target of vllm:kv_cache_usage_perc (0-1) averaged over replicas; unset: not a trigger.",
    )
    ttft_p95_seconds: float | None = Field(
        None,
        gt=0,
        le=600,
        description="An SLO guard: time to first token p95 (vllm:time_to_first_token_seconds) above this scales up.",
    )
    polling_interval_seconds: int = Field(15, ge=1, le=3600, description="How often KEDA reads the metrics.")
    scale_up_replicas: int = Field(
        2, ge=1, le=MAX_AUTOSCALED_REPLICAS, description="Most replicas added per scaleUpPeriodSeconds."
    )
    scale_up_period_seconds: int = Field(
        120,
        ge=1,
        le=1800,
        description="The scale-up rate's period: about a cold start, so replicas still loading are not added twice.",
    )
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, le=3600, description="Load must stay low this long before replicas are removed."
    )
    cooldown_period_seconds: int = Field(
        300, ge=0, le=86_400, description="With minReplicas 0: idle this long after the last activity before zero."
    )
    initial_cooldown_period_seconds: int = Field(
        1800,
        ge=0,
        le=86_400,
        description="With minReplicas 0: no scaling to zero this long after autoscaling starts (the first load).",
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if self.min_replicas > self.max_replicas:
            message = (
                f"autoscaling.minReplicas ({self.min_replicas}) must not exceed "
                f"autoscaling.maxReplicas ({self.max_replicas})"
            )
            raise field_errors(type(self).__name__, [((), message, self.min_replicas)])
        return self


#: Only the scaler writes spec.replicas of an autoscaled service (through the scale subresource): a
#: manifest naming both is refused, while the scaler's writes to one already autoscaled pass.
_REPLICAS_RULE: JsonValue = {
    "rule": "!has(self.autoscaling) || !has(self.replicas) || (oldSelf.hasValue() && has(oldSelf.value().autoscaling))",
    "optionalOldSelf": True,
    "message": (
        "replicas and autoscaling are exclusive: with autoscaling, KEDA sets spec.replicas through the "
        "scale subresource; remove spec.replicas"
    ),
    "fieldPath": ".replicas",
}

_NEURON_DEVICES_RULES: list[JsonValue] = [
    {
        "rule": (
            "!has(self.resources.neuronDevices) || self.resources.neuronDevices * "
            f"{_CEL_CORES_PER_DEVICE}[self.instanceType] >= self.engine.tensor_parallel_size"
        ),
        "messageExpression": (
            "'resources.neuronDevices (%d) holds %d logical NeuronCores on %s, fewer than "
            "engine.tensor_parallel_size (%d)'.format([self.resources.neuronDevices, "
            f"self.resources.neuronDevices * {_CEL_CORES_PER_DEVICE}[self.instanceType], self.instanceType, "
            "self.engine.tensor_parallel_size])"
        ),
        "fieldPath": ".resources.neuronDevices",
    },
    {
        "rule": (
            f"!has(self.resources.neuronDevices) || self.resources.neuronDevices <= {_CEL_DEVICES}[self.instanceType]"
        ),
        "messageExpression": (
            "'resources.neuronDevices (%d) exceeds the %d Neuron devices of one %s'.format("
            f"[self.resources.neuronDevices, {_CEL_DEVICES}[self.instanceType], self.instanceType])"
        ),
        "fieldPath": ".resources.neuronDevices",
    },
    {
        "rule": "self.device != 'sim' || !has(self.resources.neuronDevices)",
        "message": (
            "resources.neuronDevices is for device neuron: a sim replica requests resources.cpu and resources.memory"
        ),
        "fieldPath": ".resources.neuronDevices",
    },
    {
        "rule": (
            f"self.engine.tensor_parallel_size <= {_CEL_DEVICES}[self.instanceType] * "
            f"{_CEL_CORES_PER_DEVICE}[self.instanceType]"
        ),
        "messageExpression": (
            "'engine.tensor_parallel_size (%d) exceeds the %d logical NeuronCores of one %s'.format("
            f"[self.engine.tensor_parallel_size, {_CEL_DEVICES}[self.instanceType] * "
            f"{_CEL_CORES_PER_DEVICE}[self.instanceType], self.instanceType])"
        ),
        "fieldPath": ".engine.tensor_parallel_size",
    },
]


class NeuronInferenceServiceSpec(K8sModel):
    """The desired state of a served model: what to compile, where to run it, how to change it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [*_NEURON_DEVICES_RULES, _REPLICAS_RULE]})

    model: ModelSource = Field(description="The model served.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description=(
            "The engine configuration, as in engine.yaml: limits, compiled bucket sets, tensor parallelism, "
            "dtype. Changing a compile-relevant field compiles a new artifact before anything rolls out."
        ),
    )
    instance_type: InstanceTypeName = Field(
        DEFAULT_INSTANCE_TYPE,
        description="The Neuron instance type replicas run on (node.kubernetes.io/instance-type).",
    )
    device: Device = Field(
        "neuron",
        description=(
            "neuron: replicas run on Neuron devices of instanceType nodes. sim: the simulated Neuron device "
            "on CPU, with instanceType's cost model, to rehearse a fleet: pods request CPU and memory "
            "(resources.cpu, resources.memory) instead of Neuron devices and run on any node; the artifact is "
            "simulated and never shared with a neuron one."
        ),
    )
    resources: ServingResources = Field(default_factory=ServingResources, description="Per-replica resources.")
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=16,
        description=(
            "Node labels serving pods require, besides the instance type's label that neuron replicas "
            "always require (for example a staging pool's label for sim replicas)."
        ),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=16,
        description="Serving pod tolerations, besides the Neuron taint's that neuron replicas always carry.",
    )
    replicas: int | None = Field(
        None,
        ge=0,
        le=1000,
        description="Serving replicas (default 1). With autoscaling: minReplicas, then KEDA's; not in manifests.",
    )
    autoscaling: Autoscaling | None = Field(
        None,
        description=(
            "Replicas that follow vllm:num_requests_waiting (and optionally KV cache usage and TTFT p95), "
            "through a KEDA ScaledObject on this service's scale subresource. Needs KEDA and Prometheus "
            "(the chart's autoscaling values)."
        ),
    )
    image: str = Field(
        DEFAULT_IMAGE,
        pattern=IMAGE_PATTERN,
        max_length=512,
        description="The engine image; it compiles and serves, so it is part of the artifact identity.",
    )
    pod_annotations: dict[str, AnnotationValue] = Field(
        default_factory=dict, max_length=16, description="Annotations on serving pods (metrics scraping, policies)."
    )
    compile: CompileSettings = Field(
        default_factory=CompileSettings, description="Compile Jobs and the artifact store."
    )
    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="Rollout of new revisions.")
    drain: DrainSettings = Field(default_factory=DrainSettings, description="Graceful stop of replicas.")

    @property
    def instance(self) -> InstanceType:
        """The instance type's Neuron shape."""
        return INSTANCE_TYPES[self.instance_type]

    @property
    def desired_replicas(self) -> int:
        """The replicas asked for: the scaler's (within bounds; minReplicas until it writes), the user's, or 1."""
        if self.autoscaling is None:
            return 1 if self.replicas is None else self.replicas
        bounds = self.autoscaling
        wanted = bounds.min_replicas if self.replicas is None else self.replicas
        return min(max(wanted, bounds.min_replicas), bounds.max_replicas)

    @property
    def neuron_devices(self) -> int:
        """Neuron devices per replica: as given, else derived from tensor parallelism."""
        if self.resources.neuron_devices is not None:
            return self.resources.neuron_devices
        return self.instance.devices_for(self.engine.tensor_parallel_size)

    def identity(self) -> CompileIdentity:
        """The compiled artifact this spec serves."""
        return CompileIdentity.of(self.model, self.engine, self.instance.target, self.image, self.device)

    @model_validator(mode="after")
    def _check_neuron_fit(self) -> Self:
        instance, tp, given = self.instance, self.engine.tensor_parallel_size, self.resources.neuron_devices
        errors: list[tuple[tuple[str | int, ...], str, object]] = []
        where = ("resources", "neuronDevices")
        if given is not None and given * instance.cores_per_device < tp:
            errors.append(
                (
                    where,
                    f"resources.neuronDevices ({given}) holds {given * instance.cores_per_device} logical NeuronCores "
                    f"on {instance.name}, fewer than engine.tensor_parallel_size ({tp})",
                    given,
                )
            )
        if given is not None and given > instance.devices:
            errors.append(
                (
                    where,
                    f"resources.neuronDevices ({given}) exceeds the {instance.devices} Neuron devices "
                    f"of one {instance.name}",
                    given,
                )
            )
        if given is not None and self.device == "sim":
            errors.append(
                (
                    where,
                    "resources.neuronDevices is for device neuron: "
                    "a sim replica requests resources.cpu and resources.memory",
                    given,
                )
            )
        if tp > instance.cores:
            errors.append(
                (
                    ("engine", "tensor_parallel_size"),
                    f"engine.tensor_parallel_size ({tp}) exceeds the {instance.cores} logical NeuronCores "
                    f"of one {instance.name}",
                    tp,
                )
            )
        if errors:
            raise field_errors(type(self).__name__, errors)
        return self


class NeuronCompiledArtifactSpec(CompileIdentity):
    """A compiled artifact: its identity (immutable: the name is its hash) and how to compile it."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "a compiled artifact is immutable: its name is its content hash"}
            ]
        },
    )

    compile: CompileSettings = Field(
        default_factory=CompileSettings,
        description="How the compile Job runs; from the service that first needed this artifact.",
    )

    def identity(self) -> CompileIdentity:
        """The identity alone, without compile settings."""
        return CompileIdentity(
            model=self.model, engine=self.engine, target=self.target, image=self.image, device=self.device
        )


# Status


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(K8sModel):
    """A metav1.Condition."""

    type: str = Field(max_length=316, description="Validated, ArtifactReady, Available, Ready or Autoscaling.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, pattern=REASON_PATTERN, description="Why, in one CamelCase word.")
    message: str = Field("", max_length=32768, description="Why, for humans.")
    last_transition_time: datetime.datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(None, ge=0, description="The spec generation this condition is about.")


CONDITIONS_SCHEMA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}

ServicePhase = Literal[
    "Pending", "Invalid", "Compiling", "CompileFailed", "Blocked", "RollingOut", "Ready", "Unschedulable"
]
ArtifactPhase = Literal["Pending", "Compiling", "Ready", "Failed"]


class ArtifactStatusRef(K8sModel):
    """The artifact a service's spec asks for."""

    name: str = Field(max_length=253, description="The NeuronCompiledArtifact's name.")
    hash: str = Field(max_length=64, description="Its identity hash.")
    phase: ArtifactPhase = Field(description="Its phase.")


class NeuronInferenceServiceStatus(K8sModel):
    """What the operator observed and did."""

    phase: ServicePhase = Field("Pending", description="A one-word summary; the conditions say why.")
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        description="Validated, ArtifactReady, Available and Ready, and Autoscaling with spec.autoscaling.",
        json_schema_extra=CONDITIONS_SCHEMA,
    )
    observed_generation: int | None = Field(None, ge=0, description="The spec generation last acted on.")
    artifact: ArtifactStatusRef | None = Field(None, description="The artifact the spec asks for.")
    desired_replicas: int = Field(0, ge=0, description="Replicas asked for (by spec.replicas or the autoscaler).")
    replicas: int = Field(0, ge=0, description="Serving pods, any revision.")
    ready_replicas: int = Field(0, ge=0, description="Ready serving pods, any revision.")
    updated_replicas: int = Field(0, ge=0, description="Serving pods of the target revision.")
    current_revision: str | None = Field(
        None, max_length=64, description="Artifact hash all replicas ran at the last completed rollout."
    )
    target_revision: str | None = Field(None, max_length=64, description="Artifact hash the spec asks for.")
    selector: str | None = Field(None, max_length=512, description="Label selector of the serving pods (for scaling).")


BucketState = Literal["Pending", "Compiled", "Failed"]


class BucketProgress(K8sModel):
    """One compiled shape."""

    kind: Literal["prefill", "decode"] = Field(
        description=f"prefill ({NUM_BATCHED_TOKENS_BUCKETS}) or decode ({NUM_SEQS_BUCKETS})."
    )
    size: int = Field(ge=1, description="Tokens (prefill) or sequences (decode).")
    state: BucketState = Field(description="Pending, Compiled or Failed.")


class NeuronCompiledArtifactStatus(K8sModel):
    """Where a compile stands."""

    phase: ArtifactPhase = Field("Pending", description="Pending, Compiling, Ready or Failed.")
    hash: str | None = Field(None, max_length=64, description="The identity hash of the spec.")
    reason: str | None = Field(None, max_length=1024, description="Why it is in this phase (the Job's reason).")
    message: str | None = Field(None, max_length=32768, description="Details, such as the compiler's last words.")
    attempts: int = Field(0, ge=0, description="Compile pods started.")
    job: str | None = Field(None, max_length=253, description="The compile Job.")
    location: str | None = Field(None, max_length=1024, description="The artifact's directory in the store.")
    buckets: list[BucketProgress] = Field(
        default_factory=list, max_length=128, description="Per-bucket progress, as far as it is known."
    )
    started_at: datetime.datetime | None = Field(None, description="When the compile Job started.")
    completed_at: datetime.datetime | None = Field(None, description="When it succeeded or failed.")
    observed_generation: int | None = Field(None, ge=0, description="The generation last acted on.")


def parse_service_spec(spec: object) -> NeuronInferenceServiceSpec:
    """Validate a service spec as read from the API server."""
    return NeuronInferenceServiceSpec.model_validate(spec)


def parse_artifact_spec(spec: object) -> NeuronCompiledArtifactSpec:
    """Validate an artifact spec as read from the API server."""
    return NeuronCompiledArtifactSpec.model_validate(spec)


def describe_errors(error: ValidationError, prefix: str = "spec") -> str:
    """``spec.field.path: message`` per error, joined by ``; ``: the exact validation messages."""
    parts = []
    for entry in error.errors():
        path = ".".join([prefix, *(str(p) if not isinstance(p, int) else f"[{p}]" for p in entry["loc"])])
        parts.append(f"{path.replace('.[', '[')}: {entry['msg']}")
    return "; ".join(parts)


def is_bucket_error(error: ValidationError) -> bool:
    """Whether a bucket rule is among the errors (reason InvalidBuckets, not InvalidSpec)."""
    return any(entry["type"] == "bucket" for entry in error.errors())
