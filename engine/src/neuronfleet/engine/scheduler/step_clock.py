"""Device time as the scheduler sees it, for an executor that does not report its own (a real Neuron device).

vLLM's engine core hands each ``schedule()``'s output to the executor and gives the runner's answer to
``update_from_output``. The device runs one step at a time, so the time from a step's dispatch, or from the
return of the step before it when that came later (async scheduling dispatches the next step while one runs),
to its own return is device time, with the host's share of the step (inputs, sampling) in it. Summed, that is
the busy time the warm floor reads (``neuronfleet:device_busy_seconds``).

Which step a second belongs to is only as exact as the executor lets it be: an executor that runs a step before
returning from ``execute_model`` (vLLM's single-process one) runs the next step before the engine core takes
the previous one's output in, so with two steps in flight each is timed as the one after it. The sum is right
either way; the ``kind`` of each second, and so a prefill rate from these times, is not, and none is derived.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

#: Steps dispatched and not yet returned that are remembered: more are ones the engine dropped.
MAX_IN_FLIGHT = 64

StepKind = Literal["prefill", "decode"]


@dataclass(frozen=True)
class TimedStep:
    """One step, timed: its kind and its device seconds."""

    kind: StepKind
    seconds: float


@dataclass
class StepClock:
    """Times steps from dispatch to return, one device step at a time."""

    clock: Callable[[], float] = time.monotonic
    _in_flight: OrderedDict[int, tuple[float, StepKind]] = field(default_factory=OrderedDict, init=False)
    _last_return: float = field(default=-math.inf, init=False)

    def dispatched(self, key: int, kind: StepKind) -> None:
        """A step left for the device (``key`` names it until it returns)."""
        self._in_flight[key] = (self.clock(), kind)
        while len(self._in_flight) > MAX_IN_FLIGHT:
            self._in_flight.popitem(last=False)

    def returned(self, key: int) -> TimedStep | None:
        """A step came back: its device time (None for a step never seen dispatched)."""
        found = self._in_flight.pop(key, None)
        if found is None:
            return None
        now = self.clock()
        dispatched_at, kind = found
        started = max(dispatched_at, self._last_return)
        self._last_return = now
        return TimedStep(kind, max(now - started, 0.0))
