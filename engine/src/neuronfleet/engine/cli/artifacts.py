"""How ``compile`` and ``serve`` show artifact provisioning (``neuronfleet.engine.artifacts.provision``).

Progress goes to stderr: a bar while graphs compile, one line per file copied to
or from an ``s3://`` store (which reads the same in a pod's log). Failures are
one ``error:`` line on stderr and an exit status.
"""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from neuronfleet.engine.artifacts.compiler import CompileError
from neuronfleet.engine.artifacts.provision import CompileOutcome
from neuronfleet.engine.artifacts.store import ArtifactError, ArtifactFile, BucketEntry, StoreError
from neuronfleet.engine.cli.common import EXIT_INVALID, err

#: Exit status when the compiled artifact to serve is missing, incomplete or of an outdated manifest schema.
EXIT_NO_ARTIFACT = 3


class StderrProgress:
    """Provisioning's progress on stderr (a :class:`neuronfleet.engine.artifacts.provision.Progress`)."""

    def __init__(self) -> None:
        #: The bar of the compile under way, and its one task.
        self._bar: tuple[Progress, TaskID] | None = None

    def compile_started(self, artifact_hash: str, graphs: int) -> None:
        """Show the compile's progress bar."""
        bar = Progress(
            TextColumn("compiling artifact {task.fields[artifact]}: {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        )
        bar.start()
        self._bar = (bar, bar.add_task("", total=graphs, artifact=artifact_hash))

    def graph_compiled(self, entry: BucketEntry, done: int, total: int) -> None:
        """Advance the bar, naming the graph just compiled."""
        if self._bar is not None:
            bar, task = self._bar
            bar.update(task, completed=done, total=total, description=f"{entry.kind} {entry.size}")

    def compile_stopped(self) -> None:
        """Leave the bar as it ended, before any line that follows."""
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None

    def file_uploaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        """One line per file sent to the store."""
        self._file_line("uploaded", entry, done, total, skipped)

    def file_downloaded(self, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        """One line per file copied from the store."""
        self._file_line("downloaded", entry, done, total, skipped)

    def evicted(self, artifact_hash: str) -> None:
        """One line per artifact evicted from the node's cache."""
        err.print(f"evicted artifact {artifact_hash} from the node cache, least recently used", markup=False)

    @staticmethod
    def _file_line(verb: str, entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        what = "already there" if skipped else verb
        err.print(f"{what} {entry.path} ({entry.size:,} bytes) [{done}/{total}]", markup=False)


def outcome_line(outcome: CompileOutcome) -> str:
    """The line that says what a compile did."""
    if outcome.already_complete:
        return f"artifact {outcome.artifact_hash} already complete at {outcome.where}: nothing to compile"
    done = f"compiled {outcome.compiled} of {outcome.graphs} graphs"
    if outcome.uploaded is not None:
        sent, files = outcome.uploaded
        done += f", uploaded {sent} of {files} files"
    return f"{done}: artifact {outcome.artifact_hash} complete at {outcome.where}"


def refuse_to_serve(error: ArtifactError) -> NoReturn:
    """One line, then exit 2 for a store to mend or a compile that failed, 3 for an artifact to compile first."""
    err.print(f"error: {error}", markup=False)
    raise typer.Exit(EXIT_INVALID if isinstance(error, StoreError | CompileError) else EXIT_NO_ARTIFACT)
