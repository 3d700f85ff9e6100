"""The simulated Neuron compiler: a bucket's graph "compiles" in the time the cost model gives."""

from __future__ import annotations

import time
from collections.abc import Callable

from neuronfleet.engine.artifacts.store import BucketEntry
from neuronfleet.engine.sim.cost_model import CostModel


def simulated_compiler(cost: CostModel, *, sleep: bool) -> Callable[[BucketEntry], float]:
    """Compile one bucket on the simulated device: take (or, with ``sleep=False``, only count) its time."""

    def compile_bucket(entry: BucketEntry) -> float:
        seconds = cost.compile_seconds(entry.size)
        if sleep:
            time.sleep(seconds)
        return seconds

    return compile_bucket
