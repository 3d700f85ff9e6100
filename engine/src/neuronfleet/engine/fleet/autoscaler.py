"""KEDA and the HPA, as they scale a service on its engines' waiting queue (``spec.autoscaling``).

The operator's ScaledObject asks for ``sum(vllm:num_requests_waiting)`` as an ``AverageValue`` metric with
the target ``waitingRequestsPerReplica``; the HPA, every ``sync_s`` (the controller manager's 15 s), reads it
through KEDA from Prometheus (the engines' gauges as of its last scrape) and wants ``ceil(total / target)``
replicas, unless the ratio is within the HPA's 10% tolerance of what runs. Scale-up adds at most
``scaleUpReplicas`` per ``scaleUpPeriodSeconds`` (no stabilization); scale-down takes the highest wish of the
last ``scaleDownStabilizationSeconds``. Replicas stay within ``minReplicas`` and ``maxReplicas``.

The fields and their defaults are the CRD's ``spec.autoscaling`` (a test holds them to the operator's).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

#: The HPA controller's sync period and tolerance (kube-controller-manager's defaults).
HPA_SYNC_S = 15.0
HPA_TOLERANCE = 0.1


@dataclass(frozen=True)
class AutoscalingPolicy:
    """A service's ``spec.autoscaling``, and how often Prometheus scrapes the engines."""

    min_replicas: int = 1
    max_replicas: int = 8
    waiting_requests_per_replica: int = 4
    scale_up_replicas: int = 2
    scale_up_period_seconds: int = 120
    scale_down_stabilization_seconds: int = 300
    scrape_interval_s: float = 15.0
    sync_s: float = HPA_SYNC_S


@dataclass
class Autoscaler:
    """The HPA's decisions over time: call :meth:`decide` every ``policy.sync_s``."""

    policy: AutoscalingPolicy
    #: (when, replicas wanted) of recent decisions: scale-down's stabilization window.
    _wishes: deque[tuple[float, int]] = field(default_factory=deque)
    #: (when, replicas added) within the scale-up period.
    _added: deque[tuple[float, int]] = field(default_factory=deque)

    def decide(self, now: float, current: int, waiting_total: float) -> int:
        """The replicas the HPA sets at ``now``, ``current`` running or starting and ``waiting_total`` requests
        waiting over the fleet (as Prometheus last scraped them)."""
        policy = self.policy
        target = policy.waiting_requests_per_replica
        wanted = math.ceil(waiting_total / target)
        if current and abs(waiting_total / (target * current) - 1) <= HPA_TOLERANCE:
            wanted = current
        wanted = min(max(wanted, policy.min_replicas), policy.max_replicas)
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
