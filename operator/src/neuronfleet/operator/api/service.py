"""``NeuronInferenceService``: a model served on AWS Neuron, its spec and its status.

``spec.engine`` is the engine's own ``EngineConfig``: the same fields, defaults
and bucket rules as ``engine.yaml``. Kubernetes fields are camelCase; the engine
block keeps the engine's snake_case names, so it can be copied from an
``engine.yaml`` as is. The admission rules of each model are in
:mod:`neuronfleet.operator.api.rules`.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

from pydantic import Field

from neuronfleet.contract import metrics
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import DEFAULT_INSTANCE_TYPE, INSTANCE_TYPES, InstanceType, InstanceTypeName
from neuronfleet.contract.identity import CompileIdentity, LogicalNeuronCores, ModelSource
from neuronfleet.contract.lora import LoraAdapter, LoraRank, LoraSlots
from neuronfleet.contract.sim_settings import Device
from neuronfleet.operator import __version__
from neuronfleet.operator.api import rules
from neuronfleet.operator.api.artifact import ArtifactPhase
from neuronfleet.operator.api.common import CompileSettings
from neuronfleet.operator.api.k8s import (
    CONDITIONS_SCHEMA,
    IMAGE_PATTERN,
    PRESENCE_MATTERS,
    QUANTITY_PATTERN,
    AnnotationValue,
    Condition,
    K8sModel,
    LabelValue,
    Toleration,
)
from neuronfleet.operator.api.rollout import MAX_ARTIFACT_HISTORY, DrainSettings, RolloutSettings

DEFAULT_IMAGE = f"neuronfleet/engine:{__version__}"


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


#: How replicas get Neuron devices: the Neuron DRA driver's claims, or the device plugin's extended resource.
DeviceAllocation = Literal["dra", "devicePlugin"]


class Placement(K8sModel):
    """How replicas get their Neuron devices, and the logical NeuronCores those devices run at."""

    devices: DeviceAllocation | None = Field(
        None,
        description=(
            "dra: each replica gets a ResourceClaim (the Neuron DRA driver, DeviceClass neuron.aws.com) for the "
            "devices its tensor parallelism needs, all in one NeuronLink-connected group, at this spec's "
            "logicalNeuronCores. devicePlugin: it requests aws.amazon.com/neuron devices (the Neuron device plugin). "
            "Unset: the operator's default (the chart's neuronDevices; auto picks dra where the cluster has the "
            "DeviceClass neuron.aws.com). With device sim only dra does anything: replicas also claim devices, "
            "from a driver publishing simulated ones (a rehearsal of placement)."
        ),
    )
    logical_neuron_cores: LogicalNeuronCores | None = Field(
        None,
        description=(
            "Physical NeuronCores per logical core (LNC): 2 (the default on trn2 and trn3) pairs them, 1 runs each "
            "alone (twice the logical cores a device, each half as strong; trn1 and inf2 take only 1). It changes "
            "the compiled graphs (a new artifact) and the devices engine.tensor_parallel_size needs."
        ),
    )


#: The most replicas autoscaling may ask for: beyond this a fleet is several services, not one.
MAX_AUTOSCALED_REPLICAS = 100


class WarmFloor(K8sModel):
    """A floor under the autoscaled replicas that follows the load: the replicas that absorb a rise of ``step``
    during a new replica's start, no request waiting longer than ``ttftSeconds`` for it (``docs/fleet.md``)."""

    step_percent: int = Field(
        100,
        ge=0,
        le=1000,
        description=(
            "The rise in load absorbed while replicas start, in percent (100: doubling); with followTrend, the "
            "headroom kept above the load projected a start ahead."
        ),
    )
    ttft_seconds: float = Field(
        2.0, gt=0, le=600, description="The longest a request may wait for the replicas the rise brings: the TTFT SLO."
    )
    window_seconds: int = Field(
        300, ge=30, le=3600, description="The window of the devices' busy time the load is read from."
    )
    follow_trend: bool = Field(
        False,
        description=(
            "Project the load a replica's start ahead along its rise (the busy time over the window's last fifth "
            "against the whole window's), and keep stepPercent above that: a floor that follows a day's rise "
            "instead of holding a fixed step's headroom all day (docs/fleet.md, 'Scaling that looks ahead')."
        ),
    )


class Autoscaling(K8sModel):
    """Replicas that follow the engine's own load signals: KEDA and the HPA it drives, on the scale subresource.

    The defaults are sized for Neuron: a new replica loads its NEFFs and weights for minutes, so
    replicas are added a few at a time and removed only after the load has stayed low for a while.
    """

    admission_rules = rules.AUTOSCALING

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
        description=f"Target of {metrics.WAITING} per replica: requests queued beyond this add replicas.",
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
        description=f"Target of {metrics.KV_CACHE_USAGE} (0-1) averaged over replicas; unset: not a trigger.",
    )
    ttft_p95_seconds: float | None = Field(
        None,
        gt=0,
        le=600,
        description=f"An SLO guard: time to first token p95 ({metrics.TIME_TO_FIRST_TOKEN}) above this scales up.",
    )
    prefill_backlog_seconds: float | None = Field(
        None,
        gt=0,
        le=600,
        description=(
            "The token-aware signal: seconds of prefill work one replica may have queued "
            f"({metrics.PREFILL_TOKENS_PENDING} over the {metrics.PREFILL_TOKENS_PER_SECOND} each replica timed at "
            "warm-up); more adds replicas. "
            "Reads a long prompt as the work it is, where the waiting queue counts it as one. About half the TTFT "
            "SLO; unset: not a trigger."
        ),
    )
    warm_floor: WarmFloor | None = Field(
        None,
        description=(
            "Keep enough replicas serving that a rise in load is absorbed while new ones start (minutes on Neuron), "
            "sized from the devices' recent busy time and the replicas' measured start time; unset: no floor."
        ),
        # Present ({} for the defaults), the operator adds the trigger: no default object in the CRD.
        json_schema_extra={PRESENCE_MATTERS: True},
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


class Routing(K8sModel):
    """Inference-aware routing: the operator runs an Endpoint Picker for the service's InferencePool."""

    replicas: int = Field(
        1,
        ge=1,
        le=10,
        description=(
            "Router pods, each an Endpoint Picker (Gateway API Inference Extension) with an Envoy in front of it. "
            "Send requests to the Service <name>-router (port 8000): each goes to the replica the picker chooses "
            "by the engines' waiting and running requests and KV cache, not at random. Two or more keep routing "
            "when one is lost; they prefer different nodes, and a PodDisruptionBudget drains one at a time."
        ),
    )
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=16,
        description="Node labels router pods require (they need no Neuron device: a CPU pool, typically).",
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16, description="Router pod tolerations.")
    prefix_cache_weight: float = Field(
        0,
        ge=0,
        le=10,
        description=(
            "How much the picker weighs prefix-cache locality (GIE's prefix-cache scorer: it hashes each prompt in "
            "the engines' KV blocks and remembers which replica it sent them to) beside load (the waiting queue "
            "weighs 2, running requests 1, the KV cache 1, and with neuronfleet's picker build the tokens in "
            "flight 2). With it, a conversation or a shared system prompt goes back to the replica that holds it "
            "cached instead of being prefilled again elsewhere. make bench-prefix runs it at 4, which kept every "
            "turn of its conversations on their replica. 0 (the default): load alone."
        ),
    )
    kv_events: bool = Field(
        False,
        description=(
            "Serving pods publish their KV cache events (vLLM's: every block cached or evicted, msgpack over ZMQ "
            "PUB) on port 5557, the recent ones replayed on 5558, for a precise prefix-cache scorer that reads "
            "what each engine holds (llm-d's). Changing it rolls the replicas; nothing is compiled."
        ),
    )


class Lora(K8sModel):
    """LoRA adapters on compiled slots: the slot shape is compiled, the adapters are only loaded."""

    admission_rules = rules.LORA

    max_loras: int = Field(
        ge=1,
        le=64,
        description="LoRA slots in the compiled graphs: adapters loaded at once. A change compiles a new artifact.",
    )
    max_lora_rank: LoraRank = Field(
        16,
        description="The largest adapter rank a slot holds (8 to 256). A change compiles a new artifact.",
    )
    adapters: list[LoraAdapter] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "The adapters every replica loads before it is Ready, at most maxLoras. Adding or removing one rolls "
            "the replicas out on the same artifact: nothing is compiled."
        ),
    )

    def slots(self) -> LoraSlots:
        """The slot shape, as the compile identity takes it."""
        return LoraSlots(max_loras=self.max_loras, max_lora_rank=self.max_lora_rank)


class NeuronInferenceServiceSpec(K8sModel):
    """The desired state of a served model: what to compile, where to run it, how to change it."""

    admission_rules = rules.SERVICE_SPEC

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
    placement: Placement = Field(
        default_factory=Placement, description="How replicas get Neuron devices (DRA or device plugin), at what LNC."
    )
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
            f"Replicas that follow {metrics.WAITING} (and optionally KV cache usage and TTFT p95), "
            "through a KEDA ScaledObject on this service's scale subresource. Needs KEDA and Prometheus "
            "(the chart's autoscaling values)."
        ),
    )
    lora: Lora | None = Field(
        None,
        description=(
            "LoRA adapters served beside the model, each by its name as the request's model, in slots compiled into "
            "the graphs (maxLoras of rank up to maxLoraRank). Behind spec.routing the picker prefers replicas "
            "already running the adapter asked for."
        ),
    )
    routing: Routing | None = Field(
        None,
        description=(
            "Run an Endpoint Picker and Envoy for this service (GIE's standalone pattern), at the Service "
            "<name>-router. Without it the service still gets an InferencePool, for a Gateway that picks. "
            "Needs the InferencePool CRD (inference.networking.k8s.io/v1)."
        ),
        # Present means "run a picker": the CRD must not fill it in (see crdgen).
        json_schema_extra={PRESENCE_MATTERS: True},
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
        return self.instance.devices_for(self.engine.tensor_parallel_size, self.placement.logical_neuron_cores)

    def identity(self) -> CompileIdentity:
        """The compiled artifact this spec serves."""
        return CompileIdentity.of(
            self.model,
            self.engine,
            self.instance.target,
            self.image,
            self.device,
            self.placement.logical_neuron_cores,
            None if self.lora is None else self.lora.slots(),
        )


ServicePhase = Literal[
    "Pending",
    "Invalid",
    "Compiling",
    "CompileFailed",
    "Blocked",
    "RollingOut",
    "Ready",
    "Unschedulable",
    "Canary",
    "CanaryAborted",
]

CanaryPhase = Literal["Progressing", "Promoted", "Aborted"]


class CanaryStatus(K8sModel):
    """Where a canary of the target revision stands."""

    revision: str = Field(max_length=64, description="The artifact hash on trial.")
    phase: CanaryPhase = Field(
        description="Progressing through the steps, Promoted (it rolls out to all) or Aborted (its replicas gone)."
    )
    step: int = Field(0, ge=0, description="The step it is at (0: the first); the number of steps once promoted.")
    weight: int = Field(0, ge=0, le=100, description="The share the step asks for, percent.")
    canary_replicas: int = Field(0, ge=0, description="Replicas of the new revision.")
    stable_replicas: int = Field(0, ge=0, description="Replicas of the stable revision beside them.")
    step_started_at: datetime.datetime | None = Field(
        None, description="When the step's replicas were all Ready (its pause counts from then)."
    )
    analysis: str | None = Field(None, max_length=1024, description="The last analysis, with its figures.")


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
        description=(
            "Validated, ArtifactReady, Available, Ready, Routing and Degraded, and Autoscaling with spec.autoscaling."
        ),
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
    previous_revisions: list[Annotated[str, Field(max_length=64)]] = Field(
        default_factory=list,
        max_length=MAX_ARTIFACT_HISTORY,
        description=(
            "Artifact hashes served before the current revision, newest first: the artifacts kept for a "
            "rollback (spec.rollout.artifactHistoryLimit)."
        ),
    )
    selector: str | None = Field(None, max_length=512, description="Label selector of the serving pods (for scaling).")
    canary: CanaryStatus | None = Field(None, description="The target revision's canary, with spec.rollout.canary.")


def parse_service_spec(spec: object) -> NeuronInferenceServiceSpec:
    """Validate a service spec as read from the API server."""
    return NeuronInferenceServiceSpec.model_validate(spec)
