"""``neuronfleet-dev``: developer tools; ``cluster`` starts and stops a local control plane."""

from __future__ import annotations

from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from neuronfleet.devcluster.cluster import ClusterError, LocalCluster, reap_orphans
from neuronfleet.devcluster.processes import is_alive
from neuronfleet.devcluster.state import state_file
from neuronfleet.devcluster.tools import ToolsMissingError

#: Exit status for input that names nothing usable.
EXIT_INVALID = 2
#: Exit status when a cluster could not be started or is not healthy.
EXIT_FAILED = 1

app = typer.Typer(help="neuronfleet developer tools.", no_args_is_help=True, pretty_exceptions_enable=False)
cluster_app = typer.Typer(help="A local Kubernetes control plane with fake Neuron nodes (KWOK).", no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

Name = Annotated[str, typer.Option("--name", "-n", help="Which cluster (several may run side by side).")]


def fail(message: str, code: int = EXIT_INVALID) -> NoReturn:
    """Print ``error: message`` to stderr and exit."""
    err.print(f"error: {message}", markup=False)
    raise typer.Exit(code)


def _check_name(name: str) -> None:
    try:
        state_file(name)
    except ValueError as error:
        fail(str(error))


def _find(name: str) -> LocalCluster:
    _check_name(name)
    cluster = LocalCluster.find(name)
    if cluster is None:
        fail(f"no cluster named {name!r} (start one with `neuronfleet-dev cluster up --name {name}`)")
    return cluster


@cluster_app.command()
def up(
    name: Name = "dev",
    owner_pid: Annotated[
        int | None,
        typer.Option(help="Tie the cluster to this process: `cluster reap` stops it once the process is gone."),
    ] = None,
) -> None:
    """Start etcd, the API server, controller manager, scheduler and KWOK with fake trn2/inf2/CPU nodes."""
    _check_name(name)
    if owner_pid is not None and not is_alive(owner_pid):
        fail(f"--owner-pid {owner_pid} is not a running process")
    err.print(f"starting cluster {name!r} ...", markup=False)
    try:
        cluster = LocalCluster.start(name, owner_pid=owner_pid)
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
