"""The leader election's own rules: timings that can elect safely, identities, a released Lease."""

from __future__ import annotations

import datetime
import socket

import pytest
from kubernetes.client import V1LeaseSpec

from neuronfleet.operator.cluster.leadership import Election, candidate_identity, holder_pod, released


def test_client_gos_defaults_elect_safely() -> None:
    assert Election("ops").problem() is None


@pytest.mark.parametrize(
    ("lease", "deadline", "retry", "complaint"),
    [
        (10, 10, 2, "must exceed the renew deadline"),
        (15, 2, 2, "must exceed 1.2 retry periods (2.4 s)"),
        (15, 10, 0, "at least 1 s"),
    ],
)
def test_timings_that_could_leave_two_leaders_are_refused(
    lease: int, deadline: int, retry: int, complaint: str
) -> None:
    problem = Election("ops", lease_duration_s=lease, renew_deadline_s=deadline, retry_period_s=retry).problem()
    assert problem is not None
    assert complaint in problem


def test_each_process_is_its_own_candidate_named_after_its_pod() -> None:
    first, second = candidate_identity(), candidate_identity()
    assert first != second  # a restarted container waits out its predecessor's Lease like any candidate
    assert holder_pod(first) == holder_pod(second) == socket.gethostname()
    assert holder_pod("llama-operator-7f9c-x2k4q_0a1b2c3d") == "llama-operator-7f9c-x2k4q"


def test_a_released_lease_has_no_holder_and_expires_at_once() -> None:
    now = datetime.datetime(2026, 12, 4, tzinfo=datetime.UTC)
    held = V1LeaseSpec(holder_identity="op-a_1234", lease_duration_seconds=15, lease_transitions=3)
    spec = released(held, now)
    assert spec.holder_identity is None
    assert (spec.lease_duration_seconds, spec.renew_time, spec.lease_transitions) == (1, now, 3)
