"""The simulated Neuron device, driven by the real Neuron scheduler as vLLM's engine core drives it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from vllm.model_executor.models import ModelRegistry
from vllm.sampling_params import SamplingParams

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.faults import NeuronRuntimeError
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import ARCHITECTURE, get_shape
from neuronfleet.contract.sim_settings import ClockMode
from neuronfleet.engine.offline.driver import build_scheduler, construct_scheduler
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.device import (
    Clock,
    ShapeNotCompiledError,
    SimulatedNeuronDevice,
    StepResult,
    sampled_token,
)
from neuronfleet.engine.sim.faults import InjectedFault
from neuronfleet.engine.sim.platform import SimNeuronPlatform
from neuronfleet.engine.sim.tokenizer import FIRST_WORD_ID

pytestmark = pytest.mark.vllm_matrix

ENGINE = EngineConfig(
    max_num_seqs=4,
    max_num_batched_tokens=256,
    max_model_len=1024,
    block_size=16,
    num_batched_tokens_buckets=[64, 128, 256],
    num_seqs_buckets=[1, 2, 4],
)
COST = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=8)


def make_device(
    prefill: Sequence[int] = (64, 128, 256),
    decode: Sequence[int] = (1, 2, 4),
    clock: ClockMode = "virtual",
    on_step: Callable[[StepResult], None] | None = None,
) -> SimulatedNeuronDevice:
    return SimulatedNeuronDevice(
        COST,
        block_size=ENGINE.block_size,
        prefill_buckets=prefill,
        decode_buckets=decode,
        decode_context_buckets=ENGINE.decode_context_buckets,
        clock=Clock(clock),
        on_step=on_step,
    )


def serve(
    scheduler: vllm_compat.Scheduler, device: SimulatedNeuronDevice, prompts: dict[str, list[int]], max_tokens: int
) -> dict[str, list[int]]:
    """Run every prompt to completion, one step in flight, as vLLM's engine core without async scheduling."""
    for req_id, prompt in prompts.items():
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        scheduler.add_request(vllm_compat.Request(req_id, prompt, params, None))
    outputs: dict[str, list[int]] = {req_id: [] for req_id in prompts}
    for _ in range(10_000):
        if not scheduler.has_requests():
            return outputs
        scheduler_output = scheduler.schedule()
        result = device.execute(scheduler_output)
        for engine_outputs in scheduler.update_from_output(scheduler_output, result.output).values():
            for item in engine_outputs.outputs:
                outputs[item.request_id].extend(item.new_token_ids)
    raise AssertionError("requests did not finish")


PROMPTS = {"a": [7] * 10, "b": list(range(10, 310)), "c": [9] * 64}


def test_every_request_gets_max_tokens_of_deterministic_words() -> None:
    outputs = serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), make_device(), PROMPTS, 12)
    assert {req_id: len(tokens) for req_id, tokens in outputs.items()} == {"a": 12, "b": 12, "c": 12}
    assert all(token >= FIRST_WORD_ID for tokens in outputs.values() for token in tokens)
    # The same prompts on a fresh engine, under other request ids, get the same tokens.
    renamed = {f"again-{req_id}": prompt for req_id, prompt in PROMPTS.items()}
    again = serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), make_device(), renamed, 12)
    assert {req_id.removeprefix("again-"): tokens for req_id, tokens in again.items()} == outputs


def test_the_device_computes_exactly_what_the_scheduler_padded() -> None:
    scheduler = build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False)
    device = make_device()
    serve(scheduler, device, PROMPTS, 5)
    assert device.stats.padding_tokens_by_bucket == scheduler.padding_tokens_by_bucket
    assert device.stats.prefill_steps_by_bucket == scheduler.prefill_steps_by_bucket
    assert device.stats.decode_steps_by_bucket == scheduler.decode_steps_by_bucket
    # 10 -> 64, 300 -> 256 + 44 in 64, 64 -> 64.
    assert device.stats.prefill_chunks_by_tokens == {10: 1, 44: 1, 64: 1, 256: 1}
    assert sum(device.stats.padding_tokens_by_bucket.values()) == 54 + 20


def test_the_virtual_clock_counts_the_cost_model_without_sleeping() -> None:
    steps: list[StepResult] = []
    device = make_device(clock="virtual", on_step=steps.append)
    started = time.monotonic()
    serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), device, PROMPTS, 50)
    assert time.monotonic() - started < 10
    step_seconds = [step.seconds for step in steps]
    assert device.clock.elapsed_s == pytest.approx(sum(step_seconds))
    # A prefill of 300 tokens pays for its two padded chunks, 256 and 64 tokens.
    assert COST.prefill_seconds(256, 0) in step_seconds
    assert COST.prefill_seconds(64, 256) in step_seconds
    # 50 tokens: the first from each prefill, then 49 decode steps (of up to three requests).
    assert len(step_seconds) - 4 >= 49
    # Every decode step reads the compiled context, max_model_len: no decode context buckets are set.
    assert device.stats.decode_steps_by_context == {ENGINE.max_model_len: len(step_seconds) - 4}
    assert device.clock.elapsed_s > 49 * COST.decode_seconds(1, ENGINE.max_model_len)


def kept_items(device: SimulatedNeuronDevice) -> int:
    """Entries in everything the device keeps between steps: its statistics and its requests."""
    return len(device.requests) + sum(len(value) for value in vars(device.stats).values())


def test_what_the_device_keeps_does_not_grow_with_the_steps_it_runs() -> None:
    # In `serve --device sim` the device runs for as long as the server: nothing may be kept per step.
    short, long = make_device(), make_device()
    serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), short, PROMPTS, 5)
    serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), long, PROMPTS, 500)
    assert sum(long.stats.decode_steps_by_bucket.values()) > 50 * sum(short.stats.decode_steps_by_bucket.values())
    assert kept_items(long) == kept_items(short)


def test_the_real_clock_sleeps_for_each_step() -> None:
    device = make_device(clock="real")
    started = time.monotonic()
    serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), device, {"a": [7] * 10}, 3)
    assert time.monotonic() - started >= device.clock.elapsed_s > 0


def test_a_prefill_bucket_that_was_not_compiled_is_refused() -> None:
    device = make_device(prefill=(64, 128))
    with pytest.raises(ShapeNotCompiledError, match=r"no compiled prefill graph for 256 tokens .*\[64, 128\]"):
        serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), device, {"b": [3] * 200}, 1)


def test_a_decode_batch_above_the_compiled_sizes_is_refused() -> None:
    device = make_device(decode=(1, 2))
    with pytest.raises(ShapeNotCompiledError, match="no compiled decode graph: count 3 exceeds the largest"):
        serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), device, PROMPTS, 4)


def test_a_step_mixing_prefill_and_decode_is_refused() -> None:
    # vLLM's own scheduler mixes them; the Neuron scheduler never does.
    scheduler = construct_scheduler(
        vllm_compat.Scheduler,
        build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False).vllm_config,
        num_kv_blocks=512,
    )
    device = make_device()
    original_schedule = scheduler.schedule

    def schedule_with_padding(throttle_prefills: bool = False) -> vllm_compat.SchedulerOutput:
        output = original_schedule(throttle_prefills)
        vllm_compat.set_padded_counts(output, {r: 64 for r in output.num_scheduled_tokens})
        return output

    scheduler.schedule = schedule_with_padding  # type: ignore[method-assign]  # a stand-in that pads everything
    with pytest.raises(ShapeNotCompiledError, match="mixes 1 prefill and 1 decode requests"):
        serve_staggered(scheduler, device)


def serve_staggered(scheduler: vllm_compat.Scheduler, device: SimulatedNeuronDevice) -> None:
    """One request decoding when a second arrives."""
    scheduler.add_request(vllm_compat.Request("first", [5] * 8, SamplingParams(max_tokens=8, ignore_eos=True), None))
    for _ in range(2):
        output = scheduler.schedule()
        scheduler.update_from_output(output, device.execute(output).output)
    scheduler.add_request(vllm_compat.Request("second", [6] * 8, SamplingParams(max_tokens=8, ignore_eos=True), None))
    output = scheduler.schedule()
    device.execute(output)


def first_step_failure(fault: InjectedFault) -> tuple[SimulatedNeuronDevice, NeuronRuntimeError]:
    """A device given ``fault``, and how its first step (a 10-token prefill) failed."""
    scheduler = build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False)
    device = make_device()
    scheduler.add_request(vllm_compat.Request("a", [7] * 10, SamplingParams(max_tokens=4, ignore_eos=True), None))
    device.faults.inject(fault)
    with pytest.raises(NeuronRuntimeError) as failed:
        device.execute(scheduler.schedule())
    return device, failed.value


def test_an_injected_error_fails_the_next_step_with_its_runtime_status_and_only_that_step() -> None:
    device, failure = first_step_failure(InjectedFault(kind="error", status=1202))
    assert failure.status.name == "NRT_EXEC_HW_ERR_NC_UE"
    assert failure.status.device_fault
    assert "a prefill step (bucket 64, 1 requests)" in str(failure)
    assert device.clock.elapsed_s == 0
    # Taken once: a fresh engine on the same device runs.
    outputs = serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), device, {"b": [7] * 10}, 3)
    assert len(outputs["b"]) == 3


def test_an_injected_timeout_hangs_the_step_then_fails_it_with_nrt_timeout() -> None:
    device, failure = first_step_failure(InjectedFault(kind="timeout", hang_s=30))
    assert (failure.status.name, failure.status.device_fault) == ("NRT_TIMEOUT", False)
    assert device.clock.elapsed_s == 30


def test_a_slow_device_takes_factor_times_the_cost_of_every_step() -> None:
    healthy: list[StepResult] = []
    slow: list[StepResult] = []
    serve(
        build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False),
        make_device(on_step=healthy.append),
        PROMPTS,
        8,
    )
    degraded = make_device(on_step=slow.append)
    degraded.faults.inject(InjectedFault(kind="slow", factor=2.5))
    serve(build_scheduler(ENGINE, num_kv_blocks=512, async_scheduling=False), degraded, PROMPTS, 8)
    assert [step.seconds for step in slow] == pytest.approx([2.5 * step.seconds for step in healthy])
    assert degraded.clock.elapsed_s == pytest.approx(2.5 * sum(step.seconds for step in healthy))


def test_sampled_tokens_are_words_of_the_vocabulary() -> None:
    tokens = {sampled_token(digest, position, 1024) for digest in range(50) for position in range(50)}
    assert min(tokens) >= FIRST_WORD_ID
    assert max(tokens) < 1024


def test_the_platform_has_vllm_inspect_the_model_class_in_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """vLLM would import torch and itself again in a subprocess to inspect the class: 10 s on 2 cores."""

    def no_subprocess(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"vLLM started a subprocess: {args}")

    # No model information cached from an earlier run, and no process to compute it in.
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    SimNeuronPlatform.pre_register_and_update()
    info = ModelRegistry.models[ARCHITECTURE].inspect_model_cls()
    assert info.is_text_generation_model
    assert not info.supports_multimodal
