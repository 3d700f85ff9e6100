"""The engine configuration: compiled shapes and limits, and how vLLM is told about them.

``EngineConfig`` is the one model both sides use: the operator embeds it in the
``NeuronInferenceService`` spec and mounts it into serving pods, and the engine
renders it to ``vllm serve`` arguments. It depends on pydantic alone.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from neuronfleet.engine.buckets import (
    NUM_BATCHED_TOKENS_BUCKETS,
    NUM_SEQS_BUCKETS,
    BucketError,
    effective_max_num_batched_tokens,
    get_default_num_batched_tokens_buckets,
    get_default_num_seqs_buckets,
    validate_bucket_list,
    validate_last_bucket,
)

Dtype = Literal["bfloat16", "float16", "float32"]

#: The scheduler class vLLM is told to load; see ``neuronfleet.engine.scheduler``.
ASYNC_SCHEDULER_CLS = "neuronfleet.engine.scheduler.NeuronAsyncScheduler"
SYNC_SCHEDULER_CLS = "neuronfleet.engine.scheduler.NeuronScheduler"


KvAdmission = Literal["max_model_len", "request_bound"]


class SchedulerOptions(BaseModel):
    """Departures from the reference Neuron scheduler, each measured in ``bench/``.

    Every option keeps the reference guarantees: no mixed batches, no preemption,
    no step beyond the largest prefill bucket. The first three and the prefill cap
    while decoding are on by default; ``max_prefills_per_step`` stays at the design's 1 (packing needs a prefill graph
    that takes several sequences; docs/engine.md says when a Neuron device has one).
    ``REFERENCE_SCHEDULER`` turns everything off. docs/scheduler.md gives the figures.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    constant_cost_admission: bool = Field(
        True,
        description=(
            "Admit from the head of the waiting queue in place instead of moving the whole queue through "
            "the holdback queue every step: the same FIFO order, at a cost independent of the queue length."
        ),
    )
    max_consecutive_prefill_steps: int | None = Field(
        1,
        ge=1,
        le=1024,
        description=(
            "After this many prefill steps in a row while decodes wait, run one decode step. "
            "Bounds the inter-token stall of running requests during long prompts. Null: no bound."
        ),
    )
    kv_admission: KvAdmission = Field(
        "request_bound",
        description=(
            "max_model_len: admit while every running request could grow to max_model_len (reference). "
            "request_bound: admit while the requests' own bounds, min(max_model_len, prompt + max_tokens), "
            "fit the KV cache."
        ),
    )
    max_prefills_per_step: int = Field(
        1,
        ge=1,
        le=1024,
        description=(
            "Most waiting prompts packed into one prefill step, padded once to the bucket that holds their sum. "
            "1: one prefill per step (reference). Above 1 the compiled prefill graph must take several sequences "
            "of ragged lengths."
        ),
    )
    max_prefill_tokens_while_decoding: int | None = Field(
        1024,
        ge=1,
        le=1_048_576,
        description=(
            "While requests are decoding, a prefill step (one chunk, or a pack) runs in a prefill bucket no larger "
            "than this (the largest bucket within it, at least the smallest bucket): a longer prompt is chunked, so "
            "decodes never wait behind one long step. With no request decoding, prefills use every bucket. "
            "Null: no cap (reference)."
        ),
    )


#: The reference Neuron scheduler's behaviour: every option off.
REFERENCE_SCHEDULER = SchedulerOptions(
    constant_cost_admission=False,
    max_consecutive_prefill_steps=None,
    kv_admission="max_model_len",
    max_prefills_per_step=1,
    max_prefill_tokens_while_decoding=None,
)


class EngineConfig(BaseModel):
    """Limits and compiled bucket sets of one serving engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_num_seqs: int = Field(8, ge=1, le=1024, description="Most requests running at once; the largest decode batch.")
    max_num_batched_tokens: int = Field(
        8192, ge=1, le=1_048_576, description="Most tokens scheduled in one step; longer prompts are chunked."
    )
    max_model_len: int = Field(
        8192, ge=1, le=1_048_576, description="Longest sequence (prompt plus output) the engine accepts."
    )
    num_batched_tokens_buckets: list[int] | None = Field(
        None,
        max_length=64,
        description=(
            "Compiled prefill token buckets, strictly ascending, ending at "
            "min(max_num_batched_tokens, max_model_len). Default: powers of two from 128."
        ),
    )
    num_seqs_buckets: list[int] | None = Field(
        None,
        max_length=64,
        description="Compiled decode batch sizes, strictly ascending, ending at max_num_seqs. Default: powers of two.",
    )
    block_size: int = Field(32, ge=1, le=1024, description="KV cache block size in tokens.")
    tensor_parallel_size: int = Field(1, ge=1, le=128, description="NeuronCores (logical) one replica shards over.")
    dtype: Dtype = Field("bfloat16", description="Weight and activation data type.")
    scheduler: SchedulerOptions = Field(
        default_factory=SchedulerOptions, description="Neuron scheduler options beyond the reference behaviour."
    )

    @field_validator(NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS, mode="before")
    @classmethod
    def _check_bucket_shape(cls, value: object, info: Any) -> object:
        # Absent means "use the defaults"; anything given must pass rules 1-5 as given,
        # before pydantic would coerce "512" or True into an int.
        if value is None:
            return None
        try:
            return validate_bucket_list(info.field_name, value)
        except BucketError as error:
            raise PydanticCustomError("bucket", str(error)) from None

    @model_validator(mode="after")
    def _check_last_buckets(self) -> Self:
        errors: list[InitErrorDetails] = []
        checks = (
            (
                NUM_BATCHED_TOKENS_BUCKETS,
                self.num_batched_tokens_buckets,
                "max_num_batched_tokens",
                self.effective_max_num_batched_tokens,
            ),
            (NUM_SEQS_BUCKETS, self.num_seqs_buckets, "max_num_seqs", self.max_num_seqs),
        )
        for name, buckets, limit_name, limit in checks:
            if buckets is None:
                continue
            try:
                validate_last_bucket(name, buckets, limit_name, limit)
            except BucketError as error:
                errors.append(
                    InitErrorDetails(type=PydanticCustomError("bucket", str(error)), loc=(name,), input=buckets)
                )
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @property
    def effective_max_num_batched_tokens(self) -> int:
        """The prefill budget per step: ``min(max_num_batched_tokens, max_model_len)``."""
        return effective_max_num_batched_tokens(self.max_num_batched_tokens, self.max_model_len)

    @property
    def effective_num_batched_tokens_buckets(self) -> list[int]:
        """The prefill buckets in force: the configured ones, else the defaults."""
        if self.num_batched_tokens_buckets is not None:
            return list(self.num_batched_tokens_buckets)
        return get_default_num_batched_tokens_buckets(self.effective_max_num_batched_tokens)

    @property
    def effective_num_seqs_buckets(self) -> list[int]:
        """The decode batch buckets in force: the configured ones, else the defaults."""
        if self.num_seqs_buckets is not None:
            return list(self.num_seqs_buckets)
        return get_default_num_seqs_buckets(self.max_num_seqs)

    def neuron_config(self) -> dict[str, Any]:
        """What the scheduler reads from ``additional_config["neuron_config"]``."""
        return {
            NUM_BATCHED_TOKENS_BUCKETS: self.effective_num_batched_tokens_buckets,
            NUM_SEQS_BUCKETS: self.effective_num_seqs_buckets,
            **self.scheduler.model_dump(),
        }

    def vllm_serve_args(self, *, async_scheduling: bool = True) -> list[str]:
        """The ``vllm serve`` arguments (after the model) that apply this configuration.

        The bucket lists are written out in full, so the engine compiles and
        schedules exactly the shapes that were validated here.
        """
        args = [
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.max_num_batched_tokens),
            "--max-model-len",
            str(self.max_model_len),
            "--block-size",
            str(self.block_size),
            "--tensor-parallel-size",
            str(self.tensor_parallel_size),
            "--dtype",
            self.dtype,
            "--scheduler-cls",
            ASYNC_SCHEDULER_CLS if async_scheduling else SYNC_SCHEDULER_CLS,
            "--additional-config",
            json.dumps({"neuron_config": self.neuron_config()}, separators=(",", ":")),
        ]
        if not async_scheduling:
            args.append("--no-async-scheduling")
        return args
