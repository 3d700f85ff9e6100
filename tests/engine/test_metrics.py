"""The neuronfleet: metrics, fed by the scheduler's step observers, read back as the recommender reads them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from neuronfleet.engine.offline.driver import run_scenario
from neuronfleet.engine.offline.scenarios import SCENARIOS
from neuronfleet.engine.scheduler.metrics import NeuronMetrics, SchedulerObserver, chunk_bounds
from neuronfleet.engine.scheduler.neuron import NeuronScheduler
from neuronfleet.engine.tuning.exposition import CHUNK_METRIC, Kind, observed_lengths

pytestmark = pytest.mark.vllm_matrix


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


@pytest.mark.parametrize("scenario", ["prompt-5000", "decode-hidden", "kv-deadlock"])
def test_metrics_equal_the_schedulers_counters(scenario: str, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    chosen = SCENARIOS[scenario]
    observer = SchedulerObserver(NeuronMetrics(registry, chosen.engine.effective_max_num_batched_tokens))
    monkeypatch.setattr(NeuronScheduler, "step_observers", [observer])
    scheduler = run_scenario(chosen, async_scheduling=True).scheduler

    assert sample(registry, "neuronfleet:padding_tokens_total") == scheduler.total_padding_tokens
    for bucket, padding in scheduler.padding_tokens_by_bucket.items():
        assert sample(registry, "neuronfleet:padding_tokens_by_bucket_total", bucket=str(bucket)) == padding
    for bucket, steps in scheduler.prefill_steps_by_bucket.items():
        assert sample(registry, "neuronfleet:prefill_steps_total", bucket=str(bucket)) == steps
    for bucket, steps in scheduler.decode_steps_by_bucket.items():
        assert sample(registry, "neuronfleet:decode_steps_total", bucket=str(bucket)) == steps
    assert sample(registry, "neuronfleet:kv_admission_deferrals_total") == scheduler.num_kv_deferred_admissions
    assert sample(registry, f"{CHUNK_METRIC}_count") == sum(scheduler.prefill_steps_by_bucket.values())
    assert sample(registry, "neuronfleet:scheduler_state", state="IDLE") == 1.0


def test_kv_deferrals_are_counted() -> None:
    registry = CollectorRegistry()
    chosen = SCENARIOS["kv-deadlock"]
    observer = SchedulerObserver(NeuronMetrics(registry, chosen.engine.effective_max_num_batched_tokens))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(NeuronScheduler, "step_observers", [observer])
        run_scenario(chosen, async_scheduling=False)
    assert sample(registry, "neuronfleet:kv_admission_deferrals_total") > 0


def test_the_recommender_reads_the_chunk_histogram(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = CollectorRegistry()
    chosen = SCENARIOS["prompt-32000"]
    limit = chosen.engine.effective_max_num_batched_tokens
    observer = SchedulerObserver(NeuronMetrics(registry, limit))
    monkeypatch.setattr(NeuronScheduler, "step_observers", [observer])
    run_scenario(chosen, async_scheduling=True)
    observed = observed_lengths(generate_latest(registry).decode(), max_chunk=limit, max_prompt=32768)
    assert observed.kind is Kind.CHUNKS
    # 32000 tokens: three full chunks of 8192, then 7424, counted at its bound (7424 is a multiple of 128).
    assert observed.histogram == {8192: 3, 7424: 1}


def test_chunk_bounds() -> None:
    assert chunk_bounds(8192) == [float(b) for b in range(128, 8193, 128)]
    assert chunk_bounds(256) == [float(b) for b in range(16, 257, 16)]
    assert chunk_bounds(1000)[-1] == 1000.0
    assert len(chunk_bounds(1_048_576)) <= 64
