"""One replica of the twin: the real scheduler on the calibrated clock, advanced to a moment of virtual time.

A replica's clock is when its current step ends. A request routed to it joins the scheduler at the next step
boundary (as vLLM's engine core adds requests between steps), and its time to first token counts from its
arrival. What the replica exports (its waiting queue and KV use, as vLLM's gauges after each step; its requests
in flight, as the engine's drain gate counts them) is kept step by step, so a picker can read it as it was at
its last scrape.
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


@dataclass
class Replica:
    """One serving replica: ready from ``ready_at`` (its start time past), serving until it is drained."""

    name: str
    engine_config: EngineConfig
    cost: CostModel
    num_kv_blocks: int
    ready_at: float = 0.0
    enable_prefix_caching: bool = True
    #: Routed and not yet answered, in arrival order: what the engine's in-flight gauge counts.
    in_flight: dict[str, TwinRequest] = field(default_factory=dict)
    #: Set once scale-in picked it: it takes nothing new, finishes what it holds, then goes.
    draining_since: float | None = None
    _pending: deque[TwinRequest] = field(default_factory=deque)
    _exported: list[Exported] = field(default_factory=list)
    #: The in-flight gauge's value from each moment it changed on.
    _in_flight_log: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])

    def __post_init__(self) -> None:
        scheduler = build_scheduler(
            self.engine_config, num_kv_blocks=self.num_kv_blocks, enable_prefix_caching=self.enable_prefix_caching
        )
        self.engine = OfflineEngine(scheduler, keep_steps=False)
        self.timeline = Timeline(self.cost, self.engine_config, clock=self.ready_at)
        self._exported.append(Exported(self.ready_at, 0, 0.0))

    @property
    def clock(self) -> float:
        """When the replica's current step ends (or, idle, when it last worked)."""
        return self.timeline.clock

    @property
    def idle(self) -> bool:
        """Nothing in flight."""
        return not self.in_flight

    def admit(self, request: TwinRequest) -> None:
        """Take ``request``, routed here at its arrival."""
        self.in_flight[request.req_id] = request
        self._pending.append(request)
        self._log_in_flight(request.at)

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

    def next_step_at(self) -> float | None:
        """When the replica's next step starts: now if it has work, at the next routed request's arrival if idle;
        None when it has nothing at all."""
        if self.engine.has_work:
            return self.clock
        return max(self.clock, self._pending[0].at) if self._pending else None

    def step(self) -> list[Served]:
        """Run the next step (see :meth:`next_step_at`); return the requests that finished with it."""
        engine, timeline = self.engine, self.timeline
        if not engine.has_work:
            # Idle: the next request starts a step when it arrives.
            timeline.clock = max(timeline.clock, self._pending[0].at)
        while self._pending and self._pending[0].at <= timeline.clock:
            request = self._pending.popleft()
            engine.add_request(request.req_id, request.prompt, request.max_tokens)
            timeline.arrival[request.req_id] = request.at
        record = engine.step()
        timeline.after_step(engine, record, 0)
        self._export()
        served = self._collect_finished()
        if (record is None or not record.scheduled) and not engine.in_flight and engine.has_work:
            if not (self._pending and self._pending[0].at > timeline.clock):
                raise ReplicaStuck(f"{self.name} runs nothing while requests wait: {engine.unfinished()}")
            timeline.clock = self._pending[0].at
        return served

    def _export(self) -> None:
        scheduler = self.engine.scheduler
        figures = Exported(self.clock, vllm_compat.waiting_count(scheduler), scheduler.kv_cache_manager.usage)
        self._exported.append(figures)
        if len(self._exported) > 4096:
            # Keep what a scrape may still read.
            keep = bisect.bisect_left(self._exported, self.clock - _HISTORY_S, key=lambda figures: figures.at)
            del self._exported[: max(keep - 1, 0)]

    def _collect_finished(self) -> list[Served]:
        done = []
        for req_id, request in self.in_flight.items():
            progress = self.engine.progress.get(req_id)
            if progress is not None and progress.finished:
                times = tuple(self.timeline.token_times.pop(req_id))
                done.append(Served(request, self.name, times, tuple(progress.output_tokens)))
        for served in done:
            del self.in_flight[served.request.req_id]
            self._log_in_flight(served.token_times[-1])
            # Kept only while a step in flight may still name it.
            self.timeline.prefill_spans.pop(served.request.req_id, None)
        return done
