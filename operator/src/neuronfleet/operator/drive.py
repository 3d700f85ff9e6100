"""How kopf's handlers reach the reconcilers: on kopf's worker threads, retried, and the periodic resync.

The handlers (``neuronfleet.operator.handlers``) only say which change wakes which reconcile; this is
what runs it: each reconcile on a worker thread, a failed one retried alone (``retries``), and every
``resync_seconds`` a full pass over everything, behind the watches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import functools
import gc
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from neuronfleet.operator.reconcilers import Manager
from neuronfleet.operator.retries import Retries

T = TypeVar("T")

log = logging.getLogger(__name__)

#: The longest a resync waits, between two objects, for the event loop to take one turn.
RESYNC_YIELD_TIMEOUT_S = 1.0
#: A resync this many periods late fails the operator's liveness probe.
RESYNC_LATE_PERIODS = 5


class ResyncStopped(Exception):
    """Ends a resync pass in flight: the operator is stopping."""


class Drive:
    """Runs ``manager``'s reconciles for the handlers, and its resync every ``resync_seconds``."""

    def __init__(self, manager: Manager, namespaces: Sequence[str] | None, resync_seconds: float) -> None:
        self.manager = manager
        self.namespaces = namespaces
        self.resync_seconds = resync_seconds
        self.retries = Retries()
        self.executor: concurrent.futures.Executor | None = None
        self.last_resync: datetime.datetime | None = None
        self._resync: asyncio.Task[None] | None = None
        self._stopping = threading.Event()

    async def in_worker(self, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` on kopf's worker threads (its ``settings.execution.executor``), as its sync handlers."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(call, *args))

    async def reconcile_service(self, namespace: str, name: str) -> None:
        """Reconcile a service, retried until it succeeds."""
        reconcile = functools.partial(self.in_worker, self.manager.reconcile_service, namespace, name)
        await self.retries.run(("service", namespace, name), reconcile)

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

    def start(self, executor: concurrent.futures.Executor) -> None:
        """Run reconciles on ``executor``, and start the resync."""
        self.executor = executor
        self._resync = asyncio.create_task(self._resync_forever())

    def stop(self) -> None:
        """Stop the resync (a pass in flight ends at its next object) and the retries waiting."""
        self._stopping.set()
        if self._resync is not None:
            self._resync.cancel()
        self.retries.cancel()

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
