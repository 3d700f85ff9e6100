"""The simulated Neuron device: the model-runner side of the padding contract, without a model.

Each step it receives vLLM's ``SchedulerOutput`` from the Neuron scheduler and
does what a Neuron model runner does with it: builds the padded inputs of exactly
one compiled graph (a prefill chunk, or several packed prompts, padded to a token bucket, or a decode batch
padded to its batch bucket and read over its compiled context), refuses anything no compiled graph accepts, takes
the time the cost model gives for that graph, and samples one token per request
that completes its prompt or decodes. Tokens are a fixed function of the prompt
and the position, so the same prompt always gets the same reply.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from vllm.v1.outputs import ModelRunnerOutput

from neuronfleet.contract.buckets import get_bucket_for_count
from neuronfleet.contract.sim_settings import ClockMode
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.padding import PrefillSequence, kv_slot, pad_decode, pad_packed_prefill
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.faults import FaultInjector, step_failure
from neuronfleet.engine.sim.tokenizer import FIRST_WORD_ID


class ShapeNotCompiledError(RuntimeError):
    """A step whose shape no compiled graph has: a real Neuron runtime refuses it too."""


class Clock:
    """Device time. ``real`` sleeps for every step; ``virtual`` only counts."""

    def __init__(self, mode: ClockMode) -> None:
        self.mode: ClockMode = mode
        self.elapsed_s = 0.0

    def advance(self, seconds: float) -> None:
        """Spend ``seconds`` of device time."""
        self.elapsed_s += seconds
        if self.mode == "real":
            time.sleep(seconds)


@dataclass
class RequestState:
    """What the device keeps of a request between steps, as a model runner's persistent batch does."""

    prompt_token_ids: list[int]
    block_ids: list[int]
    #: Prompt then sampled tokens: the device's own record of the sequence.
    token_ids: list[int]
    digest: int
    #: vLLM's id of the LoRA adapter the request runs with; 0 for the base model.
    lora_adapter: int = 0


@dataclass
class DeviceStats:
    """What the device ran, as running totals: a server runs for months, so nothing is kept per step.

    Device time is the clock's; whoever wants each step (a test, a benchmark) passes ``on_step``.
    """

    prefill_steps_by_bucket: Counter[int] = field(default_factory=Counter)
    decode_steps_by_bucket: Counter[int] = field(default_factory=Counter)
    #: Decode steps by the compiled context their graph read.
    decode_steps_by_context: Counter[int] = field(default_factory=Counter)
    padding_tokens_by_bucket: Counter[int] = field(default_factory=Counter)
    #: Prefill chunks by their real token count: at most one entry per chunk length.
    prefill_chunks_by_tokens: Counter[int] = field(default_factory=Counter)


@dataclass(frozen=True)
class StepResult:
    """One executed step: the runner output and what it cost."""

    output: ModelRunnerOutput
    kind: Literal["prefill", "decode", "empty"]
    bucket: int
    real: int
    seconds: float


def sampled_token(digest: int, position: int, vocab_size: int) -> int:
    """The token the device samples at ``position`` for a prompt with ``digest``: never a special token."""
    words = vocab_size - FIRST_WORD_ID
    return FIRST_WORD_ID + (digest * 2_654_435_761 + position * 40_503) % words


class SimulatedNeuronDevice:
    """Runs scheduled steps as compiled Neuron graphs would, on a clock."""

    def __init__(
        self,
        cost: CostModel,
        *,
        block_size: int,
        prefill_buckets: Sequence[int],
        decode_buckets: Sequence[int],
        decode_context_buckets: Sequence[int],
        clock: Clock,
        on_step: Callable[[StepResult], None] | None = None,
        max_prefills_per_step: int = 1,
        faults: FaultInjector | None = None,
        adapter_ranks: Mapping[int, int] | None = None,
    ) -> None:
        self.cost = cost
        self.block_size = block_size
        self.prefill_buckets = list(prefill_buckets)
        self.decode_buckets = list(decode_buckets)
        #: Context lengths decode graphs were compiled for, ``max_model_len`` last.
        self.decode_context_buckets = list(decode_context_buckets)
        self.clock = clock
        self.vocab_size = cost.shape.vocab_size
        self.requests: dict[str, RequestState] = {}
        self.stats = DeviceStats()
        self.on_step = on_step
        #: Sequences one prefill graph takes (the scheduler's ``max_prefills_per_step``).
        self.max_prefills_per_step = max_prefills_per_step
        #: Faults a test injects at run time; none by default.
        self.faults = faults or FaultInjector()
        #: The LoRA adapters loaded, by vLLM's adapter id: their ranks (the executor's, kept as it changes).
        self.adapter_ranks: Mapping[int, int] = {} if adapter_ranks is None else adapter_ranks

    def execute(self, scheduler_output: vllm_compat.SchedulerOutput) -> StepResult:
        """Run one step and return vLLM's ``ModelRunnerOutput`` for it."""
        self._update_requests(scheduler_output)
        if not scheduler_output.num_scheduled_tokens:
            return StepResult(vllm_compat.runner_output([], []), "empty", 0, 0, 0.0)
        computed = vllm_compat.pre_increment_computed_tokens(scheduler_output)
        padded = vllm_compat.padded_counts(scheduler_output)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        prefill_ids = vllm_compat.scheduled_prefill_ids(
            scheduler_output, lambda req_id: len(self.requests[req_id].prompt_token_ids)
        )
        if prefill_ids and len(prefill_ids) != len(req_ids):
            raise ShapeNotCompiledError(
                f"a step mixes {len(prefill_ids)} prefill and {len(req_ids) - len(prefill_ids)} decode requests; "
                "Neuron compiles prefill and decode as separate graphs"
            )
        if prefill_ids:
            if len(prefill_ids) > self.max_prefills_per_step:
                raise ShapeNotCompiledError(
                    f"{len(prefill_ids)} prefills in one step; the prefill graph takes at most "
                    f"{self.max_prefills_per_step} (max_prefills_per_step)"
                )
            result = self._prefill(
                [(req_id, computed[req_id], scheduler_output.num_scheduled_tokens[req_id]) for req_id in prefill_ids],
                sum(padded[req_id] for req_id in prefill_ids),
            )
        else:
            result = self._decode(req_ids, computed)
        fault = self.faults.take()
        if fault is not None:
            if fault.kind == "timeout":
                self.clock.advance(fault.hang_s)
            raise step_failure(fault, f"a {result.kind} step (bucket {result.bucket}, {len(req_ids)} requests)")
        if self.faults.slowdown != 1.0:
            result = replace(result, seconds=result.seconds * self.faults.slowdown)
        self.clock.advance(result.seconds)
        if self.on_step is not None:
            self.on_step(result)
        return result

    def _update_requests(self, scheduler_output: vllm_compat.SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            prompt = list(new.prompt_token_ids or [])
            if not prompt:
                raise ShapeNotCompiledError(
                    f"request {new.req_id} has no prompt token ids (embeddings are not supported)"
                )
            adapter = 0 if new.lora_request is None else new.lora_request.lora_int_id
            if adapter and adapter not in self.adapter_ranks:
                raise ShapeNotCompiledError(f"request {new.req_id} names LoRA adapter {adapter}, which is not loaded")
            self.requests[new.req_id] = RequestState(
                prompt_token_ids=prompt,
                block_ids=list(new.block_ids[0]),
                token_ids=list(prompt),
                # An adapter changes the reply: the same prompt gets another one from each adapter.
                digest=zlib.crc32(repr((prompt, adapter) if adapter else prompt).encode()),
                lora_adapter=adapter,
            )
        cached = scheduler_output.scheduled_cached_reqs
        resumed = vllm_compat.resumed_req_ids(cached)
        for req_id, new_block_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            state = self.requests[req_id]
            if req_id in resumed:
                # A resumed request's blocks are all given again.
                state.block_ids = []
            if new_block_ids is not None:
                state.block_ids.extend(new_block_ids[0])

    def _prefill(self, chunks: list[tuple[str, int, int]], padded_len: int) -> StepResult:
        """One prefill graph over ``chunks`` (request, computed before, real tokens), padded once to ``padded_len``."""
        if padded_len not in self.prefill_buckets:
            described = ", ".join(f"request {req_id}, {num_tokens} real" for req_id, _, num_tokens in chunks)
            raise ShapeNotCompiledError(
                f"no compiled prefill graph for {padded_len} tokens ({described}); "
                f"compiled buckets: {self.prefill_buckets}"
            )
        sequences = [
            PrefillSequence(
                self.requests[req_id].prompt_token_ids[computed : computed + num_tokens],
                computed,
                self.requests[req_id].block_ids,
            )
            for req_id, computed, num_tokens in chunks
        ]
        inputs = pad_packed_prefill(sequences, self.block_size, padded_len)
        assert len(inputs.input_ids) == padded_len, "the padded inputs must have the graph's shape"
        sampled: list[list[int]] = []
        for req_id, computed, num_tokens in chunks:
            state = self.requests[req_id]
            end = computed + num_tokens
            # Only each sequence's last real position's logits are read (inputs.logits_indices).
            sampled.append([self._sample(state, end)] if end >= len(state.prompt_token_ids) else [])
            self.stats.prefill_chunks_by_tokens[num_tokens] += 1
        real = sum(num_tokens for _, _, num_tokens in chunks)
        # The padding is the last sequence's: its share of the bucket runs to the end.
        shares = [(num_tokens, computed) for _, computed, num_tokens in chunks]
        shares[-1] = (shares[-1][0] + padded_len - real, shares[-1][1])
        seconds = self.cost.packed_prefill_seconds(shares) + self.cost.lora_seconds(
            self._lora_tokens((req_id, num_tokens) for req_id, _, num_tokens in chunks)
        )
        self.stats.prefill_steps_by_bucket[padded_len] += 1
        self.stats.padding_tokens_by_bucket[padded_len] += padded_len - real
        output = vllm_compat.runner_output([req_id for req_id, _, _ in chunks], sampled)
        return StepResult(output, "prefill", padded_len, real, seconds)

    def _decode(self, req_ids: list[str], computed: dict[str, int]) -> StepResult:
        states = [self.requests[req_id] for req_id in req_ids]
        positions = [computed[req_id] for req_id in req_ids]
        for req_id, state, position in zip(req_ids, states, positions, strict=True):
            if position >= len(state.token_ids):
                raise RuntimeError(f"decode of {req_id} at position {position} before its token was sampled")
        try:
            inputs = pad_decode(
                [state.token_ids[position] for state, position in zip(states, positions, strict=True)],
                positions,
                [kv_slot(p, s.block_ids, self.block_size) for s, p in zip(states, positions, strict=True)],
                self.decode_buckets,
            )
            bucket = get_bucket_for_count(len(req_ids), self.decode_buckets)
            # The graph whose context holds the longest sequence after this step's token (vLLM Neuron's choice).
            context = get_bucket_for_count(max(positions) + 1, self.decode_context_buckets)
        except ValueError as error:
            raise ShapeNotCompiledError(f"no compiled decode graph: {error}") from None
        assert len(inputs.input_ids) == bucket, "the padded batch must have the graph's shape"
        sampled = [[self._sample(state, position + 1)] for state, position in zip(states, positions, strict=True)]
        seconds = self.cost.decode_seconds(bucket, context) + self.cost.lora_seconds(
            self._lora_tokens((req_id, 1) for req_id in req_ids)
        )
        self.stats.decode_steps_by_bucket[bucket] += 1
        self.stats.decode_steps_by_context[context] += 1
        output = vllm_compat.runner_output(req_ids, sampled)
        return StepResult(output, "decode", bucket, len(req_ids), seconds)

    def _lora_tokens(self, tokens: Iterable[tuple[str, int]]) -> list[tuple[int, int]]:
        """Each LoRA adapter in a step: its rank and the tokens that run through it."""
        by_adapter: Counter[int] = Counter()
        for req_id, count in tokens:
            if self.requests[req_id].lora_adapter:
                by_adapter[self.requests[req_id].lora_adapter] += count
        return [(self.adapter_ranks.get(adapter, 0), count) for adapter, count in by_adapter.items()]

    def _sample(self, state: RequestState, position: int) -> int:
        """The token at ``position``; the device records it, as it feeds it to the next decode."""
        token = sampled_token(state.digest, position, self.vocab_size)
        if position == len(state.token_ids):
            state.token_ids.append(token)
        return token
