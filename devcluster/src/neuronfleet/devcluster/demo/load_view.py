"""``neuronfleet-dev load`` on a terminal: a run with its progress shown and its outcomes written as they end,
and its summary as a table."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from neuronfleet.devcluster.demo.load import LoadPlan, LoadReport, Outcome, run_load


def run_with_progress(plan: LoadPlan, console: Console, outcomes: Path | None = None) -> LoadReport:
    """Send ``plan``, a progress bar on ``console``; each outcome written to ``outcomes`` as it ends.

    Ctrl-C or SIGTERM stops sending early; the requests already sent are still waited for and counted.
    """
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress, contextlib.ExitStack() as files:
        answered = progress.add_task(f"{plan.rate:g}/s to {plan.url}", total=plan.requests)
        # Written as each request ends, so a reader can follow the run (and a killed run leaves its record).
        record = None if outcomes is None else files.enter_context(outcomes.open("w", buffering=1))

        def answered_one(outcome: Outcome) -> None:
            progress.advance(answered)
            if record is not None:
                record.write(f"{outcome.to_json()}\n")

        async def send() -> LoadReport:
            stop = asyncio.Event()
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
            return await run_load(plan, answered_one, stop)

        return asyncio.run(send())


def summary_table(report: LoadReport) -> Table:
    """Sent, succeeded, failed by status, latency percentiles, and the successes by the plan's header."""
    table = Table(show_header=False, box=None)
    summary = report.summary()
    stopped = " (stopped early)" if report.stopped_early else ""
    table.add_row("sent", f"{summary['sent']} of {report.plan.requests} in {summary['elapsed_s']:.1f} s{stopped}")
    table.add_row("succeeded", str(summary["succeeded"]))
    for result, count in summary["failed"].items():
        table.add_row(f"failed: {result}", str(count))
    latency = "  ".join(
        f"{'max' if q == 'p100' else q} {'-' if math.isnan(value) else f'{value * 1000:.0f} ms'}"
        for q, value in summary["latency_s"].items()
    )
    table.add_row("latency", latency)
    for value, count in sorted(report.headers().items(), key=lambda item: str(item[0])):
        table.add_row(f"{report.plan.record_header}: {value}", str(count))
    return table
