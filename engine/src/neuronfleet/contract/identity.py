"""The compiled-artifact identity: what a compiled artifact depends on, and its hash.

The operator names, shares and pins artifacts by this hash, and the engine's
``compile`` command computes it again to check that it builds what it was asked
for, so both sides call :meth:`CompileIdentity.hash` here; the variable naming the
engine's local copies of artifacts, which the operator sets, lives here too. It
depends on pydantic alone.

Only compile-relevant inputs take part: the model and its revision, the shapes
(limits and bucket sets, as compiled: defaults written out), tensor parallelism,
dtype, the Neuron target, the logical-NeuronCore setting when it is not the target's
default, the engine image (which fixes the compiler version), the device compiled
for (a simulated artifact never stands in for a Neuron one) and the LoRA slots when there are any
(the adapters loaded into them are not compiled).
Replicas, resources and rollout settings never change the hash.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from neuronfleet.contract.buckets import DECODE_CONTEXT_LENGTH_BUCKETS, NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import NeuronTarget, chip_of
from neuronfleet.contract.lora import LoraSlots
from neuronfleet.contract.sim_settings import Device

#: Bumped when the hashed document changes shape, so old and new hashes never collide.
IDENTITY_SCHEMA = 1
#: Where the engine keeps local copies of ``s3://`` artifacts, by hash (the operator points it at a pod's emptyDir).
ARTIFACT_CACHE_ENV = "NEURONFLEET_ARTIFACT_CACHE"
#: The bytes that cache may hold before the artifacts nobody uses are evicted (a node's shared cache is bounded).
ARTIFACT_CACHE_LIMIT_ENV = "NEURONFLEET_ARTIFACT_CACHE_BYTES"

#: Hex digits of the SHA-256 kept: 64 bits, short enough for a label value and a name.
IDENTITY_HASH_LENGTH = 16

#: The ``EngineConfig`` fields a compiled graph depends on, besides the bucket sets.
COMPILE_FIELDS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size",
    "tensor_parallel_size",
    "dtype",
)
#: The bucket sets: hashed as compiled (the defaults written out; decode contexts only when set).
BUCKET_FIELDS = (NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS, DECODE_CONTEXT_LENGTH_BUCKETS)
#: The ``EngineConfig`` fields that change only how requests are served, never a graph: not hashed.
#: Every ``EngineConfig`` field is in exactly one of these, BUCKET_FIELDS and COMPILE_FIELDS (a test checks).
SERVING_FIELDS = ("scheduler",)

#: Physical NeuronCores per logical NeuronCore: the runtime's ``NEURON_LOGICAL_NC_CONFIG``.
LogicalNeuronCores = Literal[1, 2]

MODEL_URI_PATTERN = (
    r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^\s]+|hf://([A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*)$"
)
REVISION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/-]*$"


def compiled_shapes(engine: EngineConfig) -> dict[str, Any]:
    """The compile-relevant engine fields, with the bucket sets in force written out.

    Decode context buckets appear only when set, so the artifacts of services without them keep their
    hashes (none set compiles exactly what was compiled before the option existed).
    """
    context = (
        {}
        if engine.decode_context_length_buckets is None
        else {DECODE_CONTEXT_LENGTH_BUCKETS: engine.decode_context_length_buckets}
    )
    return {
        **{name: getattr(engine, name) for name in COMPILE_FIELDS},
        NUM_BATCHED_TOKENS_BUCKETS: engine.effective_num_batched_tokens_buckets,
        NUM_SEQS_BUCKETS: engine.effective_num_seqs_buckets,
        **context,
    }


class ModelSource(BaseModel):
    """Where the weights come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str = Field(
        pattern=MODEL_URI_PATTERN,
        max_length=512,
        description="The model: hf://org/name on the Hugging Face Hub, or s3://bucket/path to a model directory.",
    )
    revision: str = Field(
        "main",
        min_length=1,
        max_length=128,
        pattern=REVISION_PATTERN,
        description="Branch, tag or commit. Pin a commit: the compiled artifact is named by it, not by the weights.",
    )


class CompileIdentity(BaseModel):
    """Everything a compiled artifact depends on; two equal identities share one artifact."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: ModelSource = Field(description="The weights compiled.")
    engine: EngineConfig = Field(
        description="The compiled limits and shapes, with the bucket sets written out in full.",
    )
    target: NeuronTarget = Field(description="The Neuron instance family the graphs are compiled for.")
    image: str = Field(
        min_length=1,
        max_length=512,
        description="The engine image that compiles and serves; it fixes the Neuron SDK and compiler version.",
    )
    device: Device = Field(
        "neuron",
        description="What the graphs are compiled for: neuron (Neuron devices) or sim (the simulated device).",
    )
    logical_neuron_cores: LogicalNeuronCores | None = Field(
        None,
        description=(
            "Physical NeuronCores per logical core the graphs are compiled for (LNC), when not the target's "
            "default (2 on trn2 and trn3; trn1 and inf2 take only 1)."
        ),
    )

    lora: LoraSlots | None = Field(
        None, description="The LoRA slots the graphs are compiled with; none: no adapters can be served."
    )

    @model_validator(mode="after")
    def _lnc_of_the_target(self) -> CompileIdentity:
        settings = chip_of(self.target).lnc_settings
        if self.logical_neuron_cores is not None and self.logical_neuron_cores not in settings:
            allowed = " or ".join(str(lnc) for lnc in settings)
            lnc = self.logical_neuron_cores
            raise ValueError(f"logical NeuronCores {lnc} is not a setting of {self.target}: {allowed}")
        return self

    @classmethod
    def of(
        cls,
        model: ModelSource,
        engine: EngineConfig,
        target: NeuronTarget,
        image: str,
        device: Device = "neuron",
        logical_neuron_cores: int | None = None,
        lora: LoraSlots | None = None,
    ) -> CompileIdentity:
        """The identity of serving ``model`` with ``engine`` on ``device``, normalized.

        The bucket sets are written out (an omitted list and the same list written
        by hand are one artifact), non-compile settings are dropped, and the target's
        default logical-NeuronCore setting is left unset (set or not, one artifact).
        """
        compiled = EngineConfig.model_validate(compiled_shapes(engine))
        lnc = None if logical_neuron_cores == chip_of(target).default_lnc else logical_neuron_cores
        return cls(
            model=model, engine=compiled, target=target, image=image, device=device, logical_neuron_cores=lnc, lora=lora
        )

    def document(self) -> dict[str, Any]:
        """The hashed document: the compile-relevant fields only, in a fixed shape."""
        document: dict[str, Any] = {
            "schema": IDENTITY_SCHEMA,
            "model": {"uri": self.model.uri, "revision": self.model.revision},
            "engine": compiled_shapes(self.engine),
            "target": self.target,
            "image": self.image,
        }
        # Only a simulated artifact names its device: Neuron artifacts keep the hashes they had, and a
        # simulated one, whose document has one key more, can never hash like a Neuron one.
        if self.device != "neuron":
            document["device"] = self.device
        # Likewise only a setting other than the target's default: the artifacts compiled before it keep their hashes.
        if self.logical_neuron_cores not in (None, chip_of(self.target).default_lnc):
            document["logical_neuron_cores"] = self.logical_neuron_cores
        # And LoRA slots only where there are some.
        if self.lora is not None:
            document["lora"] = self.lora.model_dump(mode="json")
        return document

    def hash(self) -> str:
        """The artifact's content hash: hex SHA-256 of the canonical JSON document, truncated."""
        return hash_document(self.document())


def hash_document(document: dict[str, Any]) -> str:
    """The hash of an identity document (``CompileIdentity.document()``, or one a manifest records)."""
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:IDENTITY_HASH_LENGTH]
