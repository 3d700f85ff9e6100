"""Device time as the scheduler sees it, for an executor that does not report its own (a real Neuron device).

vLLM's engine core hands each ``schedule()``'s output to the executor and gives the runner's answer to
``update_from_output``. The device runs one step at a time, so a step's device time runs from its dispatch, or
from the return of the step before it when that came later (async scheduling dispatches the next step while one
runs), to its own return. It includes the host's share of the step (inputs, sampling), small on Neuron beside
the graph's execution. The warm floor reads the sum (``neuronfleet:device_busy_seconds``) and the prefill
backlog the best prefill rate (``neuronfleet:prefill_tokens_per_second``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

#: Steps dispatched and not yet returned that are remembered: more are ones the engine dropped.
MAX_IN_FLIGHT = 64
#: Steps of a prefill bucket timed before its rate counts: one alone may have waited on the host.
MIN_PREFILL_STEPS = 3


@dataclass(frozen=True)
class TimedStep:
    """One step, timed: ``prefill`` or ``decode``, its device seconds, and for a prefill its graph's tokens."""

    kind: str
    seconds: float
    prefill_bucket: int = 0


@dataclass
class StepClock:
    """Times steps from dispatch to return, one device step at a time."""

    clock: Callable[[], float] = time.monotonic
    _in_flight: OrderedDict[int, tuple[float, str, int]] = field(default_factory=OrderedDict)
    _last_return: float = -math.inf

    def dispatched(self, key: int, kind: str, prefill_bucket: int = 0) -> None:
        """A step left for the device (``key`` names it until it returns)."""
        self._in_flight[key] = (self.clock(), kind, prefill_bucket)
        while len(self._in_flight) > MAX_IN_FLIGHT:
            self._in_flight.popitem(last=False)

    def returned(self, key: int) -> TimedStep | None:
        """A step came back: its device time (None for a step never seen dispatched)."""
        found = self._in_flight.pop(key, None)
        now = self.clock()
        if found is None:
            return None
        dispatched_at, kind, bucket = found
        started = max(dispatched_at, self._last_return)
        self._last_return = now
        return TimedStep(kind, max(now - started, 0.0), bucket)


@dataclass
class PrefillRate:
    """The best prefill rate seen: each prefill bucket's tokens over its mean step time, the fastest bucket's."""

    #: By bucket: steps timed, and their seconds in all.
    _steps: dict[int, tuple[int, float]] = field(default_factory=dict)

    def add(self, bucket: int, seconds: float) -> None:
        """A prefill step of ``bucket`` tokens took ``seconds``."""
        count, total = self._steps.get(bucket, (0, 0.0))
        self._steps[bucket] = (count + 1, total + seconds)

    def tokens_per_s(self) -> float | None:
        """The fastest bucket's tokens a second, once some bucket has :data:`MIN_PREFILL_STEPS` steps."""
        rates = [
            bucket * count / total
            for bucket, (count, total) in self._steps.items()
            if count >= MIN_PREFILL_STEPS and total > 0
        ]
        return max(rates) if rates else None
