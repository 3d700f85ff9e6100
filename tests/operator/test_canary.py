"""Canary analysis: the engines' metrics read, the two revisions compared, and the steps the canary takes."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from neuronfleet.operator import api, plan
from neuronfleet.operator.policy import canary, rollout
from neuronfleet.operator.policy.canary import CanaryInput, Figures, Verdict
from neuronfleet.operator.policy.conditions import Reason

T0 = datetime.datetime(2026, 12, 5, 6, 0, tzinfo=datetime.UTC)
#: vLLM's own bounds for time to first token (seconds), the start of them.
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
CANARY = api.Canary.model_validate({"steps": [{"weight": 10, "pauseSeconds": 30}, {"weight": 50, "pauseSeconds": 30}]})


def engine_metrics(
    ttfts: list[float], itls: list[float], *, ok: int, failed: int = 0, padding: int = 0, prefill: int = 0
) -> str:
    """An engine's /metrics as prometheus-client writes it, with the families vLLM and the engine export."""
    registry = CollectorRegistry()
    requests = Counter("http_requests", "Requests.", ["handler", "method", "status"], registry=registry)
    requests.labels("/v1/completions", "POST", "2xx").inc(ok)
    requests.labels("/v1/completions", "POST", "5xx").inc(failed)
    requests.labels("/v1/models", "GET", "2xx").inc(1000)  # probes: not completions
    ttft = Histogram(
        "vllm:time_to_first_token_seconds", "TTFT.", ["model_name"], buckets=TTFT_BOUNDS, registry=registry
    )
    itl = Histogram("vllm:inter_token_latency_seconds", "ITL.", ["model_name"], buckets=ITL_BOUNDS, registry=registry)
    for seconds in ttfts:
        ttft.labels("m").observe(seconds)
    for seconds in itls:
        itl.labels("m").observe(seconds)
    Counter("neuronfleet:padding_tokens", "Padding.", registry=registry).inc(padding)
    chunks = Histogram("neuronfleet:prefill_chunk_tokens", "Chunks.", buckets=(64, 128, 256), registry=registry)
    if prefill:
        chunks.observe(prefill)
    return generate_latest(registry).decode()


def test_an_engines_metrics_give_its_completions_errors_latencies_and_padding() -> None:
    figures = canary.parse_figures(
        engine_metrics([0.05] * 99 + [0.9], [0.03] * 10, ok=97, failed=3, padding=30, prefill=90)
    )
    assert (figures.requests, figures.errors) == (100, 3)
    assert figures.error_rate == pytest.approx(0.03)
    assert figures.padding_share == pytest.approx(0.25)
    assert figures.ttft[float("inf")] == 100
    # 99 of 100 at or below 60 ms: the p99 lies in the (0.04, 0.06] bucket, the p50 too.
    assert 0.04 < (canary.quantile(figures.ttft, 0.99) or 0) <= 0.06
    assert canary.quantile(figures.ttft, 1.0) == pytest.approx(1.0)
    assert canary.quantile(figures.itl, 0.5) == pytest.approx(0.025 + 0.025 * 0.5)


def test_a_quantile_of_nothing_is_none_and_past_the_last_bound_is_that_bound() -> None:
    assert canary.quantile({}, 0.99) is None
    assert canary.quantile({1.0: 0, float("inf"): 0}, 0.99) is None
    assert canary.quantile({1.0: 0, float("inf"): 5}, 0.99) == 1.0


def test_a_revisions_count_since_the_start_subtracts_each_pods_own_and_survives_a_restart() -> None:
    start = {"a": Figures(requests=50, ttft={1.0: 50, float("inf"): 50}), "b": Figures(requests=80)}
    now = {
        "a": Figures(requests=70, ttft={1.0: 60, float("inf"): 70}),
        # b restarted: its counts began again at zero, so all it has is since the start.
        "b": Figures(requests=5),
        # c is new.
        "c": Figures(requests=12),
    }
    total = canary.since(start, now)
    assert total.requests == 20 + 5 + 12
    assert total.ttft == {1.0: 10, float("inf"): 20}


def figures(ttft_s: float, requests: int, *, errors: int = 0, padding: float = 0.0) -> Figures:
    """``requests`` answered, every first token at ``ttft_s`` (one bucket), 10 tokens a request at 30 ms."""
    ttft = {bound: requests if ttft_s <= bound else 0 for bound in (*TTFT_BOUNDS, float("inf"))}
    itl = {bound: 10 * requests if bound >= 0.05 else 0 for bound in (*ITL_BOUNDS, float("inf"))}
    return Figures(requests, errors, ttft, itl, padding * 1000, (1 - padding) * 1000)


LIMITS = api.CanaryAnalysis()


def test_the_analysis_waits_for_its_minimum_of_canary_completions() -> None:
    waited = canary.analyse(LIMITS, figures(0.05, 99), figures(0.05, 900))
    assert waited.verdict is Verdict.WAIT
    assert "99 of the 100 completions" in waited.message


def test_a_canary_as_fast_as_the_stable_passes_with_its_figures() -> None:
    passed = canary.analyse(LIMITS, figures(0.05, 120), figures(0.05, 1000))
    assert passed.verdict is Verdict.PASS
    assert "TTFT p99" in passed.message
    assert "1.00x" in passed.message
    assert "over 120 canary and 1000 stable completions" in passed.message


@pytest.mark.parametrize(
    ("canary_figures", "broken"),
    [
        (figures(0.5, 120), f"TTFT p99 498 ms = 8.32x the stable's 60 ms (limit {LIMITS.max_ttft_p99_ratio:g}x)"),
        (figures(0.05, 120, errors=3), f"5xx 2.5% against 0.0% (limit +{LIMITS.max_error_rate_increase:.1%})"),
        (
            figures(0.05, 120, padding=0.3),
            f"padding 30.0% of prefill tokens against 5.0% (limit +{LIMITS.max_padding_share_increase:.1%})",
        ),
    ],
)
def test_a_canary_that_breaks_a_limit_fails_naming_it(canary_figures: Figures, broken: str) -> None:
    failed = canary.analyse(LIMITS, canary_figures, figures(0.05, 1000, padding=0.05))
    assert failed.verdict is Verdict.FAIL
    assert failed.message.startswith("limits broken: ")
    assert broken in failed.message


def test_a_canary_too_slow_fails_once_its_minimum_of_requests_started_before_they_complete() -> None:
    stable = figures(0.05, 1000)
    slow_started = dataclasses.replace(figures(0.5, 100), requests=4)
    failed = canary.analyse(LIMITS, slow_started, stable)
    assert failed.verdict is Verdict.FAIL
    assert "TTFT p99" in failed.message
    assert "over 100 canary requests started, 4 completed" in failed.message
    # Fewer started than the minimum, or as fast as the stable: it waits for its completions.
    assert canary.analyse(LIMITS, dataclasses.replace(figures(0.5, 99), requests=4), stable).verdict is Verdict.WAIT
    fast_started = dataclasses.replace(figures(0.05, 100), requests=4)
    assert canary.analyse(LIMITS, fast_started, stable).verdict is Verdict.WAIT


@pytest.mark.parametrize(
    ("stable", "weight", "replicas"), [(2, 10, 1), (2, 50, 2), (9, 10, 1), (4, 90, 36), (1, 50, 1)]
)
def test_canary_replicas_give_the_weight_as_a_share_of_all_replicas(stable: int, weight: int, replicas: int) -> None:
    assert canary.canary_replicas(stable, weight) == replicas


PASS = canary.Analysis(Verdict.PASS, "TTFT p99 50 ms = 1.00x")
FAIL = canary.Analysis(Verdict.FAIL, "limits broken: TTFT p99 500 ms = 10.00x")


def step(
    state: api.CanaryStatus, *, ready: bool = True, analysis: canary.Analysis | None = PASS, at: float = 0
) -> tuple[api.CanaryStatus, list[str]]:
    moved, events = canary.advance(CanaryInput(CANARY, state, 2, ready, analysis, T0 + datetime.timedelta(seconds=at)))
    return moved, [event.reason for event in events]


def test_a_canary_steps_on_after_each_pause_and_is_promoted_after_the_last() -> None:
    state = canary.start(CANARY, "abc", 2)
    assert (state.phase, state.weight, state.canary_replicas, state.step_started_at) == ("Progressing", 10, 1, None)
    # Its replicas are not Ready yet: the pause has not begun, whatever the analysis says.
    state, events = step(state, ready=False)
    assert state.step_started_at is None
    assert events == []
    state, events = step(state, at=1)
    assert state.step_started_at == T0 + datetime.timedelta(seconds=1)
    # Within the pause a passing analysis changes nothing.
    state, events = step(state, at=30)
    assert (state.step, events) == (0, [])
    state, events = step(state, at=31)
    assert (state.step, state.weight, state.canary_replicas, state.step_started_at) == (1, 50, 2, None)
    assert events == [Reason.CANARY_STEPPED]
    state, _ = step(state, at=40)
    # Not enough requests yet at the end of the pause: it holds.
    state, events = step(state, analysis=canary.Analysis(Verdict.WAIT, "20 of the 100"), at=80)
    assert (state.phase, events) == ("Progressing", [])
    state, events = step(state, at=81)
    assert (state.phase, state.weight, events) == ("Promoted", 100, [Reason.CANARY_PROMOTED])
    # A promoted canary stays so.
    assert step(state, analysis=FAIL, at=90) == (state, [])


def test_a_canary_is_aborted_at_the_first_failed_analysis_even_within_a_pause() -> None:
    state, _ = step(canary.start(CANARY, "abc", 2), at=0)
    aborted, events = step(state, analysis=FAIL, at=5)
    assert (aborted.phase, aborted.canary_replicas, aborted.analysis) == ("Aborted", 0, FAIL.message)
    # The Ready condition's move to CanaryAborted is the event (service_status.service_status).
    assert events == []
    assert step(aborted, analysis=PASS, at=60) == (aborted, [])


def test_behind_a_router_a_canary_gets_a_steps_weight_once_its_replicas_are_ready_and_none_once_it_ends() -> None:
    state = canary.start(CANARY, "new", 2)
    # Its replica not Ready yet: no request for it; Ready: the step's weight.
    assert canary.routed_weight(CANARY, state, replicas_ready=False) == 0
    assert canary.routed_weight(CANARY, state, replicas_ready=True) == 10
    stepped = canary.replace_state(state, step=1, weight=50, canary_replicas=2)
    # The next step's replicas starting: the step before's weight holds meanwhile.
    assert canary.routed_weight(CANARY, stepped, replicas_ready=False) == 10
    assert canary.routed_weight(CANARY, stepped, replicas_ready=True) == 50
    for ended in ("Aborted", "Promoted"):
        assert canary.routed_weight(CANARY, canary.replace_state(stepped, phase=ended), replicas_ready=True) == 0
    assert canary.revision_split("old", 10, routed=True) == plan.RevisionSplit("old", 10)
    # No weight, or no router (the Service splits by replica count): one pool, no split.
    assert canary.revision_split("old", 0, routed=True) is None
    assert canary.revision_split("old", 10, routed=False) is None


def test_behind_a_router_the_stable_pool_holds_to_its_revision_until_the_canary_is_promoted() -> None:
    state = canary.start(CANARY, "new", 2)
    assert canary.stable_pool_revision(state, "old", routed=True) == "old"
    assert canary.stable_pool_revision(state, "old", routed=False) is None
    # Aborted: the canary's replicas may still be draining, outside the stable pool.
    aborted = canary.replace_state(state, phase="Aborted", canary_replicas=0)
    assert canary.stable_pool_revision(aborted, "old", routed=True) == "old"
    # Promoted: its revision rolls out through the one pool.
    promoted = canary.replace_state(state, phase="Promoted", weight=100)
    assert canary.stable_pool_revision(promoted, "old", routed=True) is None
    assert canary.stable_pool_revision(None, "old", routed=True) is None


def router(split: plan.RevisionSplit | None, **status: int) -> dict[str, Any]:
    """A router Deployment of 2 replicas made for ``split``, with ``status``."""
    annotations = {plan.SPLIT_ANNOTATION: split.describe()} if split is not None else {}
    return {
        "metadata": {"generation": 3},
        "spec": {"replicas": 2, "template": {"metadata": {"annotations": annotations}}},
        "status": status,
    }


ROLLED = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}


@pytest.mark.parametrize(
    ("body", "split", "routes"),
    [
        (router(plan.RevisionSplit("old", 10), **ROLLED), plan.RevisionSplit("old", 10), True),
        # Made for another weight, or for none.
        (router(plan.RevisionSplit("old", 10), **ROLLED), plan.RevisionSplit("old", 50), False),
        (router(None, **ROLLED), plan.RevisionSplit("old", 10), False),
        (router(plan.RevisionSplit("old", 10), **ROLLED), None, False),
        (router(None, **ROLLED), None, True),
        # Not rolled out yet, a pod not Ready, or an old pod still draining what it routed.
        (router(None, **{**ROLLED, "observedGeneration": 2}), None, False),
        (router(None, **{**ROLLED, "updatedReplicas": 1, "replicas": 3}), None, False),
        (router(None, **{**ROLLED, "readyReplicas": 1}), None, False),
        (router(None, **ROLLED, terminatingReplicas=1), None, False),
        # No router at all routes by no split.
        (None, None, True),
        (None, plan.RevisionSplit("old", 10), False),
    ],
)
def test_the_router_routes_by_a_split_once_every_pod_was_made_for_it_and_none_other_drains(
    body: dict[str, Any] | None, split: plan.RevisionSplit | None, routes: bool
) -> None:
    assert rollout.router_routes_by(body, split) is routes
