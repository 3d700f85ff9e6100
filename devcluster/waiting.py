"""Poll until a condition holds, with a bounded timeout and a failure message that shows what was seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")

#: Longest wait any caller may ask for: everything in a local cluster settles well within it.
MAX_TIMEOUT = 120.0


class WaitTimeoutError(AssertionError):
    """The condition did not hold in time (an AssertionError, so pytest reports it as a failure)."""


def _show(value: object, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def wait_for(
    observe: Callable[[], T],
    until: Callable[[T], bool] = bool,
    *,
    timeout: float = 30.0,
    interval: float = 0.2,
    what: str = "condition",
    show: Callable[[T], object] = lambda value: value,
) -> T:
    """Call ``observe()`` until ``until(observation)`` holds; return that observation.

    An exception from ``observe`` counts as "not yet" (the object may not exist yet) and is reported if it
    is the last thing seen. On timeout, raise :class:`WaitTimeoutError` naming ``what`` and the last
    observation (passed through ``show``, to pick out the telling part of a large object).
    """
    if not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(f"timeout must be in (0, {MAX_TIMEOUT}] seconds, got {timeout}")
    deadline = time.monotonic() + timeout
    last = "nothing (not observed once)"
    while True:
        try:
            value = observe()
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
    """The type of :func:`wait_for`, for annotating the ``wait_for`` fixture."""

    def __call__(
        self,
        observe: Callable[[], T],
        until: Callable[[T], bool] = ...,
        *,
        timeout: float = ...,
        interval: float = ...,
        what: str = ...,
        show: Callable[[T], object] = ...,
    ) -> T:
        """Poll ``observe`` until ``until`` holds, as :func:`wait_for` does."""
