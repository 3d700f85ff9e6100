"""The engine configuration: compiled shapes and limits, and how vLLM is told about them.

``EngineConfig`` is the one model both sides use: the operator embeds it in the
``NeuronInferenceService`` spec and mounts it into serving pods, and the engine
renders it to ``vllm serve`` arguments. It depends on pydantic alone.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from neuronfleet.contract.buckets import (
    DECODE_CONTEXT_LENGTH_BUCKETS,
    NUM_BATCHED_TOKENS_BUCKETS,
    NUM_SEQS_BUCKETS,
    BucketError,
    effective_max_num_batched_tokens,
    get_default_num_batched_tokens_buckets,
    get_default_num_seqs_buckets,
    validate_bucket_list,
    validate_decode_context_length_buckets,
    validate_last_bucket,
)

Dtype = Literal["bfloat16", "float16", "float32"]

#: The scheduler class vLLM is told to load; see ``neuronfleet.engine.scheduler``.
ASYNC_SCHEDULER_CLS = "neuronfleet.engine.scheduler.NeuronAsyncScheduler"
SYNC_SCHEDULER_CLS = "neuronfleet.engine.scheduler.NeuronScheduler"


KvAdmission = Literal["max_model_len", "request_bound"]

#: ``max_prefill_tokens_while_decoding``'s default: derived from the deployment's step times
#: (``neuronfleet.engine.tuning.prefill_cap``) where the engine knows them, off where it does not.
AUTO: Literal["auto"] = "auto"
PrefillCap = Annotated[int, Field(ge=1, le=1_048_576)] | Literal["auto"] | None


class SchedulerOptions(BaseModel):
    """Departures from the reference Neuron scheduler, each measured in ``bench/``.

    Every option keeps the reference guarantees: no mixed batches, no preemption,
    no step beyond the largest prefill bucket. The first three are on by default, and the prefill cap
    while decoding is derived per deployment; ``max_prefills_per_step`` stays at the design's 1 (packing needs a
    prefill graph that takes several sequences; docs/engine.md says when a Neuron device has one).
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
    max_prefill_tokens_while_decoding: PrefillCap = Field(
        AUTO,
        description=(
            "While requests are decoding, a prefill step (one chunk, or a pack) runs in a prefill bucket no larger "
            "than this (the largest bucket within it, at least the smallest bucket): a longer prompt is chunked, so "
            "decodes never wait behind one long step. With no request decoding, prefills use every bucket. "
            "auto: derived from the compiled buckets' step times (the largest bucket whose prefill step fits "
            "itl_target_ms beside a full decode step; without a target, 1.25 times the shortest such stall), off "
            "where no bucket is smaller or the step times are unknown. Null: no cap (reference)."
        ),
    )
    itl_target_ms: int | None = Field(
        None,
        ge=1,
        le=60_000,
        description=(
            "The inter-token latency the auto prefill cap aims for: a prefill step while decoding plus a decode "
            "step of the largest batch fit within it. No bucket that fits: no cap. Null: 1.25 times the shortest "
            "stall (the smallest bucket's prefill step beside that decode step)."
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
    decode_context_length_buckets: list[int] | None = Field(
        None,
        max_length=64,
        description=(
            "Compiled decode context lengths below max_model_len, strictly ascending, each a multiple of 128. "
            "A decode step reads the KV cache of the smallest of them (or max_model_len) that holds its longest "
            "sequence, instead of max_model_len for every request. Default: none (every step reads max_model_len)."
        ),
    )
    block_size: int = Field(32, ge=1, le=1024, description="KV cache block size in tokens.")
    tensor_parallel_size: int = Field(1, ge=1, le=128, description="NeuronCores (logical) one replica shards over.")
    dtype: Dtype = Field("bfloat16", description="Weight and activation data type.")
    scheduler: SchedulerOptions = Field(
        default_factory=SchedulerOptions, description="Neuron scheduler options beyond the reference behaviour."
    )

    @field_validator(NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS, DECODE_CONTEXT_LENGTH_BUCKETS, mode="before")
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
                self.prefill_limit_field,
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
        if self.decode_context_length_buckets is not None:
            try:
                validate_decode_context_length_buckets(self.decode_context_length_buckets, self.max_model_len)
            except BucketError as error:
                errors.append(
                    InitErrorDetails(
                        type=PydanticCustomError("bucket", str(error)),
                        loc=(DECODE_CONTEXT_LENGTH_BUCKETS,),
                        input=self.decode_context_length_buckets,
                    )
                )
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    @property
    def effective_max_num_batched_tokens(self) -> int:
        """The prefill budget per step: ``min(max_num_batched_tokens, max_model_len)``."""
        return effective_max_num_batched_tokens(self.max_num_batched_tokens, self.max_model_len)

    @property
    def prefill_limit_field(self) -> str:
        """The field that sets the prefill budget: the smaller of ``max_num_batched_tokens`` and ``max_model_len``."""
        return "max_num_batched_tokens" if self.max_num_batched_tokens <= self.max_model_len else "max_model_len"

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

    @property
    def decode_context_buckets(self) -> list[int]:
        """The context lengths decode graphs are compiled for: the configured ones, then ``max_model_len``."""
        return [*(self.decode_context_length_buckets or []), self.max_model_len]

    @property
    def compiled_graph_count(self) -> int:
        """Graphs an artifact holds: one per prefill bucket, one per decode batch bucket and context."""
        return len(self.effective_num_batched_tokens_buckets) + len(self.effective_num_seqs_buckets) * len(
            self.decode_context_buckets
        )

    def neuron_config(self) -> dict[str, Any]:
        """What the scheduler and the model runner read from ``additional_config["neuron_config"]``."""
        context = (
            {}
            if self.decode_context_length_buckets is None
            else {DECODE_CONTEXT_LENGTH_BUCKETS: self.decode_context_length_buckets}
        )
        return {
            NUM_BATCHED_TOKENS_BUCKETS: self.effective_num_batched_tokens_buckets,
            NUM_SEQS_BUCKETS: self.effective_num_seqs_buckets,
            **context,
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
