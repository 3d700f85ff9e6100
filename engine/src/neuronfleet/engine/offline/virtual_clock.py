"""A virtual clock for offline scheduler runs: each step lasts what the cost model says.

A synchronous engine runs one step at a time, so the clock is the sum of step
times. Requests arrive at the clock's value when they are added; a prefill that
finishes its prompt emits the first token, each decode one more.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from neuronfleet.contract.buckets import get_bucket_for_count
from neuronfleet.contract.config import EngineConfig
from neuronfleet.engine.offline.driver import OfflineEngine, StepRecord
from neuronfleet.engine.offline.scenarios import ScenarioRequest, prompt_token_ids
from neuronfleet.engine.sim.cost_model import CostModel


@dataclass
class Timeline:
    """Token times of every request, on a virtual clock driven by ``cost``."""

    cost: CostModel
    #: The compiled shapes: decode batches pad to its batch buckets and read its context buckets.
    engine: EngineConfig
    clock: float = 0.0
    arrival: dict[str, float] = field(default_factory=dict)
    token_times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    decode_batch_sizes: list[int] = field(default_factory=list)
    #: Per request: (start of its first prefill chunk, end of its last).
    prefill_spans: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Looked up on every decode step.
        self._batch_buckets = self.engine.effective_num_seqs_buckets
        self._context_buckets = self.engine.decode_context_buckets
        #: Decode step times by compiled shape: few shapes, and a fleet's replicas run millions of steps.
        self._decode_seconds: dict[tuple[int, int], float] = {}

    def after_step(self, engine: OfflineEngine, record: StepRecord | None, in_flight_before: int) -> None:
        """``run_scenario``'s hook: advance the clock by the step and stamp its tokens."""
        # Requests added since the last step arrived now (unless their arrival was set beforehand).
        if len(engine.progress) > len(self.arrival):
            for req_id in engine.progress:
                self.arrival.setdefault(req_id, self.clock)
        if record is None or not record.scheduled:
            return
        if record.is_prefill:
            # One chunk, or several prompts packed into one bucket.
            starts = {item.req_id: self.prefill_spans.get(item.req_id, (self.clock,))[0] for item in record.scheduled}
            self.clock += self.cost.packed_prefill_seconds(
                [(item.num_tokens_padded, item.computed_before) for item in record.scheduled]
            )
            for item in record.scheduled:
                self.prefill_spans[item.req_id] = (starts[item.req_id], self.clock)
                if item.computed_before + item.num_tokens >= engine.progress[item.req_id].prompt_len:
                    self.token_times[item.req_id].append(self.clock)
            return
        batch = len(record.scheduled)
        longest = max(item.computed_before + 1 for item in record.scheduled)
        shape = (get_bucket_for_count(batch, self._batch_buckets), get_bucket_for_count(longest, self._context_buckets))
        if (seconds := self._decode_seconds.get(shape)) is None:
            seconds = self._decode_seconds[shape] = self.cost.decode_seconds(*shape)
        self.clock += seconds
        self.decode_batch_sizes.append(batch)
        for item in record.scheduled:
            self.token_times[item.req_id].append(self.clock)

    def ttft(self, req_id: str) -> float:
        """Seconds from arrival to first token."""
        return self.token_times[req_id][0] - self.arrival[req_id]

    def inter_token_latencies(self, req_ids: Sequence[str], during: Sequence[str] = ()) -> list[float]:
        """Every gap between consecutive tokens of ``req_ids``.

        With ``during``, only the gaps that overlap the prefill of one of those requests.
        """
        spans = [self.prefill_spans[req_id] for req_id in during]
        gaps: list[float] = []
        for req_id in req_ids:
            for earlier, later in itertools.pairwise(self.token_times[req_id]):
                if not spans or any(earlier < end and later > start for start, end in spans):
                    gaps.append(later - earlier)
        return gaps


@dataclass(frozen=True)
class Arrival:
    """A request that arrives at a virtual time, in seconds."""

    at: float
    request: ScenarioRequest


def serve_arrivals(
    engine: OfflineEngine, timeline: Timeline, arrivals: Sequence[Arrival], max_iterations: int = 10_000_000
) -> None:
    """Run ``arrivals`` to completion, each added once the clock reaches its time (an open loop).

    A request that arrives during a step waits for the step's end, as it would on the device;
    its TTFT still counts from its arrival. An idle engine jumps ahead to the next arrival.
    """
    pending = deque(sorted(arrivals, key=lambda arrival: arrival.at))
    for _ in range(max_iterations):
        if not (pending or engine.has_work):
            return
        if pending and not engine.has_work:
            timeline.clock = max(timeline.clock, pending[0].at)
        while pending and pending[0].at <= timeline.clock:
            arrival = pending.popleft()
            request = arrival.request
            engine.add_request(request.req_id, prompt_token_ids(request), request.max_tokens)
            timeline.arrival[request.req_id] = arrival.at
        in_flight_before = len(engine.in_flight)
        record = engine.step()
        timeline.after_step(engine, record, in_flight_before)
        if (record is None or not record.scheduled) and not engine.in_flight and engine.has_work:
            # Nothing ran and nothing will finish: only a new arrival can change the scheduler's mind.
            if not pending:
                raise RuntimeError(f"the scheduler runs nothing while requests wait: {engine.unfinished()}")
            timeline.clock = max(timeline.clock, pending[0].at)
    raise RuntimeError(f"arrivals did not finish in {max_iterations} iterations: {engine.unfinished()}")


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, q a whole number from 1 to 99, by linear interpolation."""
    if not (1 <= q <= 99 and q == int(q)):
        raise ValueError(f"percentile must be a whole number from 1 to 99, got {q}")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]
