"""The fleet twin: how well it agrees with the rig, how fast it runs, and what it answers that the rig cannot.

``--part validate``: every figure the rig's routing benches stored (``neuronfleet.engine.fleet.rig.RIG_FIGURES``)
beside the twin's for the same arrivals at the same replica counts, the median over ``--seeds`` seeds of the
routers' draws with their range, the errors and the goals (p50 within 15%, p99 within 30%, each picker's p99
ratio to the Service's within 25%).

``--part speed``: 16 replicas of the 8B deployment (trn2.48xlarge, TP 8, ``bench/deployments.py``) behind the
picker, chat traffic at 20 requests/s for ``--minutes`` virtual minutes; simulated seconds per wall second and
requests per CPU-second, beside one replica of the same engine on the benches' single-replica virtual clock at
the same per-replica rate (``serve_arrivals``), so the ratio is the fleet's cost over N independent engines.

``--part prefix``: the prefix bench's chat at 2, 4, 8, 16 and 32 replicas (clients scaled with the replicas, two
per replica, on one system prompt per replica): TTFT p50 and p99 through the prefix-aware picker, the load-only
one and the Service.

``--part routing``: the routing mixes at 8 and 16 replicas (rates scaled with the replicas).

``--part scaling``: a traffic step (2x for 10 minutes, between 5 minutes each side at the base rate) and a day
compressed into 40 minutes, on the 8B deployment, RAG-like traffic: the fewest static replicas that keep 95% of
requests within the SLO (TTFT, and time per output token after the first), then autoscaled fleets on the queue
alone, with the prefill backlog, and with the warm floor too, replicas starting in 30 s, 2 min and 5 min: share
within the SLO and replica-hours against the static fleet's. ``--day-minutes`` stretches the day (a real one
rises over hours: at 40 minutes, a 2-minute start is a 72-minute one on a 24-hour day).

Run: ``.venv/bin/python bench/fleet_twin.py --part validate`` (and the others); prints tables and the commit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import logging
import math
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deployments import DEPLOYMENTS
from provenance import commit
from tables import print_table

from neuronfleet.contract.config import EngineConfig, SchedulerOptions
from neuronfleet.contract.picker import PickerScoring
from neuronfleet.engine.fleet import arrivals, rig, twin, workloads
from neuronfleet.engine.fleet.autoscaler import AutoscalingPolicy, WarmFloor
from neuronfleet.engine.fleet.picker import PickerRouter
from neuronfleet.engine.fleet.replica import Served
from neuronfleet.engine.offline.driver import OfflineEngine, build_scheduler
from neuronfleet.engine.offline.scenarios import ScenarioRequest
from neuronfleet.engine.offline.virtual_clock import Arrival, Timeline, percentile, serve_arrivals
from neuronfleet.engine.sim.cost_model import CostModel


def validate(seeds: int) -> None:
    """Every stored rig figure beside the twin's."""
    rows, within = [], {"p50": [0, 0], "p99": [0, 0], "ratio": [0, 0]}
    replayed = {}
    for figure in rig.RIG_FIGURES:
        twin_figures = rig.replay(figure.bench, figure.mix, figure.side, tuple(range(seeds)))
        replayed[figure.bench, figure.mix, figure.side] = twin_figures
        p99_error = 1000 * twin_figures.p99_s / figure.p99_ms - 1
        within["p99"][0] += abs(p99_error) <= 0.30
        within["p99"][1] += 1
        p50_cell, p50_error_cell = "-", "-"
        if figure.p50_ms is not None:
            p50_error = 1000 * twin_figures.p50_s / figure.p50_ms - 1
            within["p50"][0] += abs(p50_error) <= 0.15
            within["p50"][1] += 1
            p50_cell, p50_error_cell = f"{figure.p50_ms:.0f}", f"{p50_error:+.0%}"
        p99s = ", ".join(f"{1000 * value:.0f}" for value in twin_figures.p99s)
        rows.append(
            [
                f"{figure.bench}: {figure.mix}, {figure.side}",
                f"{p50_cell} / {figure.p99_ms:.0f}",
                f"{1000 * twin_figures.p50_s:.0f} / {1000 * twin_figures.p99_s:.0f} [{p99s}]",
                p50_error_cell,
                f"{p99_error:+.0%}",
                figure.commit,
            ]
        )
        print(f"  {rows[-1][0]}: done", flush=True)
    title = f"TTFT in ms, rig against twin (median of {seeds} seeds, each seed's p99); commit {commit()}"
    print_table(
        title, ["mix, side", "rig p50 / p99", "twin p50 / p99 [p99 by seed]", "p50 error", "p99 error", "rig at"], rows
    )
    ratio_rows = []
    for figure in rig.RIG_FIGURES:
        if figure.side == "service":
            continue
        service = next(f for f in rig.RIG_FIGURES if (f.bench, f.mix, f.side) == (figure.bench, figure.mix, "service"))
        rig_ratio = service.p99_ms / figure.p99_ms
        ours = (
            replayed[figure.bench, figure.mix, "service"].p99_s / replayed[figure.bench, figure.mix, figure.side].p99_s
        )
        error = ours / rig_ratio - 1
        within["ratio"][0] += abs(error) <= 0.25
        within["ratio"][1] += 1
        ratio_rows.append(
            [
                f"{figure.bench}: {figure.mix}, Service / {figure.side}",
                f"{rig_ratio:.2f}x",
                f"{ours:.2f}x",
                f"{error:+.0%}",
            ]
        )
    print_table("TTFT p99, the Service's over each picker's", ["mix, ratio", "rig", "twin", "error"], ratio_rows)
    for name, (good, total) in within.items():
        print(f"{name}: {good} of {total} within the goal")


class PeakMemory:
    """The most memory this process and its children held together while inside: their proportional set sizes
    (pages the forked workers share with it counted once), sampled every second."""

    def __init__(self) -> None:
        self.peak_bytes = 0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._sampler.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._sampler.join()

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._done.wait(1.0):
            total = 0
            for process in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += process.memory_full_info().pss
            self.peak_bytes = max(self.peak_bytes, total)


def speed(minutes: float, workers: int) -> None:
    """16 replicas at 20 requests/s (engines stepping in ``workers`` processes) against one replica at 20/16 on
    the single-replica virtual clock."""
    deployment = DEPLOYMENTS[0]
    cost = deployment.cost()
    engine = deployment.engine(SchedulerOptions(), cost)
    duration = 60 * minutes
    traffic = workloads.TRAFFIC["chat"]
    source = traffic.requests(arrivals.poisson_times(20.0, duration, 1), cap=4096, seed=1)
    spec = twin.FleetSpec.of(engine, cost, 16)
    cpu = time.process_time()
    with PeakMemory() as memory:
        run = twin.run(
            spec,
            source,
            PickerRouter(PickerScoring(inflight_tokens=True)),
            progress=lambda now: print(f"  {now:.0f} virtual s", flush=True),
            workers=workers,
        )
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    fleet_cpu = time.process_time() - cpu + children.ru_utime + children.ru_stime
    one = traffic.requests(arrivals.poisson_times(20.0 / 16, duration, 2), cap=4096, seed=2)
    single = OfflineEngine(
        build_scheduler(spec.engine, num_kv_blocks=spec.num_kv_blocks, enable_prefix_caching=True), keep_steps=False
    )
    timeline = Timeline(cost, spec.engine)
    cpu, wall = time.process_time(), time.monotonic()
    requests = [Arrival(r.at, ScenarioRequest(r.req_id, len(r.prompt), r.max_tokens)) for r in one.requests]
    serve_arrivals(single, timeline, requests)
    single_wall, single_cpu = time.monotonic() - wall, time.process_time() - cpu
    figures = run.summary()
    rows = [
        [
            f"fleet twin: 16 replicas, 20 req/s, {workers} worker(s)",
            f"{figures['simulated_s']:.0f}",
            f"{run.wall_s:.1f}",
            f"{figures['simulated_s'] / run.wall_s:.2f}",
            f"{figures['answered'] / fleet_cpu:.1f}",
            f"{run.steps / run.wall_s:.0f}",
        ],
        [
            "one replica, 1.25 req/s (virtual clock)",
            f"{timeline.clock:.0f}",
            f"{single_wall:.1f}",
            f"{timeline.clock / single_wall:.2f}",
            f"{len(requests) / single_cpu:.1f}",
            f"{single.num_steps / single_wall:.0f}",
        ],
    ]
    print_table(
        f"{deployment.name}, chat (150 tokens out); commit {commit()}; peak memory "
        f"{memory.peak_bytes / 2**20:.0f} MiB (this process and its workers, shared pages counted once)",
        ["run", "virtual s", "wall s", "virtual s / wall s", "requests / CPU s", "steps / wall s"],
        rows,
    )
    print(f"fleet / single steps per wall second: {(run.steps / run.wall_s) / (single.num_steps / single_wall):.2f}x")


def prefix_at_scale(sizes: list[int], seeds: int) -> None:
    """The prefix bench's chat, scaled: two clients per replica, one system prompt per replica."""
    rows = []
    for replicas in sizes:
        spec = rig.rig_spec(rig.PREFIX_ENGINE, replicas)
        figures = {}
        for side in rig.PREFIX_SIDES:
            p50s, p99s = [], []
            for seed in range(seeds):
                mix = workloads.ConversationMix(150, prefixes=replicas, clients=2 * replicas)
                ttfts = sorted(
                    twin.run(
                        spec,
                        mix.clients_for(rig.WINDOW_S * 3, f"scale-{replicas}-{seed}"),
                        rig.router(side, spec.engine, seed),
                    ).ttfts()
                )
                p50s.append(percentile(ttfts, 50))
                p99s.append(percentile(ttfts, 99))
            figures[side] = (statistics.median(p50s), statistics.median(p99s))
        load, prefix, service = figures["picker"], figures["picker-prefix"], figures["service"]
        rows.append(
            [
                str(replicas),
                *(f"{1000 * p50:.0f} / {1000 * p99:.0f}" for p50, p99 in (prefix, load, service)),
                f"{load[0] / prefix[0]:.2f}x / {load[1] / prefix[1]:.2f}x",
                f"{service[0] / prefix[0]:.2f}x / {service[1] / prefix[1]:.2f}x",
            ]
        )
        print(f"  {replicas} replicas: done", flush=True)
    print_table(
        f"prefix bench's chat (2 clients and 1 system prompt per replica, 120 s), TTFT p50 / p99 ms, "
        f"median of {seeds} seeds; commit {commit()}",
        [
            "replicas",
            "prefix-aware",
            "load-only picker",
            "Service",
            "load-only / prefix-aware",
            "Service / prefix-aware",
        ],
        rows,
    )


def routing_at_scale(sizes: list[int], seeds: int) -> None:
    """The routing mixes with their rates scaled to the replicas."""
    rows = []
    for replicas in sizes:
        spec = rig.rig_spec(rig.ROUTING_ENGINE, replicas)
        for name, mix in workloads.ROUTING_MIXES.items():
            scaled = workloads.RoutingMix(mix.short_rate * replicas / 2, mix.long_rate * replicas / 2, mix.long_tokens)
            p99 = {}
            for side in rig.ROUTING_SIDES:
                values = []
                for seed in range(seeds):
                    ttfts = []
                    for index in range(rig.ROUNDS):
                        run = twin.run(
                            spec, scaled.window(name, index, rig.WINDOW_S), rig.router(side, spec.engine, seed + index)
                        )
                        ttfts += [
                            s.ttft_s + spec.host_path_s for s in run.served if s.request.req_id.startswith("short")
                        ]
                    values.append(percentile(sorted(ttfts), 99))
                p99[side] = statistics.median(values)
            rows.append(
                [
                    f"{name}, {replicas} replicas",
                    *(f"{1000 * p99[side]:.0f}" for side in rig.ROUTING_SIDES),
                    f"{p99['service'] / p99['picker']:.2f}x",
                ]
            )
            print(f"  {name} at {replicas}: done", flush=True)
    print_table(
        f"routing mixes, rates x replicas / 2, short requests' TTFT p99 in ms, median of {seeds} seeds; "
        f"commit {commit()}",
        ["mix", "Service", "picker", "picker (engine metrics)", "Service / picker"],
        rows,
    )


def time_per_output_token(served: Served) -> float:
    """Seconds per token after the first (0 for a one-token answer)."""
    gaps = served.inter_token_s()
    return statistics.fmean(gaps) if gaps else 0.0


@dataclass(frozen=True)
class Trace:
    """A scaling part's traffic: its rate over time, its peak, how long it runs."""

    name: str
    rate: Callable[[float], float]
    peak: float
    duration_s: float


def scaling_traces(base_rate: float, day_s: float = 2400.0) -> list[Trace]:
    """A 2x step for 10 minutes, after 10 minutes at the base rate (time to settle) and before 5 more; and a day
    compressed into ``day_s`` (from an eighth of the peak at night to the peak at noon)."""
    return [
        Trace("step", arrivals.step_rate(base_rate, 2.0, 600.0, 600.0), 2 * base_rate, 1500.0),
        Trace("day", arrivals.diurnal_rate(base_rate * 9 / 8, 7 / 9, day_s), 2 * base_rate, day_s),
    ]


def scaling_policies(
    slo_ttft_s: float, floor_steps: list[int], trend_steps: Sequence[int] = ()
) -> dict[str, AutoscalingPolicy]:
    """The CRD's defaults between 1 and 16 replicas on the queue alone, with the prefill backlog (half the TTFT SLO
    of prefill work a replica), and with a warm floor too for each of ``floor_steps`` (the rise absorbed, in
    percent; the SLO's TTFT waited) and a trend-following one for each of ``trend_steps`` (the headroom above
    the load projected a lag ahead, in percent)."""
    queue = AutoscalingPolicy(min_replicas=1, max_replicas=16)
    tokens = dataclasses.replace(queue, prefill_backlog_seconds=slo_ttft_s / 2)
    floors = {
        f"+ warm floor {step}%": dataclasses.replace(tokens, warm_floor=WarmFloor(step=step / 100, ttft_s=slo_ttft_s))
        for step in floor_steps
    }
    trends = {
        f"+ trend floor {step}%": dataclasses.replace(
            tokens, warm_floor=WarmFloor(step=step / 100, ttft_s=slo_ttft_s, follow_trend=True)
        )
        for step in trend_steps
    }
    return {"queue only": queue, "+ prefill backlog": tokens, **floors, **trends}


def within_slo(run: twin.TwinRun, slo: tuple[float, float]) -> float:
    """The share of answered requests within the TTFT and time-per-output-token SLO (a refused one is outside)."""
    served = run.measured()
    good = sum(1 for s in served if s.ttft_s + run.spec.host_path_s <= slo[0] and time_per_output_token(s) <= slo[1])
    return good / max(len(served) + len(run.refused), 1)


@dataclass(frozen=True)
class ScalingRuns:
    """What the scaling part runs: traces, start times, the warm floors, and which policies."""

    base_rate: float
    starts: list[float]
    trace_names: list[str]
    floor_steps: list[int]
    trend_steps: list[int]
    #: Only the policies whose name holds one of these (all when empty).
    only: list[str]
    #: The static fleet to compare with (None: search the smallest meeting 95%).
    static: int | None
    workers: int
    day_s: float = 2400.0


def scaling(runs: ScalingRuns) -> None:
    """Each trace on the 8B deployment, RAG-like traffic: the smallest static fleet with 95% within the SLO, then
    each policy at each start time, starting from that fleet's share for the first moment's rate."""
    base_rate, starts, workers = runs.base_rate, runs.starts, runs.workers
    deployment = DEPLOYMENTS[0]
    cost = deployment.cost()
    engine = deployment.engine(SchedulerOptions(), cost)
    slo = (deployment.ttft_slo_s, deployment.itl_slo_s)
    router = functools.partial(PickerRouter, PickerScoring(inflight_tokens=True))
    policies = {
        name: policy
        for name, policy in scaling_policies(slo[0], runs.floor_steps, runs.trend_steps).items()
        if not runs.only or any(part in name for part in runs.only)
    }
    for trace in [t for t in scaling_traces(base_rate, runs.day_s) if t.name in runs.trace_names]:
        source = workloads.TRAFFIC["rag"].requests(
            arrivals.modulated_times(trace.rate, trace.peak, trace.duration_s, 3), cap=4096, seed=3
        )
        if runs.static is None:
            static, static_run = smallest_static_fleet(engine, cost, source, router, slo, workers)
        else:
            static = runs.static
            static_run = twin.run(twin.FleetSpec.of(engine, cost, static), source, router(), workers=workers)
        met = within_slo(static_run, slo)
        rows = [["static, the fewest meeting 95%", "-", f"{met:.1%}", *cost_columns(static_run, static_run)]]
        initial = max(1, math.ceil(static * trace.rate(0.0) / trace.peak))
        for start in starts:
            for name, policy in policies.items():
                spec = twin.FleetSpec.of(engine, cost, initial, start_s=start, autoscaling=policy)
                run = twin.run(spec, source, router(), workers=workers)
                rows.append([name, f"{start:.0f} s", f"{within_slo(run, slo):.1%}", *cost_columns(run, static_run)])
                print(f"  {trace.name}, start {start:.0f} s, {name}: done", flush=True)
        print_table(
            f"{deployment.name}, RAG-like traffic, {trace.name} trace (peak {trace.peak:g}/s, "
            f"{trace.duration_s / 60:.0f} min); SLO TTFT <= {slo[0]:g} s and time per output token <= {slo[1]:g} s; "
            f"static fleet {static}, autoscaled fleets start at {initial}; commit {commit()}",
            ["fleet", "replica start", "requests within SLO", "replica-hours", "of the static fleet's", "most ready"],
            rows,
        )


def cost_columns(run: twin.TwinRun, static: twin.TwinRun) -> list[str]:
    """Replica-hours, their share of the static fleet's, the most replicas ready at once."""
    return [
        f"{run.replica_seconds / 3600:.2f}",
        f"{run.replica_seconds / static.replica_seconds:.0%}",
        str(max(sample.ready for sample in run.samples)),
    ]


def smallest_static_fleet(
    engine: EngineConfig,
    cost: CostModel,
    source: arrivals.OpenLoop,
    router: Callable[[], PickerRouter],
    slo: tuple[float, float],
    workers: int,
) -> tuple[int, twin.TwinRun]:
    """The fewest replicas that keep 95% of the trace's requests within the SLO: doubled from 4 until it holds,
    then bisected."""
    runs: dict[int, twin.TwinRun] = {}

    def meets(size: int) -> bool:
        runs[size] = twin.run(twin.FleetSpec.of(engine, cost, size), source, router(), workers=workers)
        print(f"  static {size}: {within_slo(runs[size], slo):.1%}", flush=True)
        return within_slo(runs[size], slo) >= 0.95

    low, high = 1, 4
    while not meets(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if meets(middle) else (middle, high)
    return high, runs[high]


def main() -> None:
    """Run the parts asked for."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--part", choices=["validate", "speed", "prefix", "routing", "scaling"], nargs="+", default=["validate"]
    )
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=10.0, help="the speed part's virtual minutes")
    parser.add_argument("--workers", type=int, default=2, help="processes the engines step in (speed, scaling)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--base-rate", type=float, default=4.0, help="the scaling part's base rate, requests/s")
    parser.add_argument("--starts", type=float, nargs="+", default=[30.0, 120.0, 300.0], help="replica start times, s")
    parser.add_argument("--traces", nargs="+", choices=["step", "day"], default=["step", "day"])
    parser.add_argument("--day-minutes", type=float, default=40.0, help="the day trace's length, virtual minutes")
    parser.add_argument("--floor-steps", type=int, nargs="+", default=[100], help="warm floors' rises, percent")
    parser.add_argument(
        "--trend-steps", type=int, nargs="*", default=[], help="trend-following warm floors' headroom, percent"
    )
    parser.add_argument("--policies", nargs="*", default=[], help="only the policies whose name holds one of these")
    parser.add_argument("--static", type=int, help="the static fleet to compare with (default: the smallest at 95%%)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    if "validate" in args.part:
        validate(args.seeds)
    if "speed" in args.part:
        speed(args.minutes, args.workers)
    if "prefix" in args.part:
        prefix_at_scale(args.sizes, args.seeds)
    if "routing" in args.part:
        routing_at_scale([size for size in args.sizes if size >= 8], args.seeds)
    if "scaling" in args.part:
        scaling(
            ScalingRuns(
                args.base_rate, args.starts, args.traces, args.floor_steps, args.trend_steps, args.policies,
                args.static, args.workers, args.day_minutes * 60,
            )
        )  # fmt: skip


if __name__ == "__main__":
    main()
