"""wait_for: returns the first observation that satisfies the condition, or fails saying what it saw."""

from __future__ import annotations

import itertools
import math

import pytest

from neuronfleet.devcluster.process.waiting import WaitTimeoutError, wait_for


def test_returns_the_first_satisfying_observation() -> None:
    counter = itertools.count()
    assert wait_for(lambda: next(counter), lambda n: n >= 3, timeout=5, interval=0.001) == 3


def test_errors_while_polling_count_as_not_yet() -> None:
    calls = itertools.count()

    def observe() -> str:
        if next(calls) < 2:
            raise KeyError("not there")
        return "found"

    assert wait_for(observe, timeout=5, interval=0.001) == "found"


def test_a_fatal_error_ends_the_wait_at_once() -> None:
    calls = itertools.count()

    def observe() -> bool:
        next(calls)
        raise ProcessLookupError("gone")

    with pytest.raises(ProcessLookupError, match="gone"):
        wait_for(observe, timeout=300, interval=0.001, fatal=(ProcessLookupError,))
    assert next(calls) == 1


def test_timeout_names_the_wait_and_the_last_observation() -> None:
    with pytest.raises(WaitTimeoutError) as error:
        wait_for(lambda: {"phase": "Pending"}, lambda pod: pod["phase"] == "Running", timeout=0.05, what="the pod")
    assert str(error.value) == "timed out after 0.05 s waiting for the pod; last seen: {'phase': 'Pending'}"


def test_timeout_reports_the_last_error() -> None:
    def observe() -> None:
        raise LookupError("no such pod")

    with pytest.raises(WaitTimeoutError, match=r"last seen: LookupError: LookupError\('no such pod'\)"):
        wait_for(observe, timeout=0.05)


def test_a_caller_may_name_a_bound_of_many_minutes() -> None:
    # No cap: a long start (vLLM on a small machine, a pass over a thousand services) names its own bound.
    assert wait_for(lambda: "up", timeout=3600) == "up"


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan])
def test_unbounded_or_empty_timeouts_are_refused(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        wait_for(lambda: True, timeout=timeout)
