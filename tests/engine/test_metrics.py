"""The neuronfleet: metrics, fed by the scheduler's step observers, read back as the recommender reads them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from neuronfleet.contract import metrics
from neuronfleet.contract.config import EngineConfig
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler, run_scenario
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


def test_the_prefill_backlog_gauge_counts_every_prompt_token_not_yet_prefilled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three prompts of 3,000 tokens through 1,024-token chunks: after every step the gauge is what was sent less
    what the steps prefilled (the waiting requests' whole prompts, the running one's rest)."""
    registry = CollectorRegistry()
    engine = EngineConfig(max_num_seqs=4, max_num_batched_tokens=1024, max_model_len=4096)
    observer = SchedulerObserver(NeuronMetrics(registry, 1024))
    monkeypatch.setattr(NeuronScheduler, "step_observers", [observer])
    offline = OfflineEngine(build_scheduler(engine, num_kv_blocks=1024, async_scheduling=False))
    for index in range(3):
        offline.add_request(f"r{index}", [index + 1] * 3000, max_tokens=4)
    prefilled, seen = 0, []
    while offline.has_work:
        record = offline.step()
        if record is None:
            continue
        prefilled += sum(request.num_tokens for request in record.scheduled if request.is_prefill)
        seen.append(sample(registry, metrics.PREFILL_TOKENS_PENDING))
        assert seen[-1] == 9000 - prefilled
    assert seen[0] == 9000 - 1024, "the first chunk is counted out as it is scheduled"
    assert seen[-1] == 0
