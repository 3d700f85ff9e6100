"""The retry contract: what is retried, after how long, and that retries stop once a reconcile succeeds."""

from __future__ import annotations

import asyncio

import pytest

from neuronfleet.operator.cluster.kube import NO_RESPONSE, TIMEOUT, ApiError
from neuronfleet.operator.reconcilers import RetryLater
from neuronfleet.operator.runtime.retries import API_ERROR_SECONDS, RETRY_LATER_SECONDS, Retries, retry_delay

QUICK = 0.01


class Flaky:
    """A reconcile that fails with ``errors`` in turn, then succeeds."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)


async def settle(retries: Retries) -> None:
    """Until no retry is pending (bounded: a retry that never stops fails the test)."""
    async with asyncio.timeout(5):
        while len(retries):
            await asyncio.sleep(QUICK)


def test_the_delays() -> None:
    assert retry_delay(RetryLater("being deleted")) == RETRY_LATER_SECONDS == 2
    assert retry_delay(ApiError(NO_RESPONSE, TIMEOUT, "GET /x: no answer within 30 s")) == API_ERROR_SECONDS == 10


def test_a_retryable_failure_runs_again_until_it_succeeds() -> None:
    async def scenario() -> Flaky:
        retries = Retries(delay=lambda _: QUICK)
        flaky = Flaky(RetryLater("mid-change"), ApiError(503, "ServiceUnavailable", "etcd"), RetryLater("again"))
        await retries.run("key", flaky)
        assert len(retries) == 1
        await settle(retries)
        return flaky

    assert asyncio.run(scenario()).calls == 4


def test_one_retry_per_key_and_a_success_cancels_it() -> None:
    async def scenario() -> tuple[Flaky, Flaky]:
        retries = Retries(delay=lambda _: 60)
        first = Flaky(RetryLater("mid-change"))
        await retries.run("key", first)
        await retries.run("key", Flaky(RetryLater("still")))
        assert len(retries) == 1
        # Another trigger for the same object succeeds: the pending retry has nothing left to do.
        later = Flaky()
        await retries.run("key", later)
        assert len(retries) == 0
        return first, later

    first, later = asyncio.run(scenario())
    assert (first.calls, later.calls) == (1, 1)


def test_other_errors_are_not_retried() -> None:
    async def scenario() -> Retries:
        retries = Retries(delay=lambda _: QUICK)
        with pytest.raises(KeyError):
            await retries.run("key", Flaky(KeyError("a bug")))
        return retries

    assert len(asyncio.run(scenario())) == 0


def test_cancel_drops_pending_retries() -> None:
    async def scenario() -> Flaky:
        retries = Retries(delay=lambda _: QUICK)
        flaky = Flaky(RetryLater("mid-change"))
        await retries.run("key", flaky)
        retries.cancel()
        await asyncio.sleep(10 * QUICK)
        assert len(retries) == 0
        return flaky

    assert asyncio.run(scenario()).calls == 1
