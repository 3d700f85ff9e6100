"""The Neuron scheduler: vLLM's scheduler with Neuron's batch shapes enforced.

Neuron runs compiled graphs: a step is either one prefill chunk padded to a token
bucket, or a batch of decodes padded to a batch bucket, never both. vLLM's
scheduler mixes them freely. Rather than fork it, ``NeuronScheduler`` controls
what the base scheduler sees: before each ``schedule()`` it moves every waiting
request to a holdback queue and re-admits at most one prefill (several short ones
with ``max_prefills_per_step``: ``neuronfleet.engine.scheduler.packing``), hides running
decodes while a prefill runs, and afterwards restores both queues, records the
padded size of each scheduled request and checks that no batch is mixed.

Use it with ``vllm serve ... --scheduler-cls
neuronfleet.engine.scheduler.NeuronAsyncScheduler --additional-config
'{"neuron_config": {"num_batched_tokens_buckets": [...], "num_seqs_buckets": [...]}}'``
(``NeuronScheduler`` with ``--no-async-scheduling``).
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from vllm.logger import init_logger
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput

from neuronfleet.contract.buckets import (
    NUM_BATCHED_TOKENS_BUCKETS,
    NUM_SEQS_BUCKETS,
    effective_max_num_batched_tokens,
    get_bucket_for_count,
    get_default_num_batched_tokens_buckets,
    get_default_num_seqs_buckets,
    validate_num_batched_tokens_buckets,
    validate_num_seqs_buckets,
)
from neuronfleet.contract.config import AUTO, SchedulerOptions
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.packing import Pack, buckets_while_decoding, fits, pack_padding
from neuronfleet.engine.scheduler.vllm_compat import AsyncScheduler, Request, Scheduler, SchedulerOutput

logger = init_logger(__name__)


class SchedulerState(enum.Enum):
    """What the last non-empty step ran."""

    IDLE = "IDLE"
    ACTIVE_PREFILL = "ACTIVE_PREFILL"
    ACTIVE_DECODE = "ACTIVE_DECODE"


def read_neuron_config(additional_config: object) -> Mapping[str, Any]:
    """The ``neuron_config`` section of vLLM's ``additional_config`` (empty when absent)."""
    if not additional_config:
        return {}
    if not isinstance(additional_config, Mapping):
        raise ValueError(f"additional_config must be a mapping, got {type(additional_config).__name__}")
    section = additional_config.get("neuron_config") or {}
    if not isinstance(section, Mapping):
        raise ValueError(f"additional_config.neuron_config must be a mapping, got {type(section).__name__}")
    return section


class NeuronScheduler(Scheduler):
    """vLLM's scheduler with prefill/decode separation, one prefill per step (or a pack) and bucket padding."""

    #: Called as ``observer(scheduler, scheduler_output)`` at the end of every
    #: ``schedule()``: the engine's metrics subscribe here, in the engine core process.
    step_observers: ClassVar[list[Callable[[NeuronScheduler, SchedulerOutput], None]]] = []
    #: Called as ``observer(scheduler, scheduler_output)`` as each step's output comes back, before vLLM takes
    #: it in: the engine's metrics time the device's steps here (``engine/scheduler/step_clock.py``).
    output_observers: ClassVar[list[Callable[[NeuronScheduler, SchedulerOutput], None]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.policy != vllm_compat.SchedulingPolicy.FCFS:
            raise ValueError(f"NeuronScheduler supports only the 'fcfs' scheduling policy, got {self.policy.value!r}")
        unsupported = vllm_compat.unsupported_admission(self.scheduler_config)
        if unsupported:
            raise ValueError(
                f"NeuronScheduler admits in FIFO order through its own checks; unset {', '.join(unsupported)}"
            )
        self.max_num_seqs: int = self.scheduler_config.max_num_seqs
        max_prefill_tokens = effective_max_num_batched_tokens(
            self.scheduler_config.max_num_batched_tokens, self.max_model_len
        )
        neuron_config = read_neuron_config(self.vllm_config.additional_config)
        prefill_buckets = neuron_config.get(NUM_BATCHED_TOKENS_BUCKETS)
        decode_buckets = neuron_config.get(NUM_SEQS_BUCKETS)
        self.num_batched_tokens_buckets: list[int] = (
            get_default_num_batched_tokens_buckets(max_prefill_tokens)
            if prefill_buckets is None
            else validate_num_batched_tokens_buckets(prefill_buckets, max_prefill_tokens)
        )
        self.num_seqs_buckets: list[int] = (
            get_default_num_seqs_buckets(self.max_num_seqs)
            if decode_buckets is None
            else validate_num_seqs_buckets(decode_buckets, self.max_num_seqs)
        )
        self.options = SchedulerOptions.model_validate(
            {key: neuron_config[key] for key in SchedulerOptions.model_fields if key in neuron_config}
        )
        # The design's prefill graph takes one sequence; packing needs one that takes several.
        self.max_prefills_per_batch = self.options.max_prefills_per_step
        cap = self.options.max_prefill_tokens_while_decoding
        if cap == AUTO:
            # `serve` derives it from the device's step times (as the benchmarks do); nothing did here.
            logger.warning(
                "max_prefill_tokens_while_decoding is auto but no step times were known to derive it: no cap"
            )
        #: The prefill cap while decoding in force (None: none).
        self.prefill_cap: int | None = None if isinstance(cap, str) else cap
        self._buckets_while_decoding = buckets_while_decoding(self.num_batched_tokens_buckets, self.prefill_cap)
        # The prefill buckets this step may use: narrowed while requests decode.
        self._step_buckets = self.num_batched_tokens_buckets
        self._pack = Pack()
        #: The LoRA adapters of this step's pack of prefills.
        self._pack_adapters: set[int] = set()
        self._prefill_steps_with_decodes_waiting = 0
        self.holdback_queue: deque[Request] = deque()
        self.state = SchedulerState.IDLE
        self.total_padding_tokens = 0
        # Per bucket: padding tokens, and steps run (prefill buckets are token counts,
        # decode buckets batch sizes). Read by the engine's metrics and the trace tool.
        self.padding_tokens_by_bucket: Counter[int] = Counter()
        self.prefill_steps_by_bucket: Counter[int] = Counter()
        self.decode_steps_by_bucket: Counter[int] = Counter()
        self.num_kv_deferred_admissions = 0
        #: Decodes hidden from the base scheduler in the last step.
        self.last_num_hidden_decodes = 0
        # The last output whose prefills were worked out, and those prefills.
        self._last_prefill_split: tuple[SchedulerOutput, set[str]] | None = None
        self._max_kv_concurrent = self._compute_max_kv_concurrent()
        self._usable_kv_blocks = vllm_compat.usable_kv_blocks(self) or 0
        if self.options.kv_admission == "request_bound" and not self._usable_kv_blocks:
            logger.warning("kv_admission=request_bound needs one KV cache group; admitting by max_model_len")
            self.options = self.options.model_copy(update={"kv_admission": "max_model_len"})
        self._warned_kv_saturated = False
        logger.info(
            "NeuronScheduler: prefill buckets %s, decode buckets %s, at most %d requests fit the KV cache "
            "at max_model_len %d; %s",
            self.num_batched_tokens_buckets,
            self.num_seqs_buckets,
            self._max_kv_concurrent,
            self.max_model_len,
            self.options,
        )

    def _compute_max_kv_concurrent(self) -> int:
        """How many requests fit the KV cache if each grows to ``max_model_len``."""
        max_concurrent = vllm_compat.max_full_length_requests(self)
        if max_concurrent > 0:
            return max_concurrent
        logger.warning(
            "The KV cache (%d blocks of %d tokens) cannot hold one request of max_model_len %d: a request "
            "that long will need preemption, which Neuron does not support. Lower max_model_len.",
            self.kv_cache_config.num_blocks,
            self.block_size,
            self.max_model_len,
        )
        return self.max_num_seqs

    # Admission ------------------------------------------------------------------

    @property
    def at_capacity(self) -> bool:
        """True when ``max_num_seqs`` requests are running (prefill or decode)."""
        return len(self.running) >= self.max_num_seqs

    @property
    def has_prefill_in_running(self) -> bool:
        """True while a request in ``running`` still has prompt tokens to compute."""
        return any(self._is_prefill_request(request) for request in self.running)

    @property
    def pending_prefill_tokens(self) -> int:
        """Prompt tokens still to prefill, over the waiting and running requests (the holdback queue is empty
        between steps): the backlog the token-aware autoscaling signal divides by the replica's prefill rate."""
        requests = itertools.chain(vllm_compat.waiting_requests(self), self.running)
        return sum(self._prompt_tokens_left(request) for request in requests)

    def _is_prefill_request(self, request: Request) -> bool:
        return bool(request.num_computed_tokens < request.num_prompt_tokens)

    def can_schedule(self, request: Request) -> bool:
        """Whether the request at the head of the waiting line may start its prefill now."""
        if self.at_capacity:
            return False
        if self.has_prefill_in_running:
            return False
        if self._pack.num_requests >= self.max_prefills_per_batch:
            return False
        # A packed prefill takes a running slot too, and the whole prompt must fit the step.
        if len(self.running) + self._pack.num_requests >= self.max_num_seqs:
            return False
        if not fits(self._pack, self._prompt_tokens_left(request), self._step_buckets):
            return False
        if not self._lora_slot_for(request):
            return False
        # Neuron cannot preempt: admit only what the KV cache can finish.
        if not self._kv_admits(request):
            self.num_kv_deferred_admissions += 1
            if not self._warned_kv_saturated:
                logger.warning(
                    "Deferring prefills: %d running requests fill the KV cache (kv_admission=%s, "
                    "max_model_len %d, max_num_seqs %d). Lower max_num_seqs or max_model_len, or give the "
                    "KV cache more memory.",
                    len(self.running),
                    self.options.kv_admission,
                    self.max_model_len,
                    self.max_num_seqs,
                )
                self._warned_kv_saturated = True
            return False
        return True

    def _lora_slot_for(self, request: Request) -> bool:
        """Whether ``request``'s LoRA adapter has a slot: already running, or a slot free.

        vLLM counts the adapters of ``running``, which here lacks the decodes a prefill step hides: the
        slots are counted over every running request and this step's pack instead.
        """
        if self.lora_config is None or request.lora_request is None:
            return True
        active = self._pack_adapters | {r.lora_request.lora_int_id for r in self.running if r.lora_request}
        return request.lora_request.lora_int_id in active or len(active) < self.lora_config.max_loras

    def _kv_admits(self, request: Request) -> bool:
        """Whether ``request`` and every running request can all reach their bound in the KV cache."""
        # The prefills already packed into this step count as running.
        if self.options.kv_admission == "max_model_len":
            # Every running request may grow to max_model_len.
            return len(self.running) + self._pack.num_requests < self._max_kv_concurrent
        needed = sum(self._kv_blocks_bound(running) for running in self.running) + self._kv_blocks_bound(request)
        return needed + self._pack.kv_blocks <= self._usable_kv_blocks

    def _kv_blocks_bound(self, request: Request) -> int:
        """The most KV blocks ``request`` can hold: prompt plus every token it may generate."""
        tokens = min(self.max_model_len, request.num_prompt_tokens + request.max_tokens)
        return -(-tokens // self.block_size)

    @staticmethod
    def _prompt_tokens_left(request: Request) -> int:
        return max(0, int(request.num_prompt_tokens - request.num_computed_tokens))

    def _admit(self, request: Request) -> None:
        """Count ``request`` into this step's pack of prefills."""
        kv_blocks = self._kv_blocks_bound(request) if self.options.kv_admission == "request_bound" else 0
        self._pack.add(self._prompt_tokens_left(request), kv_blocks, self._step_buckets)
        if request.lora_request is not None:
            self._pack_adapters.add(request.lora_request.lora_int_id)

    # Scheduling -----------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """One step: admit, separate prefill from decode, run the base scheduler, pad."""
        decode_turn = self._decode_turn_due()
        self._pack = Pack()
        self._pack_adapters = set()
        decoding = any(not self._is_prefill_request(request) for request in self.running)
        self._step_buckets = self._buckets_while_decoding if decoding else self.num_batched_tokens_buckets
        if self.options.constant_cost_admission:
            self._admit_in_place(decode_turn)
        else:
            self._admit_through_holdback(decode_turn)

        # Step 3: a step runs prefill or decode, never both.
        hidden: list[Request] = []
        if self.has_prefill_in_running:
            # A decode turn hides the prefill instead of the decodes for one step.
            keep_prefill = not decode_turn
            hidden = [r for r in self.running if self._is_prefill_request(r) != keep_prefill]
            self.running = [r for r in self.running if self._is_prefill_request(r) == keep_prefill]
        elif self._pack.num_requests > 0:
            hidden = self.running
            self.running = []
        self.last_num_hidden_decodes = len(hidden) if not decode_turn else 0

        # Step 4: the base scheduler checks len(running) against its limits; while
        # requests are hidden their slots are not free.
        limits = {name: getattr(self, name) for name in vllm_compat.hidden_limit_attributes}
        lowered = {name: value - len(hidden) for name, value in limits.items()}
        if hidden and not decode_turn:
            # A prefill step while decodes wait: chunk to the largest bucket it may use.
            budget = vllm_compat.STEP_TOKEN_BUDGET
            limits[budget] = getattr(self, budget)
            lowered[budget] = min(limits[budget], self._step_buckets[-1])
        for name, value in lowered.items():
            setattr(self, name, value)
        if self.options.constant_cost_admission:
            # The base scheduler admits from the head of the queue until this cap:
            # exactly the requests admitted here.
            vllm_compat.cap_admissions(self, self._pack.num_requests)
        try:
            # The design's _call_base_schedule takes no argument (subclasses override it so);
            # vLLM's data-parallel prefill throttle is passed on only when asked for.
            scheduler_output = (
                self._call_base_schedule(throttle_prefills) if throttle_prefills else self._call_base_schedule()
            )
        finally:
            for name, value in limits.items():
                setattr(self, name, value)
            # Step 5: restore every queue, also when the base scheduler raised.
            self.running = self.running + hidden
            while self.holdback_queue:
                vllm_compat.requeue_waiting(self, self.holdback_queue.popleft())

        # Steps 6-8: pad, verify, update the state machine.
        # Called with the design's signatures, which subclasses override.
        scheduler_output = self._apply_padding_and_log_stats(scheduler_output)
        self._update_state(scheduler_output)
        has_prefill = bool(self._scheduled_prefill_ids(scheduler_output))
        self._count_decode_wait(decode_turn, has_prefill=has_prefill, num_hidden=len(hidden))
        for observer in self.step_observers:
            observer(self, scheduler_output)
        return scheduler_output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        """vLLM's, once the output observers know the step came back."""
        for observer in self.output_observers:
            observer(self, scheduler_output)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _admit_through_holdback(self, decode_turn: bool) -> None:
        """Steps 1-2 of the reference: hide every waiting request, re-admit from the head."""
        self.holdback_queue.extend(vllm_compat.take_all_waiting(self))
        # Stop at the first refusal to keep FIFO order.
        while not decode_turn and self.holdback_queue and self.can_schedule(self.holdback_queue[0]):
            self._admit(self.holdback_queue[0])
            vllm_compat.requeue_waiting(self, self.holdback_queue.popleft())

    def _admit_in_place(self, decode_turn: bool) -> None:
        """Decide on the head of the waiting line without moving the queue (constant cost).

        With packing, on as many requests from the head as a step may take, still in order.
        """
        if decode_turn:
            return
        for request in vllm_compat.waiting_head(self, self.max_prefills_per_batch):
            if not self.can_schedule(request):
                return
            self._admit(request)

    def _decode_turn_due(self) -> bool:
        """True when decodes have waited ``max_consecutive_prefill_steps`` prefill steps."""
        bound = self.options.max_consecutive_prefill_steps
        return bound is not None and self._prefill_steps_with_decodes_waiting >= bound

    def _count_decode_wait(self, decode_turn: bool, has_prefill: bool, num_hidden: int) -> None:
        if decode_turn or not has_prefill:
            self._prefill_steps_with_decodes_waiting = 0
        elif num_hidden:
            self._prefill_steps_with_decodes_waiting += 1

    def _call_base_schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """The base scheduler's step on the queues as rearranged (the design calls it with no argument)."""
        return Scheduler.schedule(self, throttle_prefills)

    def _scheduled_prefill_ids(self, scheduler_output: SchedulerOutput) -> set[str]:
        """Ids of the scheduled requests that were in prefill when the step started.

        Worked out once per output: padding, the state machine and the stall bound all ask.
        """
        last = self._last_prefill_split
        if last is not None and last[0] is scheduler_output:
            return last[1]
        prefill_ids = set(vllm_compat.scheduled_prefill_ids(scheduler_output, self.prompt_len))
        self._last_prefill_split = (scheduler_output, prefill_ids)
        return prefill_ids

    def prompt_len(self, req_id: str) -> int:
        """The prompt length of a request this scheduler holds."""
        return int(self.requests[req_id].num_prompt_tokens)

    def _calculate_padded_count(self, token_count: int) -> int:
        """The prefill bucket a chunk of ``token_count`` tokens runs in (0 for none)."""
        return get_bucket_for_count(token_count, self.num_batched_tokens_buckets)

    def _apply_padding_and_log_stats(self, scheduler_output: SchedulerOutput) -> SchedulerOutput:
        """Record each request's padded size beside its actual count; refuse mixed batches.

        Prefills are told apart by the output's pre-step computed tokens, as in the design.
        """
        prefill_ids = self._scheduled_prefill_ids(scheduler_output)
        num_decodes = len(scheduler_output.num_scheduled_tokens) - len(prefill_ids)
        if prefill_ids and num_decodes:
            raise RuntimeError(
                f"Neuron constraint violated: Mixed prefill ({len(prefill_ids)}) and decode ({num_decodes}) "
                "in the same batch. Neuron runs prefill and decode as separate compiled graphs."
            )
        num_scheduled = scheduler_output.num_scheduled_tokens
        # A step's prefills are padded once, to the bucket of their sum (one prefill: its own bucket).
        prefills = [req_id for req_id in num_scheduled if req_id in prefill_ids]
        actual = sum(num_scheduled[req_id] for req_id in prefills)
        bucket = self._calculate_padded_count(actual)
        padded = pack_padding(prefills, num_scheduled, bucket)
        if prefills:
            self.total_padding_tokens += bucket - actual
            self.padding_tokens_by_bucket[bucket] += bucket - actual
            self.prefill_steps_by_bucket[bucket] += 1
        for req_id, num_tokens in num_scheduled.items():
            padded.setdefault(req_id, num_tokens)
        if num_decodes:
            self.decode_steps_by_bucket[get_bucket_for_count(num_decodes, self.num_seqs_buckets)] += 1
        vllm_compat.set_padded_counts(scheduler_output, padded)
        if padded:
            logger.debug("Neuron step: actual %s, padded %s", scheduler_output.num_scheduled_tokens, padded)
        return scheduler_output

    def _update_state(self, scheduler_output: SchedulerOutput) -> None:
        """IDLE with nothing queued; else what this step ran; an empty step changes nothing."""
        if vllm_compat.waiting_count(self) == 0 and not self.running:
            self.state = SchedulerState.IDLE
        elif scheduler_output.num_scheduled_tokens:
            has_prefill = bool(self._scheduled_prefill_ids(scheduler_output))
            self.state = SchedulerState.ACTIVE_PREFILL if has_prefill else SchedulerState.ACTIVE_DECODE


class NeuronAsyncScheduler(NeuronScheduler, AsyncScheduler):
    """``NeuronScheduler`` for vLLM's async scheduling (two steps in flight, the default)."""

    def _call_base_schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """vLLM's async step, which leaves output placeholders for the step still in flight."""
        return AsyncScheduler.schedule(self, throttle_prefills)
