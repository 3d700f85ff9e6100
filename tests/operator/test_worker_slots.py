"""The reconciles' worker slots: a spec change first, a second reconcile of an object joining its waiting one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from neuronfleet.operator.runtime.drive import FOLLOW_UP, SPEC_CHANGE, WorkerSlots


class Recorder:
    """Calls that record their name when they run; ``gate`` holds the first slot until it is set."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.gate = asyncio.Event()

    def call(self, name: str, fails: Exception | None = None) -> Callable[[], Awaitable[str]]:
        async def run() -> str:
            self.ran.append(name)
            if name == "holder":
                await self.gate.wait()
            if fails is not None:
                raise fails
            return name

        return run


async def queued(slots: WorkerSlots, count: int) -> None:
    """Let the tasks just created reach their place in the queue."""
    while len(slots) < count:
        await asyncio.sleep(0)


def test_a_spec_change_waiting_for_a_worker_goes_before_earlier_follow_ups() -> None:
    async def scenario() -> list[str]:
        slots, calls = WorkerSlots(1), Recorder()
        holder = asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("holder")))
        await asyncio.sleep(0)
        waiting = [
            asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("deployment-event-1"))),
            asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("deployment-event-2"))),
        ]
        await queued(slots, 2)
        waiting.append(asyncio.create_task(slots.call(None, SPEC_CHANGE, calls.call("spec-change"))))
        await queued(slots, 3)
        calls.gate.set()
        assert await asyncio.gather(holder, *waiting) == [
            "holder",
            "deployment-event-1",
            "deployment-event-2",
            "spec-change",
        ]
        return calls.ran

    assert asyncio.run(scenario()) == ["holder", "spec-change", "deployment-event-1", "deployment-event-2"]


def test_a_reconcile_asked_for_while_its_object_still_waits_joins_it_and_raises_its_priority() -> None:
    async def scenario() -> list[str]:
        slots, calls = WorkerSlots(1), Recorder()
        holder = asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("holder")))
        await asyncio.sleep(0)
        other = asyncio.create_task(slots.run("other", FOLLOW_UP, calls.call("other")))
        first = asyncio.create_task(slots.run("llama", FOLLOW_UP, calls.call("llama, a Deployment event")))
        await queued(slots, 2)
        joined = asyncio.create_task(slots.run("llama", SPEC_CHANGE, calls.call("llama, its spec change")))
        await asyncio.sleep(0)
        calls.gate.set()
        await asyncio.gather(holder, other, first, joined)
        return calls.ran

    # One run for both of llama's asks, ahead of the other service since one of them was a spec change.
    assert asyncio.run(scenario()) == ["holder", "llama, a Deployment event", "other"]


def test_a_reconcile_that_joined_a_failed_one_fails_with_it() -> None:
    async def scenario() -> None:
        slots, calls = WorkerSlots(1), Recorder()
        holder = asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("holder")))
        await asyncio.sleep(0)
        refused = RuntimeError("the API server refused")
        first = asyncio.create_task(slots.run("llama", FOLLOW_UP, calls.call("llama", fails=refused)))
        await queued(slots, 1)
        joined = asyncio.create_task(slots.run("llama", FOLLOW_UP, calls.call("never runs")))
        await asyncio.sleep(0)
        calls.gate.set()
        await holder
        for task in (first, joined):
            with pytest.raises(RuntimeError, match="refused"):
                await task
        assert calls.ran == ["holder", "llama"]

    asyncio.run(scenario())


def test_a_cancelled_waiter_gives_its_turn_on_and_one_that_joined_it_runs_its_own() -> None:
    async def scenario() -> list[str]:
        slots, calls = WorkerSlots(1), Recorder()
        holder = asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("holder")))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(slots.run("llama", FOLLOW_UP, calls.call("cancelled")))
        await queued(slots, 1)
        joined = asyncio.create_task(slots.run("llama", FOLLOW_UP, calls.call("llama, joined")))
        after = asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("after")))
        await queued(slots, 2)
        cancelled.cancel()
        await asyncio.sleep(0)
        calls.gate.set()
        await asyncio.gather(holder, joined, after)
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        # Every slot came back: one more call runs at once.
        await asyncio.wait_for(slots.call(None, FOLLOW_UP, calls.call("last")), timeout=1)
        return calls.ran

    assert asyncio.run(scenario()) == ["holder", "after", "llama, joined", "last"]


def test_each_ask_is_told_how_long_it_waited_for_a_worker_a_joined_one_until_the_run_it_joined() -> None:
    async def scenario() -> list[tuple[int, float]]:
        told: list[tuple[int, float]] = []
        slots, calls = WorkerSlots(1, lambda priority, seconds: told.append((priority, seconds))), Recorder()
        holder = asyncio.create_task(slots.call(None, FOLLOW_UP, calls.call("holder")))
        await asyncio.sleep(0)
        first = asyncio.create_task(slots.run("llama", FOLLOW_UP, calls.call("llama")))
        await queued(slots, 1)
        joined = asyncio.create_task(slots.run("llama", SPEC_CHANGE, calls.call("never runs")))
        await asyncio.sleep(0.05)
        calls.gate.set()
        await asyncio.gather(holder, first, joined)
        return told

    holder, first, joined = asyncio.run(scenario())
    # A free slot: no wait. Behind the holder: the 50 ms it held the slot, the joined ask as long as the run it joined.
    assert holder[0] == FOLLOW_UP
    assert holder[1] < 0.001
    assert first[0] == FOLLOW_UP
    assert first[1] >= 0.05
    # Asked a moment after the sleep began: a hair under it at the least.
    assert joined[0] == SPEC_CHANGE
    assert 0.04 <= joined[1] <= first[1]
