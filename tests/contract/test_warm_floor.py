"""The warm floor: the replicas that absorb a rise in load while new ones start."""

from __future__ import annotations

import pytest

from neuronfleet.contract.scaling import HPA_SYNC_S, SCRAPE_S, signal_lag_s, trend_floor, trend_window_s, warm_floor


def last_wait(floor: float, load: float, lag_s: float, dt: float = 0.01) -> float:
    """How long the last request of the lag waits, ``floor`` replicas serving ``load`` replicas' work a second:
    work queued ahead of it over what the floor serves (a fluid queue, stepped)."""
    backlog = 0.0
    for _ in range(round(lag_s / dt)):
        backlog = max(backlog + (load - floor) * dt, 0.0)
    return backlog / floor


@pytest.mark.parametrize(("busy", "step", "ttft_s", "lag_s"), [(3.2, 1.0, 2.0, 330.0), (10.0, 0.5, 1.0, 60.0)])
def test_at_the_floor_the_last_request_of_the_lag_waits_exactly_its_ttft(
    busy: float, step: float, ttft_s: float, lag_s: float
) -> None:
    floor = warm_floor(busy, step=step, ttft_s=ttft_s, lag_s=lag_s)
    assert last_wait(floor, busy * (1 + step), lag_s) == pytest.approx(ttft_s, rel=1e-3)
    assert last_wait(0.95 * floor, busy * (1 + step), lag_s) > 1.5 * ttft_s, "a smaller floor keeps it waiting"


def test_a_short_start_needs_about_the_load_a_long_one_the_risen_load() -> None:
    assert warm_floor(4.0, step=1.0, ttft_s=2.0, lag_s=2.0) == pytest.approx(4.0)
    assert warm_floor(4.0, step=1.0, ttft_s=2.0, lag_s=3000.0) == pytest.approx(8.0, rel=1e-3)
    assert warm_floor(4.0, step=1.0, ttft_s=2.0, lag_s=0.0) == 4.0


def test_the_lag_is_a_scrape_the_hpas_sync_and_the_start() -> None:
    assert signal_lag_s(300.0) == 300.0 + SCRAPE_S + HPA_SYNC_S


def test_the_trend_floor_projects_a_linear_rise_a_lag_ahead_and_never_a_fall() -> None:
    """A load rising 0.01 busy replicas a second, now at 4: its mean over the last 300 s is 2.5, over the last
    60 s (the window's last fifth) 3.7; a lag of 150 s ahead it will be 5.5, and the floor keeps the headroom above
    that."""
    now, slope, window_s, lag_s = 4.0, 0.01, 300.0, 150.0
    assert trend_window_s(window_s) == 60.0
    recent, window = now - slope * 60.0 / 2, now - slope * window_s / 2
    floor = trend_floor(recent, window, window_s=window_s, step=0.25, ttft_s=1.0, lag_s=lag_s)
    assert floor == pytest.approx(warm_floor(now + slope * lag_s, step=0.25, ttft_s=1.0, lag_s=lag_s))
    # A flat load is the fixed step's floor; a falling one is not projected down.
    flat = trend_floor(4.0, 4.0, window_s=window_s, step=0.25, ttft_s=1.0, lag_s=lag_s)
    assert flat == warm_floor(4.0, step=0.25, ttft_s=1.0, lag_s=lag_s)
    falling = trend_floor(3.0, 4.0, window_s=window_s, step=0.25, ttft_s=1.0, lag_s=lag_s)
    assert falling == warm_floor(3.0, step=0.25, ttft_s=1.0, lag_s=lag_s)
