"""One replica of the twin, in two halves: its engine (the real scheduler on the calibrated clock) and what the
rest of the fleet sees of it.

:class:`ReplicaEngine` steps the scheduler. A request routed to it joins the scheduler at the next step boundary
(as vLLM's engine core adds requests between steps), and its time to first token counts from its arrival. Each
step comes back as a :class:`StepResult`: when it ran, the gauges after it, the requests it finished.

:class:`Replica` is what the router, the autoscaler and the timeline read: what the replica exports (its waiting
queue and KV use, as vLLM's gauges after each step; its requests in flight, as the engine's drain gate counts
them), kept step by step so a picker can read it as it was at its last scrape. It learns only from step results,
so an engine may step in another process (``engine/fleet/engines.py``).
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field

from neuronfleet.contract.config import EngineConfig
from neuronfleet.engine.fleet.arrivals import TwinRequest
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler
from neuronfleet.engine.offline.virtual_clock import Timeline
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.sim.cost_model import CostModel

#: Exported figures older than this are dropped: a picker reads what was current at most one scrape ago.
_HISTORY_S = 5.0


@dataclass(frozen=True)
class Exported:
    """What a replica's ``/metrics`` showed from ``at`` on: vLLM's gauges after a step."""

    at: float
    waiting: int
    kv_usage: float
    #: The Neuron scheduler's prompt tokens still to prefill.
    prefill_pending: int = 0


@dataclass(frozen=True)
class Served:
    """A finished request: its token times and where it ran."""

    request: TwinRequest
    replica: str
    token_times: tuple[float, ...]
    output: tuple[int, ...]

    @property
    def ttft_s(self) -> float:
        """Seconds from arrival to the first token."""
        return self.token_times[0] - self.request.at

    @property
    def e2e_s(self) -> float:
        """Seconds from arrival to the last token."""
        return self.token_times[-1] - self.request.at

    def inter_token_s(self) -> list[float]:
        """Every gap between consecutive tokens."""
        return [later - earlier for earlier, later in itertools.pairwise(self.token_times)]


class ReplicaStuck(RuntimeError):
    """The scheduler runs nothing while requests wait, and no arrival can change that (a prompt too large for the
    replica's KV cache)."""


@dataclass(frozen=True)
class Finished:
    """A request a step finished: its token times and tokens."""

    req_id: str
    token_times: tuple[float, ...]
    output: tuple[int, ...]


@dataclass(frozen=True)
class StepResult:
    """One step of one replica's engine: when it started and ended, vLLM's gauges after it, what it finished."""

    replica: str
    start: float
    end: float
    waiting: int
    kv_usage: float
    prefill_pending: int
    finished: tuple[Finished, ...]


@dataclass
class ReplicaEngine:
    """One replica's engine: ``OfflineEngine`` with the Neuron scheduler on the calibrated clock."""

    name: str
    engine_config: EngineConfig
    cost: CostModel
    num_kv_blocks: int
    ready_at: float = 0.0
    enable_prefix_caching: bool = True
    _pending: deque[TwinRequest] = field(default_factory=deque)
    #: Routed and not yet finished, in arrival order.
    _admitted: dict[str, None] = field(default_factory=dict)
    #: Steps in a row that scheduled nothing.
    _empty_steps: int = 0

    def __post_init__(self) -> None:
        scheduler = build_scheduler(
            self.engine_config, num_kv_blocks=self.num_kv_blocks, enable_prefix_caching=self.enable_prefix_caching
        )
        self.engine = OfflineEngine(scheduler, keep_steps=False)
        self.timeline = Timeline(self.cost, self.engine_config, clock=self.ready_at)

    def admit(self, request: TwinRequest) -> None:
        """Take ``request``, routed here at its arrival."""
        self._admitted[request.req_id] = None
        self._pending.append(request)

    def next_step_at(self) -> float | None:
        """When the next step starts: now if there is work, at the next routed request's arrival if idle; None
        when there is nothing at all."""
        if self.engine.has_work:
            return self.timeline.clock
        return max(self.timeline.clock, self._pending[0].at) if self._pending else None

    def step(self) -> StepResult:
        """Run the next step (see :meth:`next_step_at`)."""
        engine, timeline = self.engine, self.timeline
        if not engine.has_work:
            # Idle: the next request starts a step when it arrives.
            timeline.clock = max(timeline.clock, self._pending[0].at)
        start = timeline.clock
        while self._pending and self._pending[0].at <= timeline.clock:
            request = self._pending.popleft()
            engine.add_request(request.req_id, request.prompt, request.max_tokens)
            timeline.arrival[request.req_id] = request.at
        record = engine.step()
        timeline.after_step(engine, record, 0)
        scheduler = engine.scheduler
        result = StepResult(
            self.name,
            start,
            timeline.clock,
            vllm_compat.waiting_count(scheduler),
            scheduler.kv_cache_manager.usage,
            scheduler.pending_prefill_tokens,
            self._collect_finished(),
        )
        self._empty_steps = 0 if record is not None and record.scheduled else self._empty_steps + 1
        # Async scheduling keeps steps in flight: past that many empty steps in a row, none of those runs anything.
        if self._empty_steps > engine.max_in_flight and engine.scheduler.has_unfinished_requests():
            if not (self._pending and self._pending[0].at > timeline.clock):
                raise ReplicaStuck(f"{self.name} runs nothing while requests wait: {engine.unfinished()}")
            timeline.clock = self._pending[0].at
        return result

    def _collect_finished(self) -> tuple[Finished, ...]:
        done = []
        for req_id in self._admitted:
            progress = self.engine.progress.get(req_id)
            if progress is not None and progress.finished:
                times = tuple(self.timeline.token_times.pop(req_id))
                done.append(Finished(req_id, times, tuple(progress.output_tokens)))
        for finished in done:
            del self._admitted[finished.req_id]
            # Kept only while a step in flight may still name it.
            self.timeline.prefill_spans.pop(finished.req_id, None)
        return tuple(done)


@dataclass
class Replica:
    """One serving replica as the fleet sees it: ready from ``ready_at`` (its start time past), serving until it
    is drained."""

    name: str
    num_kv_blocks: int
    ready_at: float = 0.0
    #: Routed and not yet answered, in arrival order: what the engine's in-flight gauge counts.
    in_flight: dict[str, TwinRequest] = field(default_factory=dict)
    #: Set once scale-in picked it: it takes nothing new, finishes what it holds, then goes.
    draining_since: float | None = None
    _exported: list[Exported] = field(default_factory=list)
    #: The in-flight gauge's value from each moment it changed on.
    _in_flight_log: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])

    def __post_init__(self) -> None:
        self._exported.append(Exported(self.ready_at, 0, 0.0))

    @property
    def clock(self) -> float:
        """When its engine's last step ended (or, before any, when it became ready)."""
        return self._exported[-1].at

    @property
    def idle(self) -> bool:
        """Nothing in flight."""
        return not self.in_flight

    def admit(self, request: TwinRequest) -> None:
        """Count ``request`` in, routed here at its arrival."""
        self.in_flight[request.req_id] = request
        self._log_in_flight(request.at)

    def record(self, step: StepResult) -> list[Served]:
        """Learn what a step of the engine did; return the requests it answered."""
        self._exported.append(Exported(step.end, step.waiting, step.kv_usage, step.prefill_pending))
        if len(self._exported) > 4096:
            # Keep what a scrape may still read.
            keep = bisect.bisect_left(self._exported, step.end - _HISTORY_S, key=lambda figures: figures.at)
            del self._exported[: max(keep - 1, 0)]
        served = [Served(self.in_flight.pop(f.req_id), self.name, f.token_times, f.output) for f in step.finished]
        for answer in served:
            self._log_in_flight(answer.token_times[-1])
        return served

    def exported_at(self, moment: float) -> Exported:
        """The gauges as a scrape at ``moment`` read them: after the last step that ended by then."""
        index = bisect.bisect_right(self._exported, moment, key=lambda figures: figures.at) - 1
        return self._exported[max(index, 0)]

    def in_flight_at(self, moment: float) -> int:
        """The in-flight gauge as a scrape at ``moment`` read it."""
        index = bisect.bisect_right(self._in_flight_log, moment, key=lambda change: change[0]) - 1
        return self._in_flight_log[max(index, 0)][1]

    def _log_in_flight(self, moment: float) -> None:
        # A finish is learnt at the next step boundary, rarely after a later arrival was logged: kept in time order.
        bisect.insort(self._in_flight_log, (moment, len(self.in_flight)), key=lambda change: change[0])
        if len(self._in_flight_log) > 4096:
            keep = bisect.bisect_left(self._in_flight_log, moment - _HISTORY_S, key=lambda change: change[0])
            del self._in_flight_log[: max(keep - 1, 0)]
