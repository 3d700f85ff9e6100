"""What the demo shows: a service's way to Ready as four stages, from its status alone (pure)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Literal

from rich.console import Group, RenderableType
from rich.spinner import Spinner
from rich.table import Table
from rich.text import Text

from neuronfleet.devcluster.controlplane.status import condition, observed

Obj = dict[str, Any]
State = Literal["waiting", "active", "done", "failed"]

#: The stages in the order a service passes them.
STAGES = ("Validated", "Compiling", "Rolling out", "Ready")
#: Ready-condition reasons that stop the way to Ready until the spec changes.
FAILED_REASONS = frozenset({"InvalidBuckets", "InvalidSpec", "CompileFailed", "BlockedByFailedCompile"})


@dataclass(frozen=True)
class Stage:
    """One step on the way to Ready: where it stands and what is happening in it."""

    name: str
    state: State
    detail: str = ""


def _parse(value: object) -> datetime.datetime | None:
    if not isinstance(value, str):
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def compile_detail(artifact: Obj | None, now: datetime.datetime) -> str:
    """The compile's progress: buckets compiled, the Job's attempt, time since it started."""
    if artifact is None:
        return "creating the compiled artifact"
    status = artifact.get("status") or {}
    buckets = status.get("buckets") or []
    done = sum(1 for b in buckets if b.get("state") == "Compiled")
    parts = [f"{artifact['metadata']['name']}: {done}/{len(buckets)} buckets compiled"]
    if status.get("message") and status.get("phase") != "Ready":
        parts.append(str(status["message"]))
    started = _parse(status.get("startedAt"))
    if started is not None:
        parts.append(f"{max(0, int((now - started).total_seconds()))} s")
    return ", ".join(parts)


def stages(service: Obj | None, artifact: Obj | None, now: datetime.datetime) -> list[Stage]:
    """The four stages of ``service`` (with its artifact, for compile progress) at ``now``."""
    status = (service or {}).get("status") or {}
    validated, compiled, ready = (condition(service, t) for t in ("Validated", "ArtifactReady", "Ready"))
    if not validated or not observed(service):
        return [Stage("Validated", "active", "waiting for the operator"), *(Stage(n, "waiting") for n in STAGES[1:])]
    if validated.get("status") != "True":
        return [Stage("Validated", "failed", validated.get("message", "")), *(Stage(n, "waiting") for n in STAGES[1:])]
    result = [Stage("Validated", "done", "buckets pass the engine's rules, at admission and in the operator")]
    if compiled.get("status") == "True":
        result.append(Stage("Compiling", "done", compile_detail(artifact, now)))
    elif compiled.get("reason") == "CompileFailed":
        result.append(Stage("Compiling", "failed", compiled.get("message", "")))
        return result + [Stage(n, "waiting") for n in STAGES[2:]]
    else:
        result.append(Stage("Compiling", "active", compile_detail(artifact, now)))
        return result + [Stage(n, "waiting") for n in STAGES[2:]]
    replicas = (
        f"{status.get('readyReplicas', 0)}/{service_replicas(service)} replicas ready, "
        f"{status.get('updatedReplicas', 0)} at the new revision"
    )
    if ready.get("status") == "True":
        return [*result, Stage("Rolling out", "done", replicas), Stage("Ready", "done", ready.get("message", ""))]
    state: State = "failed" if ready.get("reason") in FAILED_REASONS else "active"
    detail = replicas if ready.get("reason") == "RollingOut" else f"{ready.get('reason')}: {ready.get('message', '')}"
    return [*result, Stage("Rolling out", state, detail), Stage("Ready", "waiting")]


def service_replicas(service: Obj | None) -> int:
    """The replicas the spec asks for."""
    return int(((service or {}).get("spec") or {}).get("replicas", 1))


def headline(current: list[Stage]) -> str:
    """The stage in progress (or the last one reached), for one-line progress reports."""
    for stage in current:
        if stage.state in ("active", "failed"):
            return stage.name
    return current[-1].name if current[-1].state == "done" else current[0].name


_MARKS = {"done": "[green]✓[/]", "failed": "[red]✗[/]", "waiting": "[dim]·[/]"}


def render(title: str, current: list[Stage], events: list[str]) -> RenderableType:
    """The live view: a row per stage (a spinner on the active one) and the latest events."""
    table = Table.grid(padding=(0, 1))
    table.add_column(width=2)
    table.add_column(min_width=12)
    table.add_column()
    for stage in current:
        mark: RenderableType = (
            Spinner("dots", style="cyan") if stage.state == "active" else Text.from_markup(_MARKS[stage.state])
        )
        style = "bold" if stage.state in ("active", "failed") else ("dim" if stage.state == "waiting" else "")
        table.add_row(mark, Text(stage.name, style=style), Text(stage.detail, style="dim" if not style else ""))
    parts: list[RenderableType] = [Text(title, style="bold"), table]
    if events:
        parts.append(Text("events (kubectl describe):", style="dim"))
        parts.extend(Text(f"  {line}", style="dim") for line in events)
    return Group(*parts)


def event_line(event: Obj) -> str:
    """An event as ``kubectl describe`` lists it: type, reason, object, message."""
    involved = event.get("involvedObject") or {}
    return (
        f"{event.get('type', '')} {event.get('reason', '')} {involved.get('kind', '')}/{involved.get('name', '')}: "
        + str(event.get("message", ""))
    )
