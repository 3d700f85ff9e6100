"""Pure planning of a service's autoscaling: the KEDA ScaledObject, and what the status says of it.

KEDA drives an HPA that writes the NeuronInferenceService's own scale subresource
(``spec.replicas``), never the Deployment: the operator stays in charge of which
revision runs, so a scale-up while a new artifact compiles adds replicas of the
serving revision, and no replica of an uncompiled revision ever starts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuronfleet.contract import metrics
from neuronfleet.contract.names import SERVICE_METRIC_LABEL
from neuronfleet.contract.scaling import scale_down_window_s, signal_lag_s, trend_window_s
from neuronfleet.operator import api, plan

Obj = dict[str, Any]

KEDA_API_VERSION = "keda.sh/v1alpha1"
#: KEDA leaves a ScaledObject with this annotation where it is.
PAUSED_ANNOTATION = "autoscaling.keda.sh/paused"

#: vLLM's own metric names: the peers' routers and autoscalers read exactly these.
WAITING_REQUESTS = metrics.WAITING
KV_CACHE_USAGE = metrics.KV_CACHE_USAGE
TIME_TO_FIRST_TOKEN = metrics.TIME_TO_FIRST_TOKEN
#: The window TTFT p95 is computed over: several scrapes at any sensible interval.
TTFT_WINDOW = "2m"
#: The ReplicaSet controller removes, of its Ready pods, those of lowest cost first (beta since Kubernetes 1.22,
#: on by default): a pod's requests in flight, so scale-in takes the replicas that hold least.
DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"


def series(metric: str, namespace: str, name: str) -> str:
    """A selector for ``metric`` of one service's serving pods."""
    return f'{metric}{{namespace="{namespace}",{SERVICE_METRIC_LABEL}="{name}"}}'


def _number(value: float) -> str:
    # KEDA reads thresholds as strings; "4" rather than "4.0" reads like what the user wrote.
    return f"{value:g}"


def triggers(
    namespace: str, name: str, autoscaling: api.Autoscaling, prometheus: str, *, start_s: float = 0.0
) -> list[Obj]:
    """KEDA prometheus triggers on the engine's signals; the HPA follows whichever asks for most replicas.
    ``start_s``: a replica's predicted start, the warm floor's until the replicas publish their own."""

    def trigger(trigger_name: str, metric_type: str, query: str, threshold: float, **extra: str) -> Obj:
        metadata = {"serverAddress": prometheus, "query": query, "threshold": _number(threshold), **extra}
        return {"type": "prometheus", "name": trigger_name, "metricType": metric_type, "metadata": metadata}

    def of(metric: str) -> str:
        return series(metric, namespace, name)

    # AverageValue: the HPA divides the fleet's total by the target, so queued requests ask for replicas.
    waiting = f"sum({of(WAITING_REQUESTS)}) or vector(0)"
    found = [
        trigger(
            "waiting-requests",
            "AverageValue",
            waiting,
            autoscaling.waiting_requests_per_replica,
            activationThreshold=_number(autoscaling.activation_waiting_requests),
        )
    ]
    if autoscaling.prefill_backlog_seconds is not None:
        backlog = f"sum({of(metrics.PREFILL_TOKENS_PENDING)}) / scalar(avg({of(metrics.PREFILL_TOKENS_PER_SECOND)}))"
        # Before any replica publishes its rate the quotient is NaN: read as 0.
        found.append(
            trigger(
                "prefill-backlog", "AverageValue", f"({backlog} > 0) or vector(0)", autoscaling.prefill_backlog_seconds
            )
        )
    if autoscaling.warm_floor is not None:
        found.append(
            trigger("warm-floor", "AverageValue", warm_floor_query(namespace, name, autoscaling.warm_floor, start_s), 1)
        )
    if autoscaling.kv_cache_usage is not None:
        # Value: replicas grow with the ratio of the fleet's mean usage to the target.
        usage = f"avg({of(KV_CACHE_USAGE)}) or vector(0)"
        found.append(trigger("kv-cache-usage", "Value", usage, autoscaling.kv_cache_usage))
    if autoscaling.ttft_p95_seconds is not None:
        buckets = of(f"{TIME_TO_FIRST_TOKEN}_bucket")
        p95 = f"histogram_quantile(0.95, sum by (le) (rate({buckets}[{TTFT_WINDOW}])))"
        # Without traffic the quantile is NaN: read as 0, which never asks for replicas.
        found.append(trigger("ttft-p95", "Value", f"({p95} > 0) or vector(0)", autoscaling.ttft_p95_seconds))
    return found


def warm_floor_query(namespace: str, name: str, floor: api.WarmFloor, start_s: float) -> str:
    """``contract.scaling.warm_floor`` in PromQL, in replicas: the replicas' device-busy seconds a second over the
    window (following the trend: projected a lag ahead, ``contract.scaling.trend_floor``), risen by the step, over
    ``1 + ttft / lag``; the lag from the slowest serving replica's published start (``start_s`` before any did), a
    scrape and the HPA's sync."""

    def of(metric: str) -> str:
        return series(metric, namespace, name)

    def busy(window_s: float) -> str:
        return f"sum(rate({of(f'{metrics.DEVICE_BUSY_SECONDS}_total')}[{_number(window_s)}s]))"

    start = f"scalar(max(sum without (phase) ({of(metrics.REPLICA_START_SECONDS)})) or vector({_number(start_s)}))"
    lag = f"({start} + {_number(signal_lag_s(0.0))})"
    load = busy(floor.window_seconds)
    if floor.follow_trend:
        # contract.scaling.trend_floor: the recent rate, plus its rise a second (never below 0) a lag ahead. A
        # recent window too short for two scrapes reads the whole window's rate: no rise.
        recent_s = trend_window_s(floor.window_seconds)
        recent = f"({busy(recent_s)} or {load})"
        slope = f"clamp_min(({recent} - {load}) / {_number((floor.window_seconds - recent_s) / 2)}, 0)"
        load = f"({recent} + {slope} * ({lag} + {_number(recent_s / 2)}))"
    rise = _number(1 + floor.step_percent / 100)
    # Nothing before the replicas' first steps: read as 0, which asks for nothing.
    return f"(({load} * {rise} / (1 + {_number(floor.ttft_seconds)} / {lag})) > 0) or vector(0)"


def _behavior(autoscaling: api.Autoscaling, start_s: float) -> Obj:
    """Add replicas a few per cold start; remove them only after the load stayed low, and the last ones added
    had the time to start."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {
                    "type": "Pods",
                    "value": autoscaling.scale_up_replicas,
                    "periodSeconds": autoscaling.scale_up_period_seconds,
                }
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": scale_down_window_s(autoscaling.scale_down_stabilization_seconds, start_s)
        },
    }


def scaled_object(
    owner: plan.Owner,
    namespace: str,
    autoscaling: api.Autoscaling,
    prometheus: str,
    *,
    paused: bool,
    start_s: float = 0.0,
) -> Obj:
    """The ScaledObject scaling the service itself between its bounds; paused while nothing can serve. ``start_s``:
    a replica's predicted start (:func:`triggers`)."""
    metadata = owner.child_metadata(owner.name, namespace, {**plan.service_labels(owner.name), **plan.MANAGED_BY})
    if paused:
        metadata["annotations"] = {PAUSED_ANNOTATION: "true"}
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": owner.api_version, "kind": owner.kind, "name": owner.name},
            "minReplicaCount": autoscaling.min_replicas,
            "maxReplicaCount": autoscaling.max_replicas,
            "pollingInterval": autoscaling.polling_interval_seconds,
            "cooldownPeriod": autoscaling.cooldown_period_seconds,
            "initialCooldownPeriod": autoscaling.initial_cooldown_period_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(autoscaling, start_s)}},
            "triggers": triggers(namespace, owner.name, autoscaling, prometheus, start_s=start_s),
        },
    }


def in_flight_query(namespace: str, name: str) -> str:
    """The completions each of a service's serving pods holds, by pod (the engine's drain gate counts them): what
    removing that pod would have to finish first."""
    return f"sum by (pod) ({series(metrics.REQUESTS_IN_FLIGHT, namespace, name)})"


def deletion_costs(pods: Sequence[Obj], in_flight: Mapping[str, float]) -> dict[str, str]:
    """The deletion cost to write on each pod whose annotation differs: the requests it holds (0 for a pod
    Prometheus has no figure of, one still loading). A scale-in then removes the Ready pods holding fewest."""
    costs = {}
    for pod in pods:
        meta = pod["metadata"]
        cost = str(round(in_flight.get(meta["name"], 0.0)))
        if (meta.get("annotations") or {}).get(DELETION_COST_ANNOTATION) != cost:
            costs[meta["name"]] = cost
    return costs


@dataclass(frozen=True)
class ScalingState:
    """What became of a service's autoscaling this pass (the reconciler's I/O, summed up)."""

    #: Why it does not scale, when it cannot: no Prometheus address, KEDA missing, not allowed.
    problem: str | None = None
    #: Whether the ScaledObject is paused (no revision serves yet).
    paused: bool = False


def signals(autoscaling: api.Autoscaling) -> str:
    """The signals scaled on, for humans."""
    names = [f"{WAITING_REQUESTS} (target {autoscaling.waiting_requests_per_replica}/replica)"]
    if autoscaling.prefill_backlog_seconds is not None:
        names.append(f"prefill backlog (target {_number(autoscaling.prefill_backlog_seconds)} s/replica)")
    if (floor := autoscaling.warm_floor) is not None:
        kept = (
            f"{floor.step_percent}% above the load projected along its rise"
            if floor.follow_trend
            else f"a {floor.step_percent}% rise absorbed"
        )
        names.append(f"warm floor ({kept} while replicas start, {_number(floor.ttft_seconds)} s waited)")
    if autoscaling.kv_cache_usage is not None:
        names.append(f"{KV_CACHE_USAGE} (target {_number(autoscaling.kv_cache_usage)})")
    if autoscaling.ttft_p95_seconds is not None:
        names.append(f"TTFT p95 (target {_number(autoscaling.ttft_p95_seconds)} s)")
    return ", ".join(names)
