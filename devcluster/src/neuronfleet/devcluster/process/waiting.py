"""Poll until a condition holds, within a bound the caller names, failing with what was seen last."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from neuronfleet.devcluster.errors import RigError

T = TypeVar("T")

#: The bound when a caller names none: a local cluster settles well within it.
DEFAULT_TIMEOUT = 30.0


class WaitTimeoutError(RigError, AssertionError):
    """The condition did not hold in time (an AssertionError, so pytest reports it as a failure)."""


def _show(value: object, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def wait_for(
    observe: Callable[[], T],
    until: Callable[[T], bool] = bool,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.2,
    what: str = "condition",
    show: Callable[[T], object] = lambda value: value,
    fatal: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``observe()`` until ``until(observation)`` holds; return that observation.

    An exception from ``observe`` counts as "not yet" (the object may not exist yet) and is reported if it
    is the last thing seen, except those of the ``fatal`` types, which end the wait at once (a process that
    exited will never become ready). On timeout, raise :class:`WaitTimeoutError` naming ``what`` and the
    last observation (passed through ``show``, to pick out the telling part of a large object).
    """
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    deadline = time.monotonic() + timeout
    last = "nothing (not observed once)"
    while True:
        try:
            value = observe()
        except fatal:
            raise
        except Exception as error:  # the thing may not exist yet: keep polling, remember why
            last = f"{type(error).__name__}: {_show(error)}"
        else:
            if until(value):
                return value
            last = _show(show(value))
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(f"timed out after {timeout:g} s waiting for {what}; last seen: {last}")
        time.sleep(interval)


class WaitFor(Protocol):
    """The type of :func:`wait_for`, for annotating the ``wait_for`` fixture and callers that take one."""

    def __call__(
        self,
        observe: Callable[[], T],
        until: Callable[[T], bool] = ...,
        *,
        timeout: float = ...,
        interval: float = ...,
        what: str = ...,
        show: Callable[[T], object] = ...,
        fatal: tuple[type[BaseException], ...] = ...,
    ) -> T:
        """Poll ``observe`` until ``until`` holds, as :func:`wait_for` does."""
