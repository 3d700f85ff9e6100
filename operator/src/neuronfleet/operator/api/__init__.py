"""The operator's API: ``NeuronInferenceService`` and ``NeuronCompiledArtifact``.

These pydantic models are the single source of truth: the CRDs in ``crds/`` are
generated from them (``neuronfleet-operator crds``), including the CEL rules that
reject invalid specs at admission, and the operator validates every object it
reads with the same models, so a spec that slips past admission (an older CRD, a
direct write) gets the same message in its status.

``k8s`` holds what both kinds are made of, ``common`` the compile settings they
share, ``service`` and ``artifact`` one kind each (``rollout``: how a service moves to a new revision), ``rule``
what an admission rule is and ``rules`` every one, declared once for the CRDs, the models and the parity test.
The names the rest of the operator uses are re-exported here: ``api.NeuronInferenceServiceSpec``.
"""

from neuronfleet.operator.api import rules
from neuronfleet.operator.api.artifact import (
    ArtifactPhase,
    BucketProgress,
    BucketState,
    NeuronCompiledArtifactSpec,
    NeuronCompiledArtifactStatus,
    parse_artifact_spec,
)
from neuronfleet.operator.api.common import CompileResources, CompileSettings, S3Access
from neuronfleet.operator.api.k8s import (
    API_VERSION,
    ARTIFACT_KIND,
    PRESENCE_MATTERS,
    SERVICE_KIND,
    VERSION,
    Condition,
    ConditionStatus,
    K8sModel,
    KindNames,
    Toleration,
    describe_errors,
    field_errors,
    is_bucket_error,
)
from neuronfleet.operator.api.rollout import Canary, CanaryAnalysis, CanaryStep, DrainSettings, RolloutSettings
from neuronfleet.operator.api.service import (
    DEFAULT_IMAGE,
    MAX_AUTOSCALED_REPLICAS,
    ArtifactStatusRef,
    Autoscaling,
    CanaryStatus,
    DeviceAllocation,
    Lora,
    NeuronInferenceServiceSpec,
    NeuronInferenceServiceStatus,
    Placement,
    Routing,
    ServicePhase,
    ServingResources,
    WarmFloor,
    parse_service_spec,
)

__all__ = [
    "API_VERSION",
    "ARTIFACT_KIND",
    "DEFAULT_IMAGE",
    "MAX_AUTOSCALED_REPLICAS",
    "PRESENCE_MATTERS",
    "SERVICE_KIND",
    "VERSION",
    "ArtifactPhase",
    "ArtifactStatusRef",
    "Autoscaling",
    "BucketProgress",
    "BucketState",
    "Canary",
    "CanaryAnalysis",
    "CanaryStatus",
    "CanaryStep",
    "CompileResources",
    "CompileSettings",
    "Condition",
    "ConditionStatus",
    "DeviceAllocation",
    "DrainSettings",
    "K8sModel",
    "KindNames",
    "Lora",
    "NeuronCompiledArtifactSpec",
    "NeuronCompiledArtifactStatus",
    "NeuronInferenceServiceSpec",
    "NeuronInferenceServiceStatus",
    "Placement",
    "RolloutSettings",
    "Routing",
    "S3Access",
    "ServicePhase",
    "ServingResources",
    "Toleration",
    "WarmFloor",
    "describe_errors",
    "field_errors",
    "is_bucket_error",
    "parse_artifact_spec",
    "parse_service_spec",
    "rules",
]
