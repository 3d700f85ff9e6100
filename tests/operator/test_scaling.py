"""The KEDA ScaledObject a service's autoscaling plans, and the Autoscaling condition it reports."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pydantic import ValidationError

from neuronfleet.contract.scaling import signal_lag_s
from neuronfleet.engine.fleet.autoscaler import WarmFloor
from neuronfleet.operator import api, plan
from neuronfleet.operator.policy import scaling
from neuronfleet.operator.policy.conditions import ConditionType, Reason
from neuronfleet.operator.policy.rollout import ArtifactView, decide
from neuronfleet.operator.policy.service_status import ServiceStatusInput, service_status

OWNER = plan.Owner(api.API_VERSION, "NeuronInferenceService", "llama", "uid-1")
NS = "serving"
PROMETHEUS = "http://prometheus.monitoring:9090"
T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


def spec(**fields: Any) -> api.NeuronInferenceServiceSpec:
    return api.parse_service_spec({"model": {"uri": "hf://org/model"}, **fields})


def autoscaling(**fields: Any) -> api.Autoscaling:
    found = spec(autoscaling={"maxReplicas": 4, **fields}).autoscaling
    assert found is not None
    return found


def test_the_scaled_object_scales_the_service_itself_within_its_bounds() -> None:
    body = scaling.scaled_object(OWNER, NS, autoscaling(minReplicas=2), PROMETHEUS, paused=False)
    assert (body["apiVersion"], body["kind"], body["metadata"]["name"]) == ("keda.sh/v1alpha1", "ScaledObject", "llama")
    assert body["spec"]["scaleTargetRef"] == {
        "apiVersion": "neuronfleet.io/v1alpha1",
        "kind": "NeuronInferenceService",
        "name": "llama",
    }
    assert (body["spec"]["minReplicaCount"], body["spec"]["maxReplicaCount"]) == (2, 4)
    (ref,) = body["metadata"]["ownerReferences"]
    assert (ref["uid"], ref["controller"]) == ("uid-1", True)
    assert "annotations" not in body["metadata"]


def test_it_is_paused_while_nothing_can_serve() -> None:
    body = scaling.scaled_object(OWNER, NS, autoscaling(), PROMETHEUS, paused=True)
    assert body["metadata"]["annotations"] == {scaling.PAUSED_ANNOTATION: "true"}


def test_waiting_requests_per_replica_is_the_default_trigger_on_vllms_own_name() -> None:
    (waiting,) = scaling.triggers(NS, "llama", autoscaling(waitingRequestsPerReplica=6), PROMETHEUS)
    assert (waiting["type"], waiting["metricType"]) == ("prometheus", "AverageValue")
    assert waiting["metadata"] == {
        "serverAddress": PROMETHEUS,
        "query": 'sum(vllm:num_requests_waiting{namespace="serving",neuronfleet_io_service="llama"}) or vector(0)',
        "threshold": "6",
        "activationThreshold": "0",
    }


def test_kv_cache_usage_and_ttft_are_optional_triggers() -> None:
    found = scaling.triggers(NS, "llama", autoscaling(kvCacheUsage=0.8, ttftP95Seconds=2.5), PROMETHEUS)
    by_name = {t["name"]: t for t in found}
    assert set(by_name) == {"waiting-requests", "kv-cache-usage", "ttft-p95"}
    assert by_name["kv-cache-usage"]["metadata"]["query"].startswith("avg(vllm:kv_cache_usage_perc{")
    assert by_name["kv-cache-usage"]["metadata"]["threshold"] == "0.8"
    ttft = by_name["ttft-p95"]["metadata"]
    assert "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{" in ttft["query"]
    assert ttft["query"].endswith("> 0) or vector(0)")
    assert ttft["threshold"] == "2.5"


SELECTOR = '{namespace="serving",neuronfleet_io_service="llama"}'


def test_the_prefill_backlog_is_seconds_of_prefill_work_over_the_rate_each_replica_timed() -> None:
    found = scaling.triggers(NS, "llama", autoscaling(prefillBacklogSeconds=0.5), PROMETHEUS)
    backlog = {t["name"]: t for t in found}["prefill-backlog"]
    assert (backlog["metricType"], backlog["metadata"]["threshold"]) == ("AverageValue", "0.5")
    assert backlog["metadata"]["query"] == (
        f"(sum(neuronfleet:prefill_tokens_pending{SELECTOR}) / "
        f"scalar(avg(neuronfleet:prefill_tokens_per_second{SELECTOR})) > 0) or vector(0)"
    )


def test_the_warm_floor_is_the_contracts_formula_on_the_token_rates_and_the_measured_start() -> None:
    """A 50% rise, 1.5 s waited, the device-busy rate over 120 s, a start of 316 s predicted (the 70B from the Hub)
    until the replicas publish theirs: ``busy * 1.5 / (1 + 1.5 / (start + 30))``, an AverageValue of 1 a replica."""
    floor = {"stepPercent": 50, "ttftSeconds": 1.5, "windowSeconds": 120}
    found = scaling.triggers(NS, "llama", autoscaling(warmFloor=floor), PROMETHEUS, start_s=316.0)
    trigger = {t["name"]: t for t in found}["warm-floor"]
    assert (trigger["metricType"], trigger["metadata"]["threshold"]) == ("AverageValue", "1")
    busy = f"sum(rate(neuronfleet:device_busy_seconds_total{SELECTOR}[120s]))"
    start = f"scalar(max(sum without (phase) (neuronfleet:replica_start_seconds{SELECTOR})) or vector(316))"
    assert trigger["metadata"]["query"] == f"(({busy} * 1.5 / (1 + 1.5 / ({start} + 30))) > 0) or vector(0)"
    assert signal_lag_s(0.0) == 30


def test_the_warm_floors_defaults_absorb_a_doubling_waiting_two_seconds() -> None:
    floor = autoscaling(warmFloor={}).warm_floor
    assert floor is not None
    assert (floor.step_percent, floor.ttft_seconds, floor.window_seconds, floor.follow_trend) == (100, 2.0, 300, False)
    twin_floor = WarmFloor()
    assert (twin_floor.step * 100, twin_floor.ttft_s, twin_floor.window_s, twin_floor.follow_trend) == (
        100,
        2.0,
        300,
        False,
    )


def test_a_trend_following_floor_reads_the_windows_last_fifth_beside_it() -> None:
    found = scaling.triggers(
        NS, "llama", autoscaling(warmFloor={"stepPercent": 25, "ttftSeconds": 1, "followTrend": True}), PROMETHEUS,
        start_s=316,
    )  # fmt: skip
    query = {t["name"]: t for t in found}["warm-floor"]["metadata"]["query"]
    busy = "sum(rate(neuronfleet:device_busy_seconds_total{SELECTOR}[{window}s]))"
    whole, recent = busy.format(SELECTOR=SELECTOR, window=300), busy.format(SELECTOR=SELECTOR, window=60)
    start = f"scalar(max(sum without (phase) (neuronfleet:replica_start_seconds{SELECTOR})) or vector(316))"
    lag = f"({start} + 30)"
    load = f"(({recent} or {whole}) + clamp_min((({recent} or {whole}) - {whole}) / 120, 0) * ({lag} + 30))"
    assert query == f"(({load} * 1.25 / (1 + 1 / {lag})) > 0) or vector(0)"


def test_behaviour_adds_a_few_replicas_per_cold_start_and_removes_them_slowly() -> None:
    body = scaling.scaled_object(
        OWNER, NS, autoscaling(scaleUpReplicas=3, scaleUpPeriodSeconds=240), PROMETHEUS, paused=False
    )
    behavior = body["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["policies"] == [{"type": "Pods", "value": 3, "periodSeconds": 240}]
    assert behavior["scaleDown"] == {"stabilizationWindowSeconds": 300}


def test_scale_in_waits_at_least_a_replicas_start_so_it_never_removes_one_still_loading() -> None:
    """A 405B from the Hub starts in about 30 minutes: the load must stay low that long after a scale-out before
    a replica goes, else the ReplicaSet removes the new, not yet Ready pod first."""
    quick = autoscaling(scaleDownStabilizationSeconds=10)
    for start_s, window in ((0.0, 10), (7.2, 10), (316.4, 317)):
        body = scaling.scaled_object(OWNER, NS, quick, PROMETHEUS, paused=False, start_s=start_s)
        behavior = body["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleDown"] == {"stabilizationWindowSeconds": window}, start_s


def pod(name: str, cost: str | None = None) -> dict[str, Any]:
    annotations = {} if cost is None else {scaling.DELETION_COST_ANNOTATION: cost}
    return {"metadata": {"name": name, "annotations": annotations}}


def test_scale_in_costs_each_pod_the_requests_it_holds_and_rewrites_only_what_changed() -> None:
    pods = [pod("llama-a"), pod("llama-b", "3"), pod("llama-c", "2"), pod("llama-starting", "5")]
    # Prometheus has no figure of a pod still loading: it costs nothing, as it serves nothing.
    held = {"llama-a": 4.0, "llama-b": 3.0, "llama-c": 0.4}
    assert scaling.deletion_costs(pods, held) == {"llama-a": "4", "llama-c": "0", "llama-starting": "0"}
    assert scaling.in_flight_query(NS, "llama") == (
        'sum by (pod) (neuronfleet:requests_in_flight{namespace="serving",neuronfleet_io_service="llama"})'
    )


def test_desired_replicas_come_from_the_scaler_within_its_bounds() -> None:
    assert spec().desired_replicas == 1
    assert spec(replicas=0).desired_replicas == 0
    assert spec(autoscaling={"minReplicas": 2, "maxReplicas": 4}).desired_replicas == 2
    # What the HPA wrote through the scale subresource, clamped if someone scaled past the bounds by hand.
    assert spec(replicas=3, autoscaling={"minReplicas": 2, "maxReplicas": 4}).desired_replicas == 3
    assert spec(replicas=9, autoscaling={"minReplicas": 2, "maxReplicas": 4}).desired_replicas == 4
    assert spec(replicas=0, autoscaling={"minReplicas": 1, "maxReplicas": 4}).desired_replicas == 1


def test_bounds_are_checked_by_the_operator_too() -> None:
    with pytest.raises(ValidationError, match=r"autoscaling.minReplicas \(5\) must not exceed"):
        spec(autoscaling={"minReplicas": 5, "maxReplicas": 2})


def _status(
    s: api.NeuronInferenceServiceSpec, state: scaling.ScalingState | None, previous: api.NeuronInferenceServiceStatus
) -> api.NeuronInferenceServiceStatus:
    target = ArtifactView("model-a", "a", "Compiling")
    given = ServiceStatusInput("svc", 2, s, target, None, (), decide(target, None, None), state)
    return service_status(given, previous, T0)[0]


def _autoscaling_condition(status: api.NeuronInferenceServiceStatus) -> tuple[str, str, str] | None:
    found = [c for c in status.conditions if c.type == ConditionType.AUTOSCALING]
    return (found[0].status, found[0].reason, found[0].message) if found else None


def test_the_autoscaling_condition_says_what_scales_or_why_not() -> None:
    s = spec(autoscaling={"maxReplicas": 4, "kvCacheUsage": 0.9})
    empty = api.NeuronInferenceServiceStatus()
    scaling_now = _status(s, scaling.ScalingState(), empty)
    assert _autoscaling_condition(scaling_now) == (
        "True",
        Reason.SCALING,
        "KEDA scales between 1 and 4 replicas on vllm:num_requests_waiting (target 4/replica), "
        "vllm:kv_cache_usage_perc (target 0.9)",
    )
    assert scaling_now.desired_replicas == 1
    paused = _autoscaling_condition(_status(s, scaling.ScalingState(paused=True), empty))
    assert paused == (
        "False",
        Reason.SCALING_PAUSED,
        "paused until a revision is compiled and serving (between 1 and 4 replicas)",
    )
    missing = _autoscaling_condition(_status(s, scaling.ScalingState(problem="KEDA is not installed"), empty))
    assert missing == ("False", Reason.AUTOSCALING_UNAVAILABLE, "KEDA is not installed")
    # Autoscaling removed: the condition goes with it.
    assert _autoscaling_condition(_status(spec(), None, scaling_now)) is None


def test_the_autoscaling_condition_names_the_look_ahead_signals() -> None:
    found = autoscaling(prefillBacklogSeconds=0.5, warmFloor={"stepPercent": 50, "ttftSeconds": 1.5})
    assert scaling.signals(found) == (
        "vllm:num_requests_waiting (target 4/replica), prefill backlog (target 0.5 s/replica), "
        "warm floor (a 50% rise absorbed while replicas start, 1.5 s waited)"
    )
    trend = autoscaling(warmFloor={"stepPercent": 25, "ttftSeconds": 1, "followTrend": True})
    assert scaling.signals(trend).endswith(
        "warm floor (25% above the load projected along its rise while replicas start, 1 s waited)"
    )
