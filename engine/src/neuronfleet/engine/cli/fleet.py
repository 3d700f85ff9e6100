"""``neuronfleet-engine fleet``: the fleet twin on the command line: ``run`` one service's fleet on a load, ``plan``
the cheapest one that meets an SLO."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer
from rich.console import Console
from rich.table import Table

from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.engine.cli.common import (
    ConfigOption,
    DecodeBuckets,
    MaxModelLen,
    MaxNumBatchedTokens,
    MaxNumSeqs,
    PrefillBuckets,
    fail,
    load_config,
)

if TYPE_CHECKING:
    from neuronfleet.engine.fleet.arrivals import Source
    from neuronfleet.engine.fleet.twin import TwinRun

#: Wide enough that the planner's table does not wrap in a log.
console = Console(highlight=False, width=200)
fleet_app = typer.Typer(help="The fleet twin: a service's replicas, router and autoscaler over virtual time.")

#: A workload of the prefix bench's conversations: ``conversations/chat``, ...
CONVERSATIONS = "conversations/"
RouterName = Literal["service", "picker", "picker-prefix"]
Shape = Literal["poisson", "step", "burst", "diurnal"]
#: The CPUs this process may use, at most 8: processes beyond that add more start-up than they save.
DEFAULT_WORKERS = min(len(os.sched_getaffinity(0)), 8)
WorkersOption = Annotated[
    int, typer.Option(min=1, help="Processes to simulate in (the replicas' engines; the planner's candidates).")
]


def load(
    workload: str, trace: Path | None, rate: float, duration_s: float, shape: Shape, cap: int, seed: int
) -> Source:
    """The requests: a trace file's, a prefix mix's conversations, or a named traffic at ``rate`` shaped by
    ``shape`` (a step doubles the rate for the middle third; a burst of 4x it for a tenth of every quarter; a day
    swings it by half over the run)."""
    from neuronfleet.engine.fleet import arrivals, workloads

    if trace is not None:
        return arrivals.read_trace(trace)
    mix = workload.removeprefix(CONVERSATIONS)
    if workload.startswith(CONVERSATIONS) and mix in workloads.PREFIX_MIXES:
        return workloads.PREFIX_MIXES[mix].clients_for(duration_s, f"{mix}-{seed}")
    if workload not in workloads.TRAFFIC:
        known = ", ".join([*workloads.TRAFFIC, *(CONVERSATIONS + name for name in workloads.PREFIX_MIXES)])
        fail(f"unknown workload {workload!r}; known: {known}, or --trace FILE")
    if shape == "poisson":
        times = arrivals.poisson_times(rate, duration_s, seed)
    elif shape == "step":
        times = arrivals.modulated_times(
            arrivals.step_rate(rate, 2.0, duration_s / 3, duration_s / 3), 2 * rate, duration_s, seed
        )
    elif shape == "burst":
        burst = arrivals.burst_rate(rate, 4.0, duration_s / 4, duration_s / 40)
        times = arrivals.modulated_times(burst, 4 * rate, duration_s, seed)
    else:
        times = arrivals.modulated_times(arrivals.diurnal_rate(rate, 0.5, duration_s), 1.5 * rate, duration_s, seed)
    return workloads.TRAFFIC[workload].requests(times, cap=cap, seed=seed)


def summary_table(title: str, figures: dict[str, Any]) -> Table:
    """One run's figures: TTFT, inter-token and end-to-end percentiles, the cost, and the run's own speed."""
    table = Table(title=title)
    for column in ("", "p50", "p90", "p99"):
        table.add_column(column, justify="right" if column else "left")
    for name, label in (("ttft", "TTFT"), ("itl", "inter-token"), ("e2e", "end to end")):
        # One-token answers have no inter-token gaps: "-", not nan.
        values = [figures[f"{name}_p{q}_s"] for q in (50, 90, 99)]
        table.add_row(label, *("-" if math.isnan(value) else f"{1000 * value:.0f} ms" for value in values))
    return table


def write_plot(run: TwinRun, path: Path) -> None:
    """The fleet's timeline as a PNG: replicas (ready, starting), waiting requests, KV use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [sample.at for sample in run.samples]
    figure, (replicas, waiting, kv) = plt.subplots(3, 1, sharex=True, figsize=(10, 7))
    replicas.step(times, [s.ready for s in run.samples], where="post", label="ready")
    replicas.step(times, [s.starting for s in run.samples], where="post", label="starting")
    replicas.set_ylabel("replicas")
    replicas.legend(loc="upper left")
    waiting.plot(times, [s.waiting for s in run.samples])
    waiting.set_ylabel("waiting requests")
    kv.plot(times, [s.kv_usage for s in run.samples])
    kv.set_ylabel("mean KV use")
    kv.set_xlabel("virtual seconds")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def write_json(run: TwinRun, path: Path) -> None:
    """Every request (arrival, TTFT, end to end, replica) and the fleet's timeline, with the summary."""
    requests = [
        {
            "id": served.request.req_id,
            "arrived_s": served.request.at,
            "prompt_tokens": len(served.request.prompt),
            "max_tokens": served.request.max_tokens,
            "replica": served.replica,
            "ttft_s": served.ttft_s + run.spec.host_path_s,
            "e2e_s": served.e2e_s + run.spec.host_path_s,
        }
        for served in run.measured()
    ]
    document = {
        "summary": run.summary(),
        "refused": [request.req_id for request in run.refused],
        "timeline": [asdict(sample) for sample in run.samples],
        "requests": requests,
    }
    path.write_text(json.dumps(document, indent=1))


def print_run(run: TwinRun, title: str) -> None:
    """A run's percentiles, its replicas' start time, what it answered and what it cost."""
    figures = run.summary()
    console.print(summary_table(title, figures))
    console.print(f"a new replica serves {run.spec.start_s:.0f} s after it is started")
    console.print(
        f"answered {figures['answered']}, refused {figures['refused']}; {figures['replica_hours']:.2f} replica-hours; "
        f"{figures['simulated_s']:.0f} virtual s in {figures['wall_s']:.1f} s of wall ({figures['steps']} steps)"
    )


@fleet_app.command("run")
def run_command(
    model: Annotated[str, typer.Option(help="Model shape (llama-3.1-8b, llama-3.1-70b, ...).")] = "llama-3.1-8b",
    instance_type: Annotated[str, typer.Option(help="The replicas' instance type.")] = "trn2.48xlarge",
    tensor_parallel_size: Annotated[int, typer.Option(help="NeuronCores per replica.")] = 8,
    config: ConfigOption = None,
    max_num_seqs: MaxNumSeqs = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    max_model_len: MaxModelLen = None,
    num_batched_tokens_buckets: PrefillBuckets = None,
    num_seqs_buckets: DecodeBuckets = None,
    replicas: Annotated[int, typer.Option(min=1, help="Replicas at the start.")] = 2,
    router: Annotated[RouterName, typer.Option(help="service, picker, or picker-prefix (locality weight 4).")] = (
        "picker"
    ),
    workload: Annotated[str, typer.Option(help="chat, rag, code, or the prefix bench's conversations/chat, ...")] = (
        "chat"
    ),
    trace: Annotated[Path | None, typer.Option(help="A JSON-lines trace instead of --workload.")] = None,
    rate: Annotated[float, typer.Option(min=0.001, help="Requests per second (mean).")] = 2.0,
    duration: Annotated[float, typer.Option(min=1, help="Virtual seconds of arrivals.")] = 120.0,
    shape: Annotated[
        Shape,
        typer.Option(help="poisson, step (2x mid-run), burst (4x), diurnal."),
    ] = "poisson",
    start_seconds: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="Seconds a new replica takes to serve. Default: a Neuron replica's, its weights from the Hub.",
            show_default=False,
        ),
    ] = None,
    autoscale: Annotated[str | None, typer.Option(help="MIN:MAX replicas, KEDA on the waiting queue.")] = None,
    prefill_backlog_seconds: Annotated[
        float | None,
        typer.Option(min=0.001, help="With --autoscale: also on seconds of prefill work queued per replica."),
    ] = None,
    warm_floor: Annotated[
        str | None,
        typer.Option(help="With --autoscale: a warm floor, STEP_PERCENT:TTFT_SECONDS (100:2 absorbs a doubling)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the arrivals and the routers' draws.")] = 0,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write every request and the timeline.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write the fleet's timeline as a PNG.")] = None,
    workers: WorkersOption = DEFAULT_WORKERS,
) -> None:
    """Serve a load on a simulated fleet: every replica the real scheduler on the calibrated clock."""
    engine = load_config(
        config, max_num_seqs, max_num_batched_tokens, max_model_len, num_batched_tokens_buckets, num_seqs_buckets
    )
    engine = engine.model_copy(update={"tensor_parallel_size": tensor_parallel_size})
    from neuronfleet.engine.fleet.planner import fleet_of

    try:
        spec, twin_router = fleet_of(
            engine,
            get_instance_type(instance_type),
            model,
            replicas,
            router,
            start_seconds,
            autoscale,
            seed,
            prefill_backlog_s=prefill_backlog_seconds,
            warm_floor=warm_floor,
        )
    except ValueError as error:
        fail(str(error))
    source = load(workload, trace, rate, duration, shape, spec.engine.max_model_len, seed)
    from neuronfleet.engine.fleet.twin import run

    with console.status("simulating") as status:
        result = run(
            spec, source, twin_router, progress=lambda now: status.update(f"simulating: {now:.0f} s"), workers=workers
        )
    print_run(result, f"{replicas} x {model} on {instance_type} (TP {tensor_parallel_size}), {router}")
    if json_path is not None:
        write_json(result, json_path)
    if plot is not None:
        write_plot(result, plot)


@fleet_app.command("plan")
def plan_command(
    model: Annotated[str, typer.Option(help="Model shape (llama-3.1-8b, llama-3.1-70b, ...).")] = "llama-3.1-8b",
    instance_types: Annotated[str, typer.Option(help="Comma-separated candidate instance types.")] = "trn2.48xlarge",
    workload: Annotated[str, typer.Option(help="chat, rag or code.")] = "chat",
    rate: Annotated[float, typer.Option(min=0.001, help="Requests per second the fleet must serve.")] = 20.0,
    ttft_p99: Annotated[float, typer.Option(help="SLO: TTFT p99, seconds.")] = 1.0,
    itl_p99: Annotated[float, typer.Option(help="SLO: inter-token latency p99, seconds.")] = 0.1,
    max_model_len: Annotated[int, typer.Option(help="The service's longest sequence.")] = 8192,
    model_uri: Annotated[str, typer.Option(help="spec.model.uri of the manifest written.")] = "hf://ORG/MODEL",
    name: Annotated[str, typer.Option(help="metadata.name of the manifest written.")] = "planned",
    manifest_path: Annotated[Path | None, typer.Option("--manifest", help="Write the winner's manifest.")] = None,
    workers: WorkersOption = DEFAULT_WORKERS,
) -> None:
    """Search tensor parallelism, buckets, max_num_seqs, the prefill cap and the replica count for the fewest
    instances that serve ``--rate`` within the SLO; print them ranked, write the winner as a manifest."""
    import yaml

    from neuronfleet.engine.fleet import planner

    try:
        instances = [get_instance_type(name.strip()) for name in instance_types.split(",")]
    except (KeyError, ValueError) as error:
        fail(str(error))
    slo = planner.SLO(ttft_p99, itl_p99)
    with console.status("planning") as status:
        plans = planner.plan(
            model, instances, workload, rate, slo, max_model_len=max_model_len, workers=workers,
            progress=lambda line: status.update(f"capacities: {line}"),
        )  # fmt: skip
    if not plans:
        fail(f"no configuration of {model} on {instance_types} meets TTFT p99 <= {ttft_p99} s, ITL p99 <= {itl_p99} s")
    table = Table(title=f"{model}, {workload} at {rate:g}/s, TTFT p99 <= {ttft_p99:g} s, ITL p99 <= {itl_p99:g} s")
    for column in ("configuration", "replica capacity", "replicas", "NeuronCores", "instances", "TTFT p99", "ITL p99"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for found in plans:
        figures = found.figures
        table.add_row(
            found.candidate.describe(),
            f"{found.capacity_rps:.2f}/s",
            str(found.replicas),
            str(found.cores),
            str(found.instances),
            f"{1000 * figures['ttft_p99_s']:.0f} ms +-{planner.P99_ERROR:.0%}",
            f"{1000 * figures['itl_p99_s']:.0f} ms +-{planner.P99_ERROR:.0%}",
        )
    console.print(table)
    if manifest_path is not None:
        manifest_path.write_text(yaml.safe_dump(planner.manifest(plans[0], model_uri, name), sort_keys=False))
        console.print(f"wrote {manifest_path}")
