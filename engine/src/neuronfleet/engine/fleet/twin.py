"""The twin's event loop: requests arrive, a router places them, replicas step, an autoscaler adds and removes
replicas; everything on one virtual clock.

Events come in time order (arrivals, the HPA's syncs, the timeline's samples). Before each, every replica runs
the steps that start before it, so a router sees each replica as it was at that moment (and, through its
scrapes, a little before). What the run reports: each request's token times and replica, the fleet's timeline,
and the replica-seconds it paid for.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm.config import CacheConfig

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.scaling import SCRAPE_S, signal_lag_s, trend_window_s
from neuronfleet.contract.start_time import StartTime, StoreKind, predict_start
from neuronfleet.engine.fleet.arrivals import Source, TwinRequest
from neuronfleet.engine.fleet.autoscaler import Autoscaler, AutoscalingPolicy, Signals
from neuronfleet.engine.fleet.engines import Engines, LocalEngines, WorkerEngines
from neuronfleet.engine.fleet.picker import Router
from neuronfleet.engine.fleet.replica import Replica, ReplicaEngine, Served
from neuronfleet.engine.offline.virtual_clock import percentile
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning.prefill_cap import resolve_prefill_cap


@dataclass(frozen=True)
class FleetSpec:
    """One service as the twin runs it: each replica's engine, clock and KV blocks, how many start, how long a
    new one takes to serve, its autoscaling, and the time a request spends outside the engine."""

    engine: EngineConfig
    cost: CostModel
    num_kv_blocks: int
    replicas: int
    #: Seconds from a scale-out decision to a replica taking requests (:func:`replica_start`'s total, or a test's).
    start_s: float = 0.0
    autoscaling: AutoscalingPolicy | None = None
    #: What the client sees beyond the engine: the HTTP path through the router and back, per request.
    host_path_s: float = 0.0
    enable_prefix_caching: bool = True

    @classmethod
    def of(cls, engine: EngineConfig, cost: CostModel, replicas: int, **options: Any) -> FleetSpec:
        """A fleet of ``engine`` as ``serve`` runs it on the simulated device: the ``auto`` prefill cap derived
        from ``cost``'s step times, the KV blocks its executor offers."""
        resolved = resolve_prefill_cap(engine, cost)
        return cls(resolved, cost, replica_kv_blocks(cost, resolved), replicas, **options)

    @property
    def prefill_tokens_per_s(self) -> float:
        """The prefill rate each replica publishes, as its warm-up times its prefill graphs."""
        return self.cost.prefill_tokens_per_s(self.engine.effective_num_batched_tokens_buckets)


def replica_start(engine: EngineConfig, cost: CostModel, store: StoreKind = "hf") -> StartTime:
    """How long a new replica of ``engine`` takes to serve on Neuron: its weights fetched from ``store``, loaded and
    sharded, and a step of each compiled graph (``contract/start_time.py``)."""
    warmup = cost.warmup_seconds(
        engine.effective_num_batched_tokens_buckets, engine.effective_num_seqs_buckets, engine.decode_context_buckets
    )
    return predict_start(cost.weight_bytes, store, warmup_s=warmup)


@dataclass(frozen=True)
class Sample:
    """The fleet at one moment of the run."""

    at: float
    ready: int
    starting: int
    draining: int
    waiting: int
    in_flight: int
    kv_usage: float


@dataclass
class TwinRun:
    """What a run produced."""

    spec: FleetSpec
    served: list[Served] = field(default_factory=list)
    #: Requests no replica could take: none was ready, or the answer would not fit ``max_model_len``.
    refused: list[TwinRequest] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    replica_seconds: float = 0.0
    wall_s: float = 0.0
    steps: int = 0

    def ttfts(self, *, since: float = 0.0) -> list[float]:
        """Seconds to each measured request's first token, as its client saw it (arrivals from ``since``)."""
        return [s.ttft_s + self.spec.host_path_s for s in self.measured(since)]

    def measured(self, since: float = 0.0) -> list[Served]:
        """The answered requests that count: no warm-ups, arrived from ``since`` on."""
        return [s for s in self.served if not s.request.warmup and s.request.at >= since]

    def summary(self, since: float = 0.0) -> dict[str, Any]:
        """TTFT, inter-token and end-to-end percentiles, in seconds, with the counts and the cost."""
        served = self.measured(since)
        ttft = sorted(self.ttfts(since=since))
        gaps = sorted(gap for s in served for gap in s.inter_token_s())
        e2e = sorted(s.e2e_s + self.spec.host_path_s for s in served)
        figures: dict[str, Any] = {
            "answered": len(served),
            "refused": len(self.refused),
            "replica_hours": self.replica_seconds / 3600,
            "simulated_s": self.samples[-1].at if self.samples else 0.0,
            "wall_s": self.wall_s,
            "steps": self.steps,
        }
        for name, values in (("ttft", ttft), ("itl", gaps), ("e2e", e2e)):
            for q in (50, 90, 99):
                figures[f"{name}_p{q}_s"] = percentile(values, q) if values else math.nan
        figures["ttft_mean_s"] = statistics.fmean(ttft) if ttft else math.nan
        return figures


@dataclass
class _Fleet:
    """The replicas of one run as the router sees them, their engines, and when each began to cost."""

    spec: FleetSpec
    engines: Engines
    replicas: list[Replica] = field(default_factory=list)
    by_name: dict[str, Replica] = field(default_factory=dict)
    began: dict[str, float] = field(default_factory=dict)
    paid_s: float = 0.0
    #: (when it ended, seconds) of each step: the device-busy counter's recent rate.
    busy: deque[tuple[float, float]] = field(default_factory=deque)
    _names: Iterator[int] = field(default_factory=itertools.count)

    def add(self, now: float, ready_at: float) -> None:
        replica = Replica(f"replica-{next(self._names)}", self.spec.num_kv_blocks, ready_at=ready_at)
        self.replicas.append(replica)
        self.by_name[replica.name] = replica
        self.began[replica.name] = now
        self.engines.add(replica.name, ready_at)

    def remove(self, replica: Replica, at: float) -> None:
        self.replicas.remove(replica)
        del self.by_name[replica.name]
        self.paid_s += at - self.began.pop(replica.name)
        self.engines.drop(replica.name)

    @property
    def keeps_busy_time(self) -> bool:
        """Whether a warm floor reads the steps' busy time (else nothing keeps them)."""
        autoscaling = self.spec.autoscaling
        return autoscaling is not None and autoscaling.warm_floor is not None

    def serving(self, now: float) -> list[Replica]:
        return [r for r in self.replicas if r.ready_at <= now and r.draining_since is None]

    def wanted(self) -> int:
        """Replicas not draining: the scale subresource's ``spec.replicas``."""
        return sum(1 for r in self.replicas if r.draining_since is None)

    def scale_to(self, wanted: int, now: float) -> None:
        """Add replicas (ready ``start_s`` later), or remove the ones a ReplicaSet would, given the operator's deletion
        costs: starting ones first, then those holding fewest requests at Prometheus's last scrape (the newest of
        equals), which drain what they hold."""
        for _ in range(wanted - self.wanted()):
            self.add(now, now + self.spec.start_s)
        surplus = self.wanted() - wanted
        scrape_s = self.spec.autoscaling.scrape_interval_s if self.spec.autoscaling else SCRAPE_S
        scraped = now - now % scrape_s
        victims = sorted(
            (r for r in self.replicas if r.draining_since is None),
            key=lambda r: (r.ready_at <= now, r.in_flight_at(scraped), -r.ready_at),
        )[: max(surplus, 0)]
        for replica in victims:
            if replica.ready_at > now or replica.idle:
                self.remove(replica, now)
            else:
                replica.draining_since = now


ARRIVE, SCALE, SAMPLE = 0, 1, 2


def run(
    spec: FleetSpec,
    source: Source,
    router: Router,
    *,
    sample_s: float = 1.0,
    progress: Callable[[float], None] | None = None,
    workers: int = 1,
) -> TwinRun:
    """Serve ``source``'s requests on ``spec``'s fleet through ``router``, to the last answer; the engines step
    in ``workers`` processes when the source is an open loop (the same run, sooner)."""
    began = time.monotonic()

    def build(name: str, ready_at: float) -> ReplicaEngine:
        return ReplicaEngine(name, spec.engine, spec.cost, spec.num_kv_blocks, ready_at, spec.enable_prefix_caching)

    engines = WorkerEngines(build, workers) if workers > 1 and not source.closed_loop else LocalEngines(build)
    try:
        result = _run(source, router, _Fleet(spec, engines), sample_s, progress)
    finally:
        engines.close()
    result.wall_s = time.monotonic() - began
    return result


def _run(
    source: Source, router: Router, fleet: _Fleet, sample_s: float, progress: Callable[[float], None] | None
) -> TwinRun:
    spec = fleet.spec
    result = TwinRun(spec)
    for _ in range(spec.replicas):
        fleet.add(0.0, 0.0)
    autoscaler = Autoscaler.rendered(spec.autoscaling, spec.start_s) if spec.autoscaling else None
    sequence = itertools.count()
    events: list[tuple[float, int, int, TwinRequest | None]] = []

    def push(at: float, kind: int, request: TwinRequest | None = None) -> None:
        heapq.heappush(events, (at, next(sequence), kind, request))

    for first in source.initial():
        push(first.at, ARRIVE, first)
    push(0.0, SAMPLE)
    if autoscaler is not None:
        push(autoscaler.policy.sync_s, SCALE)
    arrivals_left = sum(1 for event in events if event[2] == ARRIVE)
    next_progress = 0.0
    while events:
        # Replicas step in time order up to the next event; an answer's follow-up may become the next event.
        for served in _advance(fleet, lambda: events[0][0], result):
            router.answered(served)
            answered_at = served.token_times[-1] + spec.host_path_s
            for follow_up in source.answered(served.request, answered_at, served.output):
                push(max(follow_up.at, served.token_times[-1]), ARRIVE, follow_up)
                arrivals_left += 1
        now, _, kind, request = heapq.heappop(events)
        busy = arrivals_left > 0 or any(r.in_flight for r in fleet.replicas)
        if kind == ARRIVE:
            assert request is not None
            arrivals_left -= 1
            _route(fleet, router, request, now, result)
        elif kind == SCALE and autoscaler is not None and busy:
            signals = _scraped_signals(fleet, now, autoscaler.policy)
            fleet.scale_to(autoscaler.decide(now, fleet.wanted(), signals), now)
            push(now + autoscaler.policy.sync_s, SCALE)
        elif kind == SAMPLE and busy:
            result.samples.append(_sample(fleet, now))
            push(now + sample_s, SAMPLE)
        if progress is not None and now >= next_progress:
            progress(now)
            next_progress = now + 10.0
    _finish(fleet, result)
    return result


def _route(fleet: _Fleet, router: Router, request: TwinRequest, now: float, result: TwinRun) -> None:
    candidates = fleet.serving(now)
    # vLLM's API refuses a request whose answer cannot fit ``max_model_len`` (a 400), as it does when none serves.
    if not candidates or len(request.prompt) + request.max_tokens > fleet.spec.engine.max_model_len:
        result.refused.append(request)
        return
    chosen = router.pick(request, now, candidates)
    chosen.admit(request)
    fleet.engines.admit(chosen.name, request)


def _advance(fleet: _Fleet, until: Callable[[], float], result: TwinRun) -> Iterator[Served]:
    """Run the engines' steps that start before ``until()`` (read again, where the engines step here, after every
    answer, which may have brought the next event closer); yield each answer as its step ends. A draining replica
    goes once it holds nothing."""
    for step in fleet.engines.advance(until):
        replica = fleet.by_name.get(step.replica)
        if replica is None:
            continue  # removed earlier in this advance; its later steps did not happen
        done = replica.record(step)
        if fleet.keeps_busy_time:
            fleet.busy.append((step.end, step.end - step.start))
        result.steps += 1
        result.served += done
        if replica.draining_since is not None and replica.idle:
            fleet.remove(replica, max(replica.draining_since, replica.clock))
        yield from done


def _finish(fleet: _Fleet, result: TwinRun) -> None:
    """Run every replica to its last answer, and pay for each until then (or the last sample)."""
    for _ in _advance(fleet, lambda: math.inf, result):
        pass
    end = max([result.samples[-1].at if result.samples else 0.0, *(s.token_times[-1] for s in result.served)])
    for replica in list(fleet.replicas):
        fleet.remove(replica, end)
    result.replica_seconds = fleet.paid_s


def _scraped_signals(fleet: _Fleet, now: float, policy: AutoscalingPolicy) -> Signals:
    """What the ScaledObject's queries read at ``now``: the serving replicas' gauges as Prometheus last scraped
    them, and the device-busy seconds' rate over the warm floor's window (each step counted as it ends)."""
    scraped = now - (now % policy.scrape_interval_s)
    exported = [r.exported_at(scraped) for r in fleet.serving(now)]
    signals = Signals(
        waiting=float(sum(e.waiting for e in exported)),
        prefill_backlog_s=sum(e.prefill_pending for e in exported) / fleet.spec.prefill_tokens_per_s,
        lag_s=signal_lag_s(fleet.spec.start_s, policy.scrape_interval_s),
    )
    if policy.warm_floor is None:
        return signals
    floor = policy.warm_floor
    while fleet.busy and fleet.busy[0][0] < scraped - floor.window_s:
        fleet.busy.popleft()

    def busy(window: float) -> float:
        return sum(seconds for ended, seconds in fleet.busy if scraped - window <= ended <= scraped) / window

    recent = busy(trend_window_s(floor.window_s)) if floor.follow_trend else 0.0
    return dataclasses.replace(signals, busy=busy(floor.window_s), busy_recent=recent)


def _sample(fleet: _Fleet, now: float) -> Sample:
    replicas: Sequence[Replica] = fleet.replicas
    ready = [r for r in replicas if r.ready_at <= now and r.draining_since is None]
    return Sample(
        at=now,
        ready=len(ready),
        starting=sum(1 for r in replicas if r.ready_at > now),
        draining=sum(1 for r in replicas if r.draining_since is not None),
        waiting=sum(r.exported_at(now).waiting for r in ready),
        in_flight=sum(len(r.in_flight) for r in replicas),
        kv_usage=statistics.fmean(r.exported_at(now).kv_usage for r in ready) if ready else 0.0,
    )


def replica_kv_blocks(cost: CostModel, engine: EngineConfig, memory_utilization: float | None = None) -> int:
    """The KV blocks a replica on the simulated device gets: what its executor offers vLLM, in blocks, at
    ``memory_utilization`` (vLLM's own default, as the rig's engines run, when None)."""
    share = memory_utilization or vllm_compat.gpu_memory_utilization(CacheConfig(block_size=engine.block_size))
    offered = cost.simulated_kv_cache_bytes(
        share, block_size=engine.block_size, max_num_seqs=engine.max_num_seqs, max_model_len=engine.max_model_len
    )
    return offered // (cost.kv_bytes_per_token() * engine.block_size)
