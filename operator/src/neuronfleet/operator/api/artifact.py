"""``NeuronCompiledArtifact``: compiled graphs for one compile identity, its spec and its status.

The spec is the identity (named by its hash, so immutable) plus the compile
settings of the service that first needed it.
"""

from __future__ import annotations

import datetime
from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from neuronfleet.contract.buckets import DECODE_CONTEXT_LENGTH_BUCKETS, NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.operator.api import rules
from neuronfleet.operator.api.common import CompileSettings
from neuronfleet.operator.api.k8s import K8sModel
from neuronfleet.operator.api.rule import Rule, add_cel

ArtifactPhase = Literal["Pending", "Compiling", "Ready", "Failed"]


class NeuronCompiledArtifactSpec(CompileIdentity):
    """A compiled artifact: its identity (immutable: the name is its hash) and how to compile it."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        json_schema_extra=add_cel,
    )

    #: Admission only: the operator never sees the old object.
    admission_rules: ClassVar[tuple[Rule[Any], ...]] = rules.ARTIFACT_SPEC

    compile: CompileSettings = Field(
        default_factory=CompileSettings,
        description="How the compile Job runs; from the service that first needed this artifact.",
    )

    @classmethod
    def compiling(cls, identity: CompileIdentity, compile: CompileSettings) -> NeuronCompiledArtifactSpec:
        """The artifact of ``identity``, compiled as ``compile`` says."""
        return cls(**dict(identity), compile=compile)

    def identity(self) -> CompileIdentity:
        """The identity alone, without compile settings."""
        return CompileIdentity(**{name: getattr(self, name) for name in CompileIdentity.model_fields})


BucketState = Literal["Pending", "Compiled", "Failed"]


class BucketProgress(K8sModel):
    """One compiled shape."""

    kind: Literal["prefill", "decode"] = Field(
        description=f"prefill ({NUM_BATCHED_TOKENS_BUCKETS}) or decode ({NUM_SEQS_BUCKETS})."
    )
    size: int = Field(ge=1, description="Tokens (prefill) or sequences (decode).")
    context: int | None = Field(
        None, ge=1, description=f"A decode graph's context, when below max_model_len ({DECODE_CONTEXT_LENGTH_BUCKETS})."
    )
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


def parse_artifact_spec(spec: object) -> NeuronCompiledArtifactSpec:
    """Validate an artifact spec as read from the API server."""
    return NeuronCompiledArtifactSpec.model_validate(spec)
