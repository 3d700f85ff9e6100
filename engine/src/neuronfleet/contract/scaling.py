"""Scaling that looks ahead: the warm floor, the replicas that must already serve so that a rise in traffic is
absorbed while new ones start.

A replica added on a signal serves only after the signal's lag: Prometheus's scrape, the HPA's sync (it asks
KEDA's metrics adapter, which queries Prometheus then), and the replica's own start (minutes on Neuron:
``contract/start_time.py``). Until then the replicas already serving take every request. A fleet whose devices
are ``busy`` replicas' worth of busy, when the load rises by ``step`` (1.0: it doubles), queues
``(busy * (1 + step) - floor) * lag`` device-seconds of work on the ``floor`` replicas; the last request of the
lag waits that backlog over ``floor``. Kept within ``ttft_s``:

    floor >= busy * (1 + step) / (1 + ttft_s / lag)

With a short start the floor is the load itself (new replicas come before anyone waits long); with a start much
longer than ``ttft_s`` it is the risen load. The operator renders this into the ScaledObject's query
(``operator/policy/scaling.py``) and the fleet twin computes it (``engine/fleet/autoscaler.py``); ``busy`` is
the rate of the replicas' device-busy seconds (``neuronfleet:device_busy_seconds``): the load as the devices
felt it, padding, small decode batches and all. A fleet at full stretch reads as its size, so the floor then
asks for more than runs.

Standard library only: the operator imports it.
"""

from __future__ import annotations

import math

#: The HPA controller's sync period (kube-controller-manager's default): a decision waits up to this for it.
HPA_SYNC_S = 15.0
#: The scrape interval the operator assumes of Prometheus (the one kube-prometheus-stack's monitors use).
SCRAPE_S = 15.0
#: The share of a trend-following floor's window its recent rate is read over.
TREND_SHARE = 0.2


def warm_floor(busy: float, *, step: float, ttft_s: float, lag_s: float) -> float:
    """Replicas that absorb a rise of ``step`` in a load keeping ``busy`` replicas busy, for the ``lag_s`` until
    new replicas serve, with no request waiting more than ``ttft_s`` (see the module's docstring)."""
    if lag_s <= 0:
        return busy
    return busy * (1 + step) / (1 + ttft_s / lag_s)


def signal_lag_s(start_s: float, scrape_s: float = SCRAPE_S) -> float:
    """Seconds from a rise in load to a new replica serving, at worst: a scrape, the HPA's sync, the start."""
    return start_s + scrape_s + HPA_SYNC_S


def scale_down_window_s(configured_s: int, start_s: float) -> int:
    """The HPA's scale-down stabilization: ``configured_s``, and never under a replica's start ``start_s``. The
    ReplicaSet removes a pod that is not Ready first, so a scale-in sooner after a scale-out would take a replica
    still loading; with the load held low this long, the last ones added serve by then."""
    return max(configured_s, math.ceil(start_s))


def trend_window_s(window_s: float) -> int:
    """The recent window a trend-following floor reads beside its whole window: the last fifth of it, in whole
    seconds (a PromQL range)."""
    return max(1, round(window_s * TREND_SHARE))


def trend_floor(
    busy_recent: float, busy_window: float, *, window_s: float, step: float, ttft_s: float, lag_s: float
) -> float:
    """The warm floor of the load projected a lag ahead along its recent rise: ``busy_recent`` over the last
    :func:`trend_window_s`, ``busy_window`` over the last ``window_s``; their difference over the time between
    their middles is the rise a second. A falling load is not projected (scale-in has its own window). ``step`` is
    then the headroom kept above the projection."""
    recent_s = trend_window_s(window_s)
    slope = (busy_recent - busy_window) / ((window_s - recent_s) / 2)
    projected = busy_recent + max(slope, 0.0) * (lag_s + recent_s / 2)
    return warm_floor(projected, step=step, ttft_s=ttft_s, lag_s=lag_s)
