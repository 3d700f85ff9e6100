"""Where a running cluster's state lives, so any process can find, inspect and stop it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel

from neuronfleet.devcluster.process.managed import ProcessRecord, is_alive

#: Overrides where cluster state files live.
STATE_ENV = "NEURONFLEET_CLUSTERS"

#: Cluster names become file and directory names.
NAME_PATTERN = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")


class ClusterState(BaseModel):
    """What another process needs to reach, inspect and stop a cluster."""

    name: str
    workdir: Path
    server: str
    ports: dict[str, int]
    #: The binaries it was started with (kubectl and helm for it come from here too).
    tools: Path
    owner_pid: int | None = None
    #: The owner's start time (psutil's ``create_time``), so a recycled pid is not taken for it.
    owner_started: float | None = None
    processes: list[ProcessRecord] = []
    #: The real node's network namespace (``cluster up --real-node``), deleted at teardown.
    netns: str | None = None

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (group ``system:masters``)."""
        return self.workdir / "admin.kubeconfig"

    def owner_alive(self) -> bool:
        """Whether the owning process still runs (a cluster without an owner lives until stopped)."""
        return self.owner_pid is None or is_alive(self.owner_pid, self.owner_started)


def state_root() -> Path:
    """The directory holding one ``<name>.json`` per running cluster."""
    default = Path.home() / ".cache" / "neuronfleet" / "clusters"
    return Path(os.environ.get(STATE_ENV, default))


def state_file(name: str) -> Path:
    """The state file of the cluster named ``name``."""
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"invalid cluster name {name!r}: use 1-40 lowercase letters, digits and dashes")
    return state_root() / f"{name}.json"


def save(state: ClusterState) -> None:
    """Write ``state`` atomically."""
    path = state_file(state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole, then renamed: a reader (or a reaper after a crash) never sees half a file.
    temporary = path.with_suffix(".tmp")
    temporary.write_text(state.model_dump_json(indent=2))
    temporary.replace(path)


def load(path: Path) -> ClusterState | None:
    """The state in ``path``, or None when it is missing or unreadable."""
    try:
        return ClusterState.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def list_states() -> list[ClusterState]:
    """Every cluster with a state file, running or not."""
    root = state_root()
    found = (load(path) for path in sorted(root.glob("*.json"))) if root.is_dir() else iter(())
    return [state for state in found if state is not None]
