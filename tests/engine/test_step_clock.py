"""The scheduler's timing of device steps, where the executor reports none: on a clock the test moves, then
through the real vLLM scheduler."""

from __future__ import annotations

import itertools

import pytest
from prometheus_client import CollectorRegistry

from neuronfleet.contract import metrics
from neuronfleet.engine.offline.driver import run_scenario
from neuronfleet.engine.offline.scenarios import SCENARIOS
from neuronfleet.engine.scheduler.metrics import NeuronMetrics, SchedulerObserver
from neuronfleet.engine.scheduler.neuron import NeuronScheduler
from neuronfleet.engine.scheduler.step_clock import StepClock, TimedStep

pytestmark = pytest.mark.vllm_matrix


class Clock:
    """Seconds the test sets."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_step_runs_from_its_dispatch_or_the_last_return_whichever_is_later() -> None:
    clock = Clock()
    steps = StepClock(clock)
    steps.dispatched(1, "prefill")
    clock.now = 0.4
    # Async scheduling: the next step leaves while the first runs; the device takes it once the first is back.
    steps.dispatched(2, "decode")
    clock.now = 1.0
    assert steps.returned(1) == TimedStep("prefill", 1.0)
    clock.now = 1.25
    assert steps.returned(2) == TimedStep("decode", 0.25)
    # Idle between steps: not device time.
    clock.now = 5.0
    steps.dispatched(3, "decode")
    clock.now = 5.5
    assert steps.returned(3) == TimedStep("decode", 0.5)
    assert steps.returned(4) is None, "a step never seen leaving"


def test_the_real_schedulers_steps_are_timed_from_schedule_to_update_from_output(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Synchronous scheduling on a clock that moves a second at each reading: a step is dispatched at one reading
    and back at the next, so every step counts one second, under its kind."""
    registry = CollectorRegistry()
    ticks = itertools.count()
    observer = SchedulerObserver(NeuronMetrics(registry, 8192), clock=lambda: float(next(ticks)))
    monkeypatch.setattr(NeuronScheduler, "step_observers", [observer])
    monkeypatch.setattr(NeuronScheduler, "output_observers", [observer.returned])
    scheduler = run_scenario(SCENARIOS["prompt-32000"], async_scheduling=False).scheduler

    def busy(kind: str) -> float | None:
        return registry.get_sample_value(f"{metrics.DEVICE_BUSY_SECONDS}_total", {"kind": kind})

    assert busy("prefill") == sum(scheduler.prefill_steps_by_bucket.values()) == 4
    assert busy("decode") == sum(scheduler.decode_steps_by_bucket.values())

    # Once the executor reports its own steps (the simulated device), the scheduler's timing stands down.
    observer.executor_times_steps = True
    run_scenario(SCENARIOS["prompt-32000"], async_scheduling=False)
    assert busy("prefill") == 4
