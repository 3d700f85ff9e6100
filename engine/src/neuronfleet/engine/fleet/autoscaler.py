"""KEDA and the HPA, as they scale a service on its engines' signals (``spec.autoscaling``).

The operator's ScaledObject has one trigger per signal, each an ``AverageValue`` metric the HPA divides by its
target to want ``ceil(value / target)`` replicas, unless the ratio is within the HPA's 10% tolerance of what
runs; the HPA follows the trigger that wants most:

- **waiting requests**: ``sum(vllm:num_requests_waiting)`` over ``waitingRequestsPerReplica`` (always on);
- **prefill backlog** (``prefillBacklogSeconds``): the prompt tokens still to prefill over each replica's
  prefill rate, in seconds of prefill work, over the seconds one replica may hold;
- **warm floor** (``warmFloor``): ``contract/scaling.py``'s floor from the replicas' device-busy seconds a
  second over ``windowSeconds`` and their start time, over 1.

The HPA reads them every ``sync_s`` (the controller manager's 15 s) through KEDA from Prometheus (the engines'
gauges as of its last scrape). Scale-up adds at most ``scaleUpReplicas`` per ``scaleUpPeriodSeconds`` (no
stabilization); scale-down takes the highest wish of the last ``scaleDownStabilizationSeconds``. Replicas stay
within ``minReplicas`` and ``maxReplicas``. The fields and their defaults are the CRD's (a test holds them to the
operator's).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass, field

from neuronfleet.contract.scaling import HPA_SYNC_S, scale_down_window_s, trend_floor, warm_floor

#: The HPA controller's tolerance (kube-controller-manager's default).
HPA_TOLERANCE = 0.1


@dataclass(frozen=True)
class WarmFloor:
    """``spec.autoscaling.warmFloor``: the rise in load the serving replicas absorb while new ones start."""

    #: The rise absorbed, as a share of the load (1.0: the load doubles).
    step: float = 1.0
    #: The longest a request may wait for the replicas that rise brings.
    ttft_s: float = 2.0
    #: The window of the device-busy rate the load is read from.
    window_s: float = 300.0
    #: Follow the load's rise: the busy rate over the window's last fifth against the whole window's gives the
    #: rise a second, projected a lag ahead (``contract.scaling.trend_floor``); ``step`` is then the headroom
    #: kept above the projection.
    follow_trend: bool = False


@dataclass(frozen=True)
class AutoscalingPolicy:
    """A service's ``spec.autoscaling``, and how often Prometheus scrapes the engines."""

    min_replicas: int = 1
    max_replicas: int = 8
    waiting_requests_per_replica: int = 4
    #: Seconds of prefill work one replica may have queued (None: not a trigger).
    prefill_backlog_seconds: float | None = None
    warm_floor: WarmFloor | None = None
    scale_up_replicas: int = 2
    scale_up_period_seconds: int = 120
    scale_down_stabilization_seconds: int = 300
    scrape_interval_s: float = 15.0
    sync_s: float = HPA_SYNC_S


@dataclass(frozen=True)
class Signals:
    """What the ScaledObject's queries read at a sync, summed over the serving replicas as last scraped."""

    #: ``sum(vllm:num_requests_waiting)``.
    waiting: float
    #: Prompt tokens still to prefill, in seconds of one replica's prefill.
    prefill_backlog_s: float = 0.0
    #: Replicas' worth of busy device: the device-busy seconds' rate over the warm floor's window.
    busy: float = 0.0
    #: The same over the trend's recent window (``contract.scaling.trend_window_s``).
    busy_recent: float = 0.0
    #: Seconds from a rise in load to a new replica serving (``contract.scaling.signal_lag_s``).
    lag_s: float = 0.0


@dataclass
class Autoscaler:
    """The HPA's decisions over time: call :meth:`decide` every ``policy.sync_s``."""

    policy: AutoscalingPolicy
    #: (when, replicas wanted) of recent decisions: scale-down's stabilization window.
    _wishes: deque[tuple[float, int]] = field(default_factory=deque)
    #: (when, replicas added) within the scale-up period.
    _added: deque[tuple[float, int]] = field(default_factory=deque)

    @classmethod
    def rendered(cls, policy: AutoscalingPolicy, start_s: float) -> Autoscaler:
        """The HPA the operator renders for ``policy`` with replicas that take ``start_s`` to start: its
        scale-down window never under a start (``contract.scaling.scale_down_window_s``)."""
        window = scale_down_window_s(policy.scale_down_stabilization_seconds, start_s)
        return cls(dataclasses.replace(policy, scale_down_stabilization_seconds=window))

    def wanted(self, current: int, signals: Signals) -> int:
        """The replicas the triggers ask for, the most of them, before the HPA's bounds and behavior."""
        policy = self.policy
        metrics = [(signals.waiting, float(policy.waiting_requests_per_replica))]
        if policy.prefill_backlog_seconds is not None:
            metrics.append((signals.prefill_backlog_s, policy.prefill_backlog_seconds))
        if (floor := policy.warm_floor) is not None:
            metrics.append((_floor(floor, signals), 1.0))
        return max(_average_value_wish(current, value, target) for value, target in metrics)

    def decide(self, now: float, current: int, signals: Signals) -> int:
        """The replicas the HPA sets at ``now``, ``current`` running or starting, its triggers reading ``signals``."""
        policy = self.policy
        wanted = min(max(self.wanted(current, signals), policy.min_replicas), policy.max_replicas)
        self._wishes.append((now, wanted))
        while self._wishes and self._wishes[0][0] < now - policy.scale_down_stabilization_seconds:
            self._wishes.popleft()
        if wanted < current:
            # Scale-down: the highest wish within the window.
            return min(current, max(wish for _, wish in self._wishes))
        while self._added and self._added[0][0] <= now - policy.scale_up_period_seconds:
            self._added.popleft()
        room = policy.scale_up_replicas - sum(count for _, count in self._added)
        decided = current + max(min(wanted - current, room), 0)
        if decided > current:
            self._added.append((now, decided - current))
        return decided


def _average_value_wish(current: int, total: float, target: float) -> int:
    """An ``AverageValue`` metric's replicas: ``ceil(total / target)``, or ``current`` within the tolerance."""
    if current and abs(total / (target * current) - 1) <= HPA_TOLERANCE:
        return current
    return math.ceil(total / target)


def _floor(floor: WarmFloor, signals: Signals) -> float:
    if not floor.follow_trend:
        return warm_floor(signals.busy, step=floor.step, ttft_s=floor.ttft_s, lag_s=signals.lag_s)
    return trend_floor(
        signals.busy_recent, signals.busy, window_s=floor.window_s, step=floor.step, ttft_s=floor.ttft_s,
        lag_s=signals.lag_s,
    )  # fmt: skip
