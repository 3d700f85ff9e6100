"""The open-loop load generator against a real HTTP server on loopback: counts, failures, schedule."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import re
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from neuronfleet.devcluster.demo.load import (
    DROPPED,
    REFUSED,
    SHORT,
    TIMEOUT,
    LoadPlan,
    LoadReport,
    percentile,
    run_load,
)
from neuronfleet.devcluster.process.managed import SCRIPTS, free_ports

BODY = {"model": "m", "prompt": "p", "max_tokens": 1}


class Handler(BaseHTTPRequestHandler):
    """Answers POSTs as the body asks (``{"status": 503}``, ``{"delay": 0.5}``, ``{"answer_tokens": 2}``) with its
    tokens; records each body."""

    server: Server

    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(asked)
        time.sleep(asked.get("delay", 0))
        status = asked.get("status", 200)
        tokens = asked.get("answer_tokens", asked["max_tokens"])
        answer = {"usage": {"completion_tokens": tokens}} if status < 400 else {"error": {"message": f"no: {status}"}}
        body = json.dumps(answer).encode()
        # A client that timed out has hung up: nothing to answer.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("X-Served-By", "replica-a")
            self.send_header("X-Zone", "zone-1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


class Server(ThreadingHTTPServer):
    """A threaded HTTP server that keeps the bodies it was sent."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.bodies: list[dict[str, object]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/completions"


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.shutdown()
        running.server_close()


def load(plan: LoadPlan) -> LoadReport:
    return asyncio.run(run_load(plan))


def rows(table: str) -> dict[str, str]:
    """The printed summary's rows: label -> value (the columns are padded with spaces)."""
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in table.splitlines() if line.strip())


def test_percentile_is_nearest_rank() -> None:
    values = [0.4, 0.1, 0.3, 0.2]
    assert [percentile(values, q) for q in (0, 25, 50, 75, 100)] == [0.1, 0.1, 0.2, 0.3, 0.4]
    assert math.isnan(percentile([], 50))


def test_exact_tokens_asks_for_all_of_them_and_counts_a_short_answer_as_failed(server: Server) -> None:
    asked = {**BODY, "max_tokens": 3}
    full = load(LoadPlan(server.url, rate=20, duration_s=0.1, body=asked, exact_tokens=True))
    assert (full.succeeded, full.failures) == (2, {})
    assert all(body["ignore_eos"] is True for body in server.bodies)
    cut = load(LoadPlan(server.url, rate=20, duration_s=0.1, body={**asked, "answer_tokens": 2}, exact_tokens=True))
    assert (cut.succeeded, cut.failures) == (0, {SHORT: 2})
    assert [o.tokens for o in cut.outcomes] == [2, 2]
    # Without it, any count is an answer.
    assert load(LoadPlan(server.url, rate=20, duration_s=0.1, body={**asked, "answer_tokens": 2})).succeeded == 2


def test_plan_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        LoadPlan("http://x", rate=0, duration_s=1, body=BODY)
    assert LoadPlan("http://x", rate=2.5, duration_s=3, body=BODY).requests == 8


def test_poisson_arrivals_keep_the_rate_come_from_their_seed_and_are_not_evenly_spaced() -> None:
    plan = LoadPlan("http://x", rate=4, duration_s=500, body=BODY, poisson=True, seed=7)
    due = plan.schedule()
    assert due == LoadPlan("http://x", rate=4, duration_s=500, body=BODY, poisson=True, seed=7).schedule()
    assert due != LoadPlan("http://x", rate=4, duration_s=500, body=BODY, poisson=True, seed=8).schedule()
    assert due == sorted(due)
    assert due[0] == 0
    assert due[-1] < 500
    assert plan.requests == len(due)
    # About 2,000 arrivals (Poisson: within 5%); gaps exponential, so their spread is their mean, not 0.
    assert 1900 < len(due) < 2100
    gaps = [b - a for a, b in itertools.pairwise(due)]
    assert 0.9 < statistics.stdev(gaps) / statistics.mean(gaps) < 1.1
    assert min(gaps) < 0.01 < 1.0 < max(gaps)


def test_every_request_is_sent_and_counted_by_status(server: Server) -> None:
    ok = load(
        LoadPlan(
            server.url, rate=20, duration_s=0.5, body=BODY, record_header="X-Served-By", also_record=("X-Zone", "X-No")
        )
    )
    refused = load(LoadPlan(server.url, rate=20, duration_s=0.25, body={**BODY, "status": 503}))
    assert (ok.sent, ok.succeeded, ok.failures) == (10, 10, {})
    assert ok.headers() == {"replica-a": 10}
    # The other headers asked for, as far as the response carried them, and each 2xx answer's tokens.
    assert {(o.recorded["X-Zone"], len(o.recorded), o.tokens) for o in ok.outcomes} == {("zone-1", 1, 1)}
    assert {o.tokens for o in refused.outcomes} == {None}
    # A failed answer's own words are kept; a 2xx answer has none.
    assert {o.error for o in refused.outcomes} == {"no: 503"}
    assert {o.error for o in ok.outcomes} == {None}
    assert [o.index for o in ok.outcomes] == list(range(10))
    assert (refused.sent, refused.succeeded, refused.failures) == (5, 0, {"503": 5})
    assert len(server.bodies) == 15
    assert server.bodies[0] == BODY


def test_distinct_prompts_share_no_prefix_across_requests_or_runs(server: Server) -> None:
    body = {**BODY, "prompt": "bada bade badi"}
    for _ in range(2):
        assert load(LoadPlan(server.url, rate=20, duration_s=0.25, body=body, distinct_prompts=True)).succeeded == 5
    prompts = [str(sent["prompt"]).split() for sent in server.bodies]
    # The prompt asked for follows a mark of each request's own, made of the prompt's own words (so the
    # simulated tokenizer, which turns unknown words into one <unk>, tells the marks apart too).
    marks = [words[:-3] for words in prompts]
    assert {tuple(words[-3:]) for words in prompts} == {("bada", "bade", "badi")}
    assert {word for mark in marks for word in mark} <= {"bada", "bade", "badi"}
    assert len({tuple(mark) for mark in marks}) == 10
    # Their first 16 words differ for each pair: no shared prefix block of 16 tokens.
    assert len({tuple(mark[:16]) for mark in marks}) == 10
    with pytest.raises(ValueError, match="two different"):
        LoadPlan(server.url, rate=1, duration_s=1, body={**BODY, "prompt": "fleet fleet"}, distinct_prompts=True)


def test_the_command_marks_each_prompt_when_asked(server: Server) -> None:
    command = [str(SCRIPTS / "neuronfleet-dev"), "load", server.url, "--rate", "10", "--duration", "0.2"]
    done = subprocess.run([*command, "--distinct-prompts"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    first, second = (str(body["prompt"]) for body in server.bodies)
    assert first != second
    assert first.endswith(" The fleet")
    assert second.endswith(" The fleet")


def test_without_keep_alive_each_request_opens_a_connection_of_its_own(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    connections: list[tuple[str, int]] = []
    original = Handler.setup

    def counted(handler: Handler) -> None:
        connections.append(handler.client_address)
        original(handler)

    monkeypatch.setattr(Handler, "setup", counted)
    # HTTP/1.1, so the server keeps a connection open for the next request (1.0 closes each).
    monkeypatch.setattr(Handler, "protocol_version", "HTTP/1.1")
    kept = load(LoadPlan(server.url, rate=20, duration_s=0.25, body=BODY))
    opened = len(connections)
    fresh = load(LoadPlan(server.url, rate=20, duration_s=0.25, body=BODY, keep_alive=False))
    assert kept.succeeded == fresh.succeeded == 5
    # Five requests 50 ms apart, each answered at once: one connection reused, then five of their own.
    assert opened == 1
    assert len(connections) - opened == 5
    # Each names the connection it opened by its port, as the server saw it; a reused one opened none.
    assert [o.client_port for o in fresh.outcomes] == [port for _, port in connections[opened:]]
    assert [o.client_port is None for o in kept.outcomes] == [False, True, True, True, True]


def test_load_is_open_loop_a_slow_server_does_not_slow_the_sends(server: Server) -> None:
    delay = 0.5
    report = load(LoadPlan(server.url, rate=10, duration_s=1, body={**BODY, "delay": delay}))
    assert report.succeeded == 10
    # Closed loop, ten requests of half a second would take five; sent on schedule they overlap.
    assert report.elapsed_s < 1 + delay + 1.5, report.elapsed_s
    assert report.latency(50) >= delay


def test_timeouts_refusals_and_drops_are_failures_of_their_own(server: Server) -> None:
    (closed,) = free_ports(1)
    refused = load(LoadPlan(f"http://127.0.0.1:{closed}/", rate=10, duration_s=0.2, body=BODY))
    slow = load(LoadPlan(server.url, rate=10, duration_s=0.2, body={**BODY, "delay": 2}, timeout_s=0.3))
    bounded = load(LoadPlan(server.url, rate=20, duration_s=0.25, body={**BODY, "delay": 1}, max_in_flight=1))
    assert refused.failures == {REFUSED: 2}
    assert {o.client_port for o in refused.outcomes} == {None}
    assert slow.failures == {TIMEOUT: 2}
    # One request waits a second; the four due meanwhile are not sent.
    assert (bounded.sent, bounded.succeeded, bounded.failures) == (1, 1, {DROPPED: 4})


def test_the_command_prints_the_summary_and_fails_on_any_failure(server: Server) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = [str(SCRIPTS / "neuronfleet-dev"), "load", server.url, "--rate", "10", "--duration", "0.5", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    fine = run("--json", "--max-tokens", "3")
    assert fine.returncode == 0, fine.stderr
    summary = json.loads(fine.stdout)
    assert (summary["sent"], summary["succeeded"], summary["failed"]) == (5, 5, {})
    assert set(summary["latency_s"]) == {"p50", "p90", "p99", "p100"}
    assert server.bodies[-1] == {"model": "neuronfleet/tiny", "prompt": "The fleet", "max_tokens": 3}
    table = run("--header", "X-Served-By")
    assert table.returncode == 0, table.stderr
    printed = rows(table.stdout)
    assert printed["succeeded"] == "5"
    assert printed["X-Served-By: replica-a"] == "5"
    assert printed["latency"].startswith("p50 ")
    (closed,) = free_ports(1)
    failing = subprocess.run(
        [str(SCRIPTS / "neuronfleet-dev"), "load", f"http://127.0.0.1:{closed}/", "--rate", "4", "--duration", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert failing.returncode == 1
    assert rows(failing.stdout)["failed: refused"] == "2"
    assert rows(failing.stdout)["latency"] == "p50 -  p90 -  p99 -  max -"


def test_a_stopped_run_sends_nothing_more_and_waits_for_what_it_sent(server: Server) -> None:
    plan = LoadPlan(server.url, rate=10, duration_s=60, body={**BODY, "delay": 0.5})

    async def stopped_mid_run() -> LoadReport:
        stop = asyncio.Event()

        async def stop_once_requests_arrived() -> None:
            while len(server.bodies) < 5:
                await asyncio.sleep(0.01)
            stop.set()

        stopper = asyncio.create_task(stop_once_requests_arrived())
        report = await run_load(plan, stop=stop)
        await stopper
        return report

    report = asyncio.run(stopped_mid_run())
    # Nothing more is sent after the stop, and the half-second answers to what was sent are waited for.
    assert report.stopped_early
    assert report.sent == report.succeeded == len(server.bodies) >= 5
    assert report.failures == {}
    assert [o.index for o in report.outcomes] == list(range(report.sent))
    assert report.elapsed_s < 30
    assert report.started_at == pytest.approx(time.time(), abs=10)


def test_sigterm_stops_the_command_which_reports_and_writes_every_outcome(server: Server, tmp_path: Path) -> None:
    outcomes = tmp_path / "outcomes.jsonl"
    command = [str(SCRIPTS / "neuronfleet-dev"), "load", server.url, "--rate", "20", "--duration", "600"]
    running = subprocess.Popen(
        [*command, "--json", "--header", "X-Served-By", "--record-header", "X-Zone", "--outcomes", str(outcomes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Wait until the server has seen requests, so the stop comes mid-run.
        deadline = time.monotonic() + 30
        while len(server.bodies) < 5 and time.monotonic() < deadline and running.poll() is None:
            time.sleep(0.05)
        running.send_signal(signal.SIGTERM)
        stdout, stderr = running.communicate(timeout=30)
    finally:
        running.kill()
    assert running.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["stopped_early"] is True
    assert summary["sent"] == summary["succeeded"] == len(server.bodies) >= 5
    lines = [json.loads(line) for line in outcomes.read_text().splitlines()]
    # One line per request, written as each ended.
    assert sorted(line["index"] for line in lines) == list(range(summary["sent"]))
    assert {line["header"] for line in lines} == {"replica-a"}
    # The command's default --max-tokens, as the server's usage reports it.
    assert {(line["recorded"]["X-Zone"], line["tokens"]) for line in lines} == {("zone-1", 16)}
