"""Drive a real vLLM scheduler offline: no model weights, no device, no network.

``OfflineEngine`` builds vLLM's configuration from an ``EngineConfig`` and a tiny
local model shape, constructs the scheduler class exactly as vLLM's engine core
does, and steps it the way the engine core does (one step in flight for the sync
class, two for the async one). The device is a stand-in that returns one
deterministic token per request that completes its prompt or decodes. The trace
tool, the scheduler tests and the benchmarks all run on this.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from vllm.config import CacheConfig, DeviceConfig, LoRAConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.structured_output import StructuredOutputManager

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.lora import LoraSlots
from neuronfleet.contract.model_shapes import TINY_VOCAB_SIZE, tiny_llama_config
from neuronfleet.engine.offline.scenarios import Scenario, prompt_token_ids
from neuronfleet.engine.paths import user_cache
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.neuron import NeuronAsyncScheduler, NeuronScheduler, SchedulerState

AnyScheduler = TypeVar("AnyScheduler", bound=vllm_compat.Scheduler)


def tiny_model_dir(max_model_len: int) -> Path:
    """A local model directory holding only a tiny Llama ``config.json``.

    vLLM reads the architecture and limits from it; the scheduler never needs
    weights or a tokenizer. Kept under the user cache so it is written once.
    """
    path = user_cache("models", f"tiny-llama-{max_model_len}")
    config = tiny_llama_config(max_model_len)
    config_file = path / "config.json"
    if not config_file.exists():
        path.mkdir(parents=True, exist_ok=True)
        partial = path / f"config.json.{os.getpid()}"
        partial.write_text(json.dumps(config, indent=2))
        partial.replace(config_file)
    return path


def build_vllm_config(
    engine: EngineConfig, *, async_scheduling: bool, enable_prefix_caching: bool, lora: LoraSlots | None = None
) -> VllmConfig:
    """vLLM's configuration for ``engine`` (with ``lora`` slots) on the tiny local model shape, on CPU."""
    model_config = ModelConfig(
        model=str(tiny_model_dir(engine.max_model_len)),
        max_model_len=engine.max_model_len,
        skip_tokenizer_init=True,
        dtype=engine.dtype,
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        async_scheduling=async_scheduling,
    )
    cache_config = CacheConfig(block_size=engine.block_size, enable_prefix_caching=enable_prefix_caching)
    return VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
        lora_config=None if lora is None else LoRAConfig(max_loras=lora.max_loras, max_lora_rank=lora.max_lora_rank),
        additional_config={"neuron_config": engine.neuron_config()},
    )


def build_scheduler(
    engine: EngineConfig,
    *,
    num_kv_blocks: int,
    async_scheduling: bool = True,
    enable_prefix_caching: bool = False,
    lora: LoraSlots | None = None,
) -> NeuronScheduler:
    """A Neuron scheduler for ``engine`` over a KV cache of ``num_kv_blocks`` blocks."""
    vllm_config = build_vllm_config(
        engine, async_scheduling=async_scheduling, enable_prefix_caching=enable_prefix_caching, lora=lora
    )
    cls = NeuronAsyncScheduler if async_scheduling else NeuronScheduler
    return construct_scheduler(cls, vllm_config, num_kv_blocks=num_kv_blocks)


def construct_scheduler(cls: type[AnyScheduler], vllm_config: VllmConfig, *, num_kv_blocks: int) -> AnyScheduler:
    """Construct ``cls`` as vLLM's engine core does, over a KV cache of one full-attention group."""
    block_size = vllm_config.cache_config.block_size
    vllm_config.cache_config.num_gpu_blocks = num_kv_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_kv_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32),
            )
        ],
    )
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size,
        log_stats=False,
    )


def stand_in_device_output(output: vllm_compat.SchedulerOutput, prompt_lens: Mapping[str, int]) -> ModelRunnerOutput:
    """What the stand-in device returns for ``output``: one token per request that reaches its prompt's end."""
    computed = vllm_compat.pre_increment_computed_tokens(output)
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for req_id in req_ids:
        end = computed[req_id] + output.num_scheduled_tokens[req_id]
        # A chunk that stops inside the prompt samples nothing.
        sampled.append([sampled_token(req_id, end)] if end >= prompt_lens[req_id] else [])
    return vllm_compat.runner_output(req_ids, sampled)


def sampled_token(req_id: str, position: int) -> int:
    """The stand-in device's output: a fixed function of request and position."""
    return (sum(req_id.encode()) * 131 + position * 31) % (TINY_VOCAB_SIZE - 1) + 1


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step."""

    req_id: str
    num_tokens: int
    num_tokens_padded: int
    computed_before: int
    is_prefill: bool


@dataclass(frozen=True)
class StepRecord:
    """What one ``schedule()`` call decided."""

    index: int
    state: SchedulerState
    scheduled: tuple[ScheduledRequest, ...]
    num_hidden_decodes: int
    num_waiting: int
    num_running: int
    #: Requests the base scheduler preempted (Neuron never should).
    preempted: tuple[str, ...] = ()

    @property
    def is_prefill(self) -> bool:
        """True when this step ran a prefill chunk."""
        return any(item.is_prefill for item in self.scheduled)


@dataclass
class RequestProgress:
    """Tokens a request has received so far."""

    prompt_len: int
    max_tokens: int
    output_tokens: list[int] = field(default_factory=list)
    finished: bool = False


class OfflineEngine:
    """Steps a Neuron scheduler as vLLM's engine core does, with a stand-in device."""

    def __init__(self, scheduler: NeuronScheduler, *, keep_steps: bool = True) -> None:
        self.scheduler = scheduler
        #: Without, :attr:`steps` stays empty: a fleet's long runs would hold every step's record.
        self.keep_steps = keep_steps
        self.num_steps = 0
        is_async = isinstance(scheduler, vllm_compat.AsyncScheduler)
        # The engine core keeps two steps in flight under async scheduling.
        self.max_in_flight = 2 if is_async else 1
        self.in_flight: deque[vllm_compat.SchedulerOutput] = deque()
        self.progress: dict[str, RequestProgress] = {}
        self.steps: list[StepRecord] = []
        cache_config = scheduler.vllm_config.cache_config
        self._block_hasher = None
        if cache_config.enable_prefix_caching:
            hash_fn = get_hash_fn_by_name(cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self._block_hasher = get_request_block_hasher(scheduler.block_size, hash_fn)

    def add_request(
        self, req_id: str, prompt_token_ids: Sequence[int], max_tokens: int, lora_request: LoRARequest | None = None
    ) -> None:
        """Queue a request (for a LoRA adapter, with ``lora_request``) as the engine core would on arrival."""
        request = vllm_compat.Request(
            req_id,
            list(prompt_token_ids),
            SamplingParams(max_tokens=max_tokens, ignore_eos=True),
            None,
            block_hasher=self._block_hasher,
            lora_request=lora_request,
        )
        self.progress[req_id] = RequestProgress(prompt_len=len(prompt_token_ids), max_tokens=max_tokens)
        self.scheduler.add_request(request)

    @property
    def has_work(self) -> bool:
        """True while requests are unfinished or outputs are in flight."""
        return bool(self.scheduler.has_requests() or self.in_flight)

    def step(self) -> StepRecord | None:
        """Schedule once if there is work and room, else complete the oldest step in flight."""
        record = None
        if self.scheduler.has_requests():
            output = self.scheduler.schedule()
            record = self._record(output)
            self.in_flight.append(output)
            executed = output.total_num_scheduled_tokens > 0
            if len(self.in_flight) < self.max_in_flight and (executed or self.scheduler.has_requests()):
                return record
        if self.in_flight:
            self._complete(self.in_flight.popleft())
        return record

    def run(self, max_steps: int = 100_000) -> list[StepRecord]:
        """Step until every request finished; raise if that takes more than ``max_steps``."""
        for _ in range(max_steps):
            if not self.has_work:
                return self.steps
            self.step()
        raise RuntimeError(f"requests still unfinished after {max_steps} steps: {self.unfinished()}")

    def unfinished(self) -> list[str]:
        """Ids of requests that have not finished."""
        return [req_id for req_id, progress in self.progress.items() if not progress.finished]

    def _record(self, output: vllm_compat.SchedulerOutput) -> StepRecord:
        computed = vllm_compat.pre_increment_computed_tokens(output)
        padded = vllm_compat.padded_counts(output)
        progress = self.progress
        prefill_ids = set(
            vllm_compat.scheduled_prefill_ids(output, lambda req_id: progress[req_id].prompt_len, computed)
        )
        scheduled = tuple(
            ScheduledRequest(
                req_id=req_id,
                num_tokens=num_tokens,
                num_tokens_padded=padded[req_id],
                computed_before=computed[req_id],
                is_prefill=req_id in prefill_ids,
            )
            for req_id, num_tokens in output.num_scheduled_tokens.items()
        )
        record = StepRecord(
            index=self.num_steps,
            state=self.scheduler.state,
            scheduled=scheduled,
            num_hidden_decodes=self.scheduler.last_num_hidden_decodes,
            num_waiting=vllm_compat.waiting_count(self.scheduler),
            num_running=len(self.scheduler.running),
            preempted=tuple(sorted(output.preempted_req_ids or ())),
        )
        self.num_steps += 1
        if self.keep_steps:
            self.steps.append(record)
        return record

    def _complete(self, output: vllm_compat.SchedulerOutput) -> None:
        """Feed the stand-in device's result of ``output`` back to the scheduler."""
        # The step's own requests: a long run's finished ones would make every step cost more.
        prompt_lens = {req_id: self.progress[req_id].prompt_len for req_id in output.num_scheduled_tokens}
        runner_output = stand_in_device_output(output, prompt_lens)
        for engine_outputs in self.scheduler.update_from_output(output, runner_output).values():
            for item in engine_outputs.outputs:
                progress = self.progress[item.request_id]
                progress.output_tokens.extend(item.new_token_ids)
                if item.finish_reason is not None:
                    progress.finished = True


def run_scenario(
    scenario: Scenario,
    *,
    async_scheduling: bool,
    after_step: Callable[[OfflineEngine, StepRecord | None, int], None] | None = None,
    max_iterations: int = 100_000,
) -> OfflineEngine:
    """Run every request of ``scenario`` to completion on the real scheduler.

    ``after_step(engine, record, in_flight_before)`` is called after every engine
    step with what it scheduled (``None`` when it only completed a step in flight)
    and the number of outputs that were in flight before it.
    """
    scheduler = build_scheduler(
        scenario.engine,
        num_kv_blocks=scenario.num_kv_blocks,
        async_scheduling=async_scheduling,
        enable_prefix_caching=scenario.enable_prefix_caching,
    )
    engine = OfflineEngine(scheduler)
    pending = sorted(scenario.requests, key=lambda request: request.arrival_step)
    for _ in range(max_iterations):
        if not (pending or engine.has_work):
            return engine
        # An idle engine jumps ahead to the next arrival.
        while pending and (pending[0].arrival_step <= len(engine.steps) or not engine.has_work):
            request = pending.pop(0)
            engine.add_request(request.req_id, prompt_token_ids(request), request.max_tokens)
        in_flight_before = len(engine.in_flight)
        record = engine.step()
        if after_step is not None:
            after_step(engine, record, in_flight_before)
    raise RuntimeError(f"scenario {scenario.name} did not finish in {max_iterations} iterations: {engine.unfinished()}")
