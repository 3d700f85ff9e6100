"""``neuronfleet-dev load`` run from inside the real node's network namespace, for as long as a test needs.

A Service's ClusterIP exists only in the node's network namespace (kube-proxy's rules are there), so the
load tool runs there, as a client on the node would. A test cannot know up front how long a rollout
takes: the load is planned for far longer and stopped (SIGTERM) when the test is done; the tool then
waits for every request it sent and reports each one.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.connections import ConnectionLog, match_requests
from neuronfleet.devcluster.demo.load import DROPPED
from neuronfleet.devcluster.process.managed import SCRIPTS
from neuronfleet.devcluster.process.waiting import wait_for

#: Longer than any test loads for: the test stops the load, this only bounds a test that forgets to.
PLANNED_S = 1800


@dataclass(frozen=True)
class Answer:
    """One request of the run: when it was sent (Unix seconds), how long it took, how it ended, by whom."""

    sent_at: float
    latency_s: float
    result: str
    header: str | None
    #: The other headers the load recorded (by the name it was given), as far as the response carried them.
    recorded: Mapping[str, str] = field(default_factory=dict)
    #: A 2xx answer's completion tokens, from its body.
    tokens: int | None = None
    #: Another answer's own words (its body's error message).
    error: str | None = None
    #: The endpoint (pod IP) the request's connection reached, from the node's connection tracking, where the load
    #: tracked it (:mod:`harness.connections`); None where it did not, or found no connection.
    server: str | None = None

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.result.isdigit() and 200 <= int(self.result) < 300

    @property
    def done_at(self) -> float:
        """When the answer (or the failure) came."""
        return self.sent_at + self.latency_s


@dataclass(frozen=True)
class LoadResult:
    """What the load tool reported: its summary, and every request it sent in order."""

    summary: dict[str, Any]
    answers: list[Answer]

    @property
    def failed(self) -> dict[str, int]:
        """Requests that did not succeed, by status or kind of failure (dropped ones included)."""
        failed: dict[str, int] = self.summary["failed"]
        return failed

    def sent_between(self, start: float, end: float = float("inf")) -> list[Answer]:
        """The requests sent within ``[start, end)`` (Unix seconds)."""
        return [a for a in self.answers if start <= a.sent_at < end]

    def in_flight_at(self, moment: float) -> list[Answer]:
        """The requests sent before ``moment`` and answered after it."""
        return [a for a in self.answers if a.sent_at <= moment < a.done_at]

    def line(self) -> str:
        """The figures a note quotes: sent, succeeded, failed, latency."""
        s = self.summary
        return (
            f"sent {s['sent']}, succeeded {s['succeeded']}, failed {s['failed'] or 0} in {s['elapsed_s']:.0f} s "
            f"at {s['rate']:g}/s; latency p50 {s['latency_s']['p50']} s, p99 {s['latency_s']['p99']} s"
        )


class NodeLoad:
    """The load tool sending completions to ``url`` from network namespace ``netns`` until :meth:`stop`."""

    def __init__(
        self,
        netns: str,
        url: str,
        workdir: Path,
        *,
        rate: float,
        max_tokens: int,
        header: str,
        model: str,
        record: Sequence[str] = (),
        prompt: str | None = None,
        distinct_prompts: bool = False,
        keep_alive: bool = True,
        poisson_seed: int | None = None,
        track: tuple[str, int] | None = None,
    ) -> None:
        """``track``: the Service's (ClusterIP, port), to learn from the node's connection tracking which endpoint
        each request's connection reached (a connection per request: ``keep_alive`` False)."""
        assert track is None or not keep_alive, "a kept-alive connection carries many requests"
        self.outcomes = workdir / "outcomes.jsonl"
        self.argv = [
            "ip",
            "netns",
            "exec",
            netns,
            str(SCRIPTS / "neuronfleet-dev"),
            "load",
            url,
            f"--rate={rate}",
            f"--duration={PLANNED_S}",
            f"--max-tokens={max_tokens}",
            # Every answer's body is checked: one with fewer tokens than asked counts as failed.
            "--exact-tokens",
            "--timeout=60",
            f"--header={header}",
            f"--model={model}",
            *(f"--record-header={name}" for name in record),
            *([f"--prompt={prompt}"] if prompt is not None else []),
            *(["--distinct-prompts"] if distinct_prompts else []),
            *([] if keep_alive else ["--no-keep-alive"]),
            *([] if poisson_seed is None else ["--poisson", f"--seed={poisson_seed}"]),
            f"--outcomes={self.outcomes}",
            "--json",
        ]
        self.log = workdir / "load.log"
        self.connections = None if track is None else ConnectionLog(netns, *track, workdir / "connections.log")
        self.process: subprocess.Popen[str] | None = None
        self.result: LoadResult | None = None

    def start(self) -> None:
        """Start sending; return once the first answer came, so what the test does next happens under load."""
        if self.connections is not None:
            self.connections.start()
        with self.log.open("w") as log:
            self.process = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=log, text=True)
        process = self.process
        wait_for(
            lambda: process.poll() is None and self.outcomes.is_file() and self.outcomes.stat().st_size > 0,
            timeout=120,
            what="the load's first answer",
            show=lambda _: (process.poll(), self.log.read_text()[-2000:]),
        )

    def answered_so_far(self) -> list[dict[str, Any]]:
        """The outcomes written so far (the tool writes each as its request ends), while it runs."""
        text = self.outcomes.read_text() if self.outcomes.is_file() else ""
        # Only whole lines: the last may be half written.
        return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]

    def stop(self) -> LoadResult:
        """Stop sending, wait for every answer, and read the report."""
        assert self.process is not None, "the load was never started"
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            stdout, _ = self.process.communicate(timeout=120)
        finally:
            self.process.kill()
        summary = json.loads(stdout) if stdout.strip() else {}
        assert summary, f"the load tool reported nothing (exit {self.process.returncode}): {self.log.read_text()}"
        started = float(summary["started_at"])
        outcomes = sorted(map(json.loads, self.outcomes.read_text().splitlines()), key=lambda o: int(o["index"]))
        outcomes = [o for o in outcomes if o["result"] != DROPPED]
        servers: list[str | None] = [None] * len(outcomes)
        if self.connections is not None:
            sent = [(started + o["sent_at_s"], o["client_port"]) for o in outcomes]
            servers = [None if c is None else c.server for c in match_requests(sent, self.connections.stop())]
        answers = [
            Answer(
                started + o["sent_at_s"],
                o["latency_s"],
                o["result"],
                o["header"],
                o["recorded"],
                o["tokens"],
                o["error"],
                server,
            )
            for o, server in zip(outcomes, servers, strict=True)
        ]
        self.result = LoadResult(summary, answers)
        return self.result

    def __enter__(self) -> NodeLoad:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.result is None:
            self.stop()
        if self.connections is not None:
            self.connections.close()
