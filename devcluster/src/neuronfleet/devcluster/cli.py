"""``neuronfleet-dev``: developer tools; ``cluster`` starts and stops a local control plane."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from neuronfleet.devcluster.cluster.local import ClusterError, LocalCluster, reap_orphans
from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.process.managed import is_alive
from neuronfleet.devcluster.process.state import state_file
from neuronfleet.devcluster.process.tools import ToolsMissingError

#: Exit status for input that names nothing usable.
EXIT_INVALID = 2
#: Exit status when a cluster could not be started or is not healthy.
EXIT_FAILED = 1

# Help is shown as written, never read as rich markup (where `[/X]` is a closing tag that crashes `--help`).
# The top-level app's mode is the one typer uses for every subcommand.
app = typer.Typer(
    help="neuronfleet developer tools.", no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None
)
cluster_app = typer.Typer(help="A local Kubernetes control plane with fake Neuron nodes (KWOK).", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")
images_app = typer.Typer(help="The Dockerfile's images, built with podman into OCI archives.", no_args_is_help=True)
app.add_typer(images_app, name="images")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_INVALID) -> NoReturn:
    """Print ``error: message`` to stderr and exit."""
    err.print(f"error: {message}", markup=False)
    raise typer.Exit(code)


def _valid_name(name: str) -> str:
    # A name becomes a file name: refused in one line, as every other input error is.
    try:
        state_file(name)
    except ValueError as error:
        fail(str(error))
    return name


def _running_pid(pid: int | None) -> int | None:
    if pid is not None and not is_alive(pid):
        fail(f"--owner-pid {pid} is not a running process")
    return pid


Name = Annotated[
    str, typer.Option("--name", "-n", help="Which cluster (several may run side by side).", callback=_valid_name)
]


Poisson = Annotated[
    bool, typer.Option("--poisson", help="Arrivals as a Poisson process of --rate (random gaps), not evenly spaced.")
]
Seed = Annotated[int, typer.Option(help="The seed of --poisson's gaps: the same seed, the same arrivals.")]


def _find(name: str) -> LocalCluster:
    cluster = LocalCluster.find(name)
    if cluster is None:
        fail(f"no cluster named {name!r} (start one with `neuronfleet-dev cluster up --name {name}`)")
    return cluster


@cluster_app.command()
def up(
    name: Name = "dev",
    owner_pid: Annotated[
        int | None,
        typer.Option(
            help="Tie the cluster to this process: `cluster reap` stops it once the process is gone.",
            min=1,
            callback=_running_pid,
        ),
    ] = None,
    real_node: Annotated[
        bool,
        typer.Option(
            "--real-node",
            help="Add node real-0 (kubelet, containerd, runc, kube-proxy; root only) that runs real containers.",
        ),
    ] = False,
) -> None:
    """Start etcd, the API server, controller manager, scheduler and KWOK with fake trn2/inf2/CPU nodes."""
    err.print(f"starting cluster {name!r} ...", markup=False)
    try:
        cluster = LocalCluster.start(name, owner_pid=owner_pid, real_node=real_node)
    except ToolsMissingError as error:
        fail(str(error))
    except ClusterError as error:
        fail(str(error), EXIT_FAILED)
    out.print(f"cluster {name!r} is up at {cluster.server}", markup=False)
    out.print(f"export KUBECONFIG={cluster.kubeconfig}", markup=False)


@cluster_app.command()
def down(name: Name = "dev") -> None:
    """Stop the cluster's processes (by recorded pid) and delete its files."""
    cluster = _find(name)
    try:
        cluster.stop()
    except ClusterError as error:
        fail(str(error), EXIT_FAILED)
    out.print(f"cluster {name!r} stopped", markup=False)


@cluster_app.command()
def status(name: Name = "dev") -> None:
    """Show each component's state; exit 1 unless all run and the API server is ready."""
    cluster = _find(name)
    health = cluster.components()
    table = Table("component", "state", title=f"cluster {name!r} at {cluster.server}")
    for component, ok in health.items():
        table.add_row(component, "[green]running[/]" if ok else "[red]down[/]")
    out.print(table)
    out.print(f"kubeconfig: {cluster.kubeconfig}", markup=False)
    if not all(health.values()):
        raise typer.Exit(EXIT_FAILED)


@cluster_app.command()
def kubeconfig(name: Name = "dev") -> None:
    """Print the path of the cluster's admin kubeconfig."""
    out.print(str(_find(name).kubeconfig), markup=False)


@cluster_app.command()
def reap() -> None:
    """Stop clusters whose owner process is gone (e.g. after a crashed test run)."""
    try:
        names = reap_orphans()
    except ClusterError as error:
        fail(str(error), EXIT_FAILED)
    out.print(f"reaped: {', '.join(names)}" if names else "nothing to reap", markup=False)


@app.command()
def demo(
    example: Annotated[
        Path | None,
        typer.Option(
            help="The `device: sim` NeuronInferenceService to apply. Default: examples/tiny-sim.yaml.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ] = None,
    name: Name = "demo",
    exit_when_ready: Annotated[
        bool, typer.Option("--exit-when-ready", help="Tear down as soon as the service is Ready and has answered.")
    ] = False,
) -> None:
    """A local control plane with a real node, the Helm chart's operator in a pod there, a simulated service
    rolled out to Ready and a completion through its Service."""
    # Imported here: `cluster` commands stay quick and need neither the operator nor rich's live view.
    from neuronfleet.devcluster.demo.run import DEFAULT_EXAMPLE, Demo, Options, checkout

    try:
        chosen = example if example is not None else checkout() / DEFAULT_EXAMPLE
        Demo(out, Options(example=chosen, name=name, exit_when_ready=exit_when_ready)).run()
    except ToolsMissingError as error:
        fail(str(error))
    except RigError as error:
        # Whatever part of the rig failed (an image, the cluster, the demo's own checks), its message says.
        fail(str(error), EXIT_FAILED)
    except KeyboardInterrupt:
        err.print("interrupted: torn down", markup=False)
        raise typer.Exit(130) from None


@app.command()
def load(
    url: Annotated[str, typer.Argument(help="The endpoint, e.g. http://localhost:8000/v1/completions.")],
    rate: Annotated[float, typer.Option(min=0.01, help="Requests per second, sent on schedule (open loop).")] = 2.0,
    duration: Annotated[float, typer.Option(min=0.1, help="Seconds to send for.")] = 30.0,
    model: Annotated[str, typer.Option(help="The model each completion asks for.")] = "neuronfleet/tiny",
    prompt: Annotated[str, typer.Option(help="The prompt of each completion.")] = "The fleet",
    distinct_prompts: Annotated[
        bool,
        typer.Option(
            "--distinct-prompts",
            help="Start each prompt with a mark of its own, so the engine's prefix cache never serves one unprefilled.",
        ),
    ] = False,
    keep_alive: Annotated[
        bool,
        typer.Option(
            "--keep-alive/--no-keep-alive",
            help="Reuse connections; without, each request opens its own (a Service then spreads every request).",
        ),
    ] = True,
    poisson: Poisson = False,
    seed: Seed = 0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens each completion asks for.")] = 16,
    exact_tokens: Annotated[
        bool,
        typer.Option(
            "--exact-tokens",
            help="Ask for exactly --max-tokens (ignore_eos) and count an answer with fewer as failed (short).",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds before a request counts as failed.")] = 60.0,
    max_in_flight: Annotated[
        int, typer.Option("--max-in-flight", min=1, help="Requests waiting at once; beyond it they are dropped.")
    ] = 256,
    header: Annotated[
        str | None, typer.Option("--header", help="Count the successful responses by this response header.")
    ] = None,
    record_header: Annotated[
        list[str] | None,
        typer.Option("--record-header", help="Also record this response header in --outcomes (repeatable)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as one line of JSON.")] = False,
    outcomes: Annotated[
        Path | None,
        typer.Option("--outcomes", help="Write each request's outcome here as it ends, one JSON line each."),
    ] = None,
) -> None:
    """Send completions at a fixed rate for a while; print sent, succeeded, failed by status, latency.

    Ctrl-C or SIGTERM stops sending early; the requests already sent are still waited for and counted.
    Exits 1 when any request failed or was dropped.
    """
    from neuronfleet.devcluster.demo.load import LoadPlan
    from neuronfleet.devcluster.demo.load_view import run_with_progress, summary_table

    try:
        plan = LoadPlan(
            url,
            rate,
            duration,
            {"model": model, "prompt": prompt, "max_tokens": max_tokens},
            timeout,
            max_in_flight,
            header,
            tuple(record_header or ()),
            distinct_prompts=distinct_prompts,
            keep_alive=keep_alive,
            exact_tokens=exact_tokens,
            poisson=poisson,
            seed=seed,
        )
    except ValueError as error:
        fail(str(error))
    report = run_with_progress(plan, err, outcomes)
    if as_json:
        out.print(report.to_json(), markup=False)
    else:
        out.print(summary_table(report))
    if report.failures:
        raise typer.Exit(EXIT_FAILED)


@images_app.command("build")
def images_build(
    target: Annotated[
        list[str] | None, typer.Option("--target", "-t", help="operator or engine (repeatable). Default: both.")
    ] = None,
) -> None:
    """Build each image whose inputs changed; print each one's OCI layout reference (``oci:<dir>:<name>``)."""
    from neuronfleet.devcluster.images.dockerfile import build
    from neuronfleet.devcluster.images.inputs import TARGETS, ImageError

    chosen = target or list(TARGETS)
    unknown = sorted(set(chosen) - set(TARGETS))
    if unknown:
        fail(f"unknown target {', '.join(unknown)}: choose from {', '.join(TARGETS)}")
    for name in TARGETS:
        if name in chosen:
            try:
                image = build(name)
                out.print(f"oci:{image.source}:{image.name}", markup=False)
            except ImageError as error:
                fail(str(error), EXIT_FAILED)
