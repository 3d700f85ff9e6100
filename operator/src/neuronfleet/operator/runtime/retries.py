"""The operator's retry contract: which failures are retried, and after how long.

- :class:`RetryLater` (the cluster is mid-change: an artifact being deleted, owner references
  that kept conflicting): after :data:`RETRY_LATER_SECONDS`.
- :class:`ApiError` (the API server refused a request, gave no answer in time, or could not be
  reached): after :data:`API_ERROR_SECONDS`.

Every handler retries both until the reconcile succeeds (or finds its object gone). The handlers
are kopf event handlers, whose errors kopf only logs, so the retry is scheduled here
(:class:`Retries`); any other failure is logged and left to the next full resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

from neuronfleet.operator.cluster.kube import ApiError
from neuronfleet.operator.reconcilers import RetryLater

#: Seconds before a reconcile that found the cluster mid-change runs again.
RETRY_LATER_SECONDS = 2.0
#: Seconds before a reconcile that the API server failed runs again.
API_ERROR_SECONDS = 10.0
#: The failures that are retried.
RETRYABLE = (RetryLater, ApiError)

log = logging.getLogger(__name__)


def retry_delay(error: RetryLater | ApiError) -> float:
    """Seconds to wait before retrying after ``error``."""
    return RETRY_LATER_SECONDS if isinstance(error, RetryLater) else API_ERROR_SECONDS


class Retries:
    """Runs reconciles for event handlers, and runs each again after its delay when it fails retryably.

    One retry is pending per key at most: a reconcile reads the cluster afresh, so a second one
    would do the same work. A success in between cancels the pending retry.
    """

    def __init__(self, delay: Callable[[RetryLater | ApiError], float] = retry_delay) -> None:
        self._delay = delay
        self._pending: dict[Hashable, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._pending)

    async def run(self, key: Hashable, reconcile: Callable[[], Awaitable[object]]) -> None:
        """Run ``reconcile`` now; on a retryable failure, schedule it again (and again, until it succeeds)."""
        try:
            await reconcile()
        except RETRYABLE as error:
            if key in self._pending:
                return
            delay = self._delay(error)
            log.warning("%s failed, retrying in %g s: %s", key, delay, error)
            self._pending[key] = asyncio.create_task(self._later(key, reconcile, delay))
        else:
            pending = self._pending.pop(key, None)
            if pending is not None:
                pending.cancel()

    async def _later(self, key: Hashable, reconcile: Callable[[], Awaitable[object]], delay: float) -> None:
        await asyncio.sleep(delay)
        del self._pending[key]
        try:
            await self.run(key, reconcile)
        except Exception:  # no handler to report to: kopf would only log it too
            log.exception("%s failed, not retryable; the next full resync tries again", key)

    def cancel(self) -> None:
        """Drop every pending retry (the operator is stopping)."""
        for task in self._pending.values():
            task.cancel()
        self._pending.clear()
