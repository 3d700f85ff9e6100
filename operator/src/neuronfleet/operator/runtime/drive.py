"""How kopf's handlers reach the reconcilers: on kopf's worker threads, in order of urgency, retried, and
the periodic resync.

The handlers (``neuronfleet.operator.runtime.handlers``) only say which change wakes which reconcile; this is
what runs it: each reconcile on a worker thread, a service's spec change ahead of what its children's
events wake (:class:`WorkerSlots`), a failed one retried alone (``retries``), every ``resync_seconds``
a full pass over everything, behind the watches, and every :data:`CANARY_INTERVAL_S` a pass over the
services whose canary is progressing (its analysis reads the engines, whose figures change with no event).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import functools
import gc
import heapq
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from neuronfleet.operator.reconcilers import Manager
from neuronfleet.operator.runtime.retries import Retries

T = TypeVar("T")

log = logging.getLogger(__name__)

#: The longest a resync waits, between two objects, for the event loop to take one turn.
RESYNC_YIELD_TIMEOUT_S = 1.0
#: A resync this many periods late fails the operator's liveness probe.
RESYNC_LATE_PERIODS = 5
#: Threads that run reconciles (kopf's executor), and as many run at once.
RECONCILE_WORKERS = 8
#: The order in which waiting reconciles get a worker: a service's spec change (what moves its
#: ``observedGeneration``) first, then what the children's events, the artifacts and the deletions wake.
SPEC_CHANGE, FOLLOW_UP = 0, 1
#: Each priority's name in the operator's metrics.
PRIORITY_NAMES = {SPEC_CHANGE: "spec_change", FOLLOW_UP: "follow_up"}
#: Told how long each ask waited for a worker (seconds), with the priority it was asked at.
Waited = Callable[[int, float], None]
#: Seconds between two passes of a progressing canary: its analysis, and the end of its step's pause. Not a
#: kopf timer: kopf puts a finalizer on each object a timer runs for, and the operator may not patch services.
CANARY_INTERVAL_S = 5.0
#: The services whose canary is progressing, as (namespace, name).
Progressing = Callable[[], Sequence[tuple[str, str]]]


@dataclass(eq=False)
class _Waiter:
    """A reconcile waiting for a worker: handed one through ``turn``; ``ended`` once it ran or was cancelled."""

    key: Hashable | None
    priority: int
    turn: asyncio.Future[None]
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: When it got its worker (the event loop's clock).
    started_at: float = 0.0
    #: Set once it ran: what it raised, for those who joined it to raise too (their retries are the same).
    ran: bool = False
    failure: BaseException | None = None


class WorkerSlots:
    """At most ``slots`` reconciles on the worker threads at once; among those waiting, the most urgent goes first.

    Without it, a spec change would queue behind every reconcile a rollout's Deployment events woke, in the
    executor's first-come order. A reconcile asked for while one of the same object still waits joins it
    instead of queueing another: the waiting one has read nothing yet, so it sees whatever woke the second
    (and takes on the more urgent priority of the two). Everything here runs on the event loop. ``waited`` is
    told each ask's wait for a worker, a joined one's until the run it joined began.
    """

    def __init__(self, slots: int, waited: Waited | None = None) -> None:
        self._waited = waited
        self._free = slots
        self._waiting: list[tuple[int, int, _Waiter]] = []
        self._order = itertools.count()
        self._by_key: dict[Hashable, _Waiter] = {}

    async def run(self, key: Hashable, priority: int, call: Callable[[], Awaitable[object]]) -> None:
        """Await ``call()`` once a worker slot is ours; or the run of ``key`` still waiting for one, if any."""
        asked = asyncio.get_running_loop().time()
        while (waiting := self._by_key.get(key)) is not None:
            if priority < waiting.priority:
                waiting.priority = priority
                heapq.heappush(self._waiting, (priority, next(self._order), waiting))
            await waiting.ended.wait()
            if waiting.ran:
                self._tell(priority, waiting.started_at - asked)
                if waiting.failure is not None:
                    raise waiting.failure
                return
        await self.call(key, priority, call, asked)

    async def call(
        self, key: Hashable | None, priority: int, call: Callable[[], Awaitable[T]], asked: float | None = None
    ) -> T:
        """``await call()`` once a worker slot is ours, and its result (``asked``: when, if before now)."""
        loop = asyncio.get_running_loop()
        asked = loop.time() if asked is None else asked
        waiter = _Waiter(key, priority, loop.create_future())
        try:
            if self._free > 0:
                # A free slot means nobody waits: a released slot goes to a waiter first.
                self._free -= 1
            else:
                await self._wait_for_turn(waiter)
            waiter.started_at = loop.time()
            self._tell(priority, waiter.started_at - asked)
            waiter.ran = True
            try:
                return await call()
            except BaseException as error:
                waiter.failure = error
                raise
            finally:
                self._release()
        finally:
            waiter.ended.set()

    async def _wait_for_turn(self, waiter: _Waiter) -> None:
        if waiter.key is not None:
            self._by_key[waiter.key] = waiter
        heapq.heappush(self._waiting, (waiter.priority, next(self._order), waiter))
        try:
            await waiter.turn
        except asyncio.CancelledError:
            if self._by_key.get(waiter.key) is waiter:
                del self._by_key[waiter.key]
            if waiter.turn.done() and not waiter.turn.cancelled():
                self._release()  # handed a slot as it was cancelled: the next one takes it
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, waiter = heapq.heappop(self._waiting)
            if waiter.turn.done():
                continue  # cancelled, or an earlier entry of a waiter whose priority was raised
            if self._by_key.get(waiter.key) is waiter:
                del self._by_key[waiter.key]  # it reads the cluster from here on: nothing joins it now
            waiter.turn.set_result(None)
            return
        self._free += 1

    def _tell(self, priority: int, seconds: float) -> None:
        if self._waited is not None:
            self._waited(priority, max(0.0, seconds))

    def __len__(self) -> int:
        """How many reconciles wait for a slot."""
        return sum(1 for _, _, waiter in self._waiting if not waiter.turn.done())


class ResyncStopped(Exception):
    """Ends a resync pass in flight: the operator is stopping."""


class Drive:
    """Runs ``manager``'s reconciles for the handlers, and its resync every ``resync_seconds``."""

    def __init__(self, manager: Manager, namespaces: Sequence[str] | None, resync_seconds: float) -> None:
        self.manager = manager
        self.namespaces = namespaces
        self.resync_seconds = resync_seconds
        self.retries = Retries()
        wait = manager.metrics.queue_wait
        self.slots = WorkerSlots(
            RECONCILE_WORKERS, lambda priority, s: wait.labels(PRIORITY_NAMES[priority]).observe(s)
        )
        self.executor: concurrent.futures.Executor | None = None
        self.last_resync: datetime.datetime | None = None
        self._resync: asyncio.Task[None] | None = None
        self._canaries: asyncio.Task[None] | None = None
        self._stopping = threading.Event()

    async def in_worker(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on kopf's worker threads (its ``settings.execution.executor``), once a slot is free."""
        return await self.slots.call(None, FOLLOW_UP, functools.partial(self._on_thread, call, *args))

    async def reconcile_service(self, namespace: str, name: str, priority: int = FOLLOW_UP) -> None:
        """Reconcile a service (or join its reconcile still waiting for a worker), retried until it succeeds."""
        key = ("service", namespace, name)
        reconcile = functools.partial(self._on_thread, self.manager.reconcile_service, namespace, name)
        await self.retries.run(key, functools.partial(self.slots.run, key, priority, reconcile))

    def _on_thread(self, call: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(call, *args))

    async def reconcile_services(self, namespace: str, names: Sequence[str]) -> None:
        """Reconcile each service on its own: one that fails is retried alone."""
        for name in names:
            await self.reconcile_service(namespace, name)

    async def reconcile_artifact(self, namespace: str, name: str) -> None:
        """Reconcile an artifact, then the services its status change concerns; retried until it succeeds."""

        async def run() -> None:
            services = await self.in_worker(self.manager.reconcile_artifact, namespace, name)
            await self.reconcile_services(namespace, services)

        await self.retries.run(("artifact", namespace, name), run)

    def start(self, executor: concurrent.futures.Executor, canaries: Progressing = lambda: ()) -> None:
        """Run reconciles on ``executor``, and start the resync and the passes over the ``canaries`` progressing."""
        self.executor = executor
        self._resync = asyncio.create_task(self._resync_forever())
        self._canaries = asyncio.create_task(self._canaries_forever(canaries))

    def stop(self) -> None:
        """Stop the resync (a pass in flight ends at its next object), the canaries' passes and the retries waiting."""
        self._stopping.set()
        for task in (self._resync, self._canaries):
            if task is not None:
                task.cancel()
        self.retries.cancel()

    async def _canaries_forever(self, progressing: Progressing) -> None:
        # Every CANARY_INTERVAL_S -> reconcile each service whose canary is progressing, side by side.
        while True:
            await asyncio.sleep(CANARY_INTERVAL_S)
            passes = [self.reconcile_service(namespace, name) for namespace, name in progressing()]
            for failure in await asyncio.gather(*passes, return_exceptions=True):
                if isinstance(failure, Exception):
                    log.error("a canary's pass failed; the next one tries again: %s", failure)

    def probe(self) -> str:
        """When the last resync ended (``pending`` before the first); raises when it is long overdue."""
        last = self.last_resync
        overdue = datetime.timedelta(seconds=RESYNC_LATE_PERIODS * self.resync_seconds)
        if last is not None and datetime.datetime.now(datetime.UTC) - last > overdue:
            raise RuntimeError(f"no successful resync since {last.isoformat()}")
        return last.isoformat() if last is not None else "pending"

    async def _resync_forever(self) -> None:
        # Every resync_seconds -> reconcile every artifact, then every service.
        loop = asyncio.get_running_loop()

        def one_turn_of_the_loop() -> None:
            # The pass's thread waits while the loop takes in what the watches delivered meanwhile: without
            # it the loop would fight the pass for the GIL, and a change would wait out the whole pass.
            # Bounded, and a closed loop passed over: the pass must not outlive the operator's stop.
            if self._stopping.is_set():
                raise ResyncStopped
            with contextlib.suppress(RuntimeError, TimeoutError):
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=RESYNC_YIELD_TIMEOUT_S)

        while True:
            await asyncio.sleep(self.resync_seconds)
            try:
                count = await asyncio.to_thread(self.manager.resync, self.namespaces, one_turn_of_the_loop)
            except Exception:  # the loop must outlive any one failure; the next pass retries
                log.exception("resync failed")
            else:
                self.last_resync = datetime.datetime.now(datetime.UTC)
                log.info("resync done: %d objects reconciled", count)
            # What the cache holds now is long-lived: out of the cyclic collector's way, whose full passes over
            # a thousand services' objects would otherwise stall the event loop for a tenth of a second. Collected
            # first, so no garbage cycle is frozen for good; that pass covers only what the last freeze left.
            gc.collect()
            gc.freeze()
