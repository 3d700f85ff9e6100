"""An open-loop load generator: requests at a fixed rate for a fixed time, every response recorded.

Open loop: request ``i`` is sent at ``i / rate`` seconds (or, for a Poisson plan, at its own random moment)
whatever the earlier ones are doing, as real clients arrive, so a slow or failing server cannot slow the
offered load down and hide its own failures. Bounded: it runs for ``duration`` seconds, and a request that
would exceed ``max_in_flight`` is not sent but counted as ``dropped``. A run can also be stopped early
(``stop``; the CLI's Ctrl-C or SIGTERM): nothing more is sent, and every request already sent is waited for
and recorded.
``neuronfleet-dev load`` and the tests run this same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import secrets
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

#: The outcome of a request that got no HTTP status: sent but answered by nobody in time.
TIMEOUT = "timeout"
#: Not delivered: the connection was refused (or the address unreachable), so no server saw the request.
REFUSED = "refused"
#: Sent, but the connection failed after it was made (reset, closed early).
TRANSPORT_ERROR = "transport error"
#: Not sent: max_in_flight requests were already waiting.
DROPPED = "dropped"
#: Answered 2xx with fewer tokens than asked for, where the plan asks for exactly ``max_tokens``.
SHORT = "short"


#: Random bits in each mark: no two marks alike in any run of any length here.
MARK_BITS = 48


def distinct_mark(prompt: str) -> str:
    """Words of ``prompt`` spelling a random number: tokens any tokenizer of the prompt knows.

    A mark of other text would not do on every engine: the simulated device's tokenizer turns any word
    outside its vocabulary into the same ``<unk>``, so marks of new words would all tokenize alike.
    """
    alphabet = sorted(set(prompt.split()))
    value = secrets.randbits(MARK_BITS)
    words = []
    for _ in range(math.ceil(MARK_BITS / math.log2(len(alphabet)))):
        value, digit = divmod(value, len(alphabet))
        words.append(alphabet[digit])
    return " ".join(words)


@dataclass(frozen=True)
class LoadPlan:
    """What to send, how often and for how long."""

    url: str
    rate: float
    duration_s: float
    body: dict[str, Any]
    timeout_s: float = 60.0
    max_in_flight: int = 256
    #: A response header to record per request (for example which revision served it).
    record_header: str | None = None
    #: More response headers to record per request (for example a drain's Connection and Retry-After), not counted.
    also_record: tuple[str, ...] = ()
    #: Start each prompt with a mark of its own (:func:`distinct_mark`), so no two requests, of this run or
    #: another, share a cached prefix: vLLM's prefix cache serves a repeated prompt without prefilling it.
    distinct_prompts: bool = False
    #: Reuse connections (as most clients do). Without, each request opens its own, so a Service's kube-proxy
    #: spreads every request, not only the connections opened while the others were busy.
    keep_alive: bool = True
    #: Ask for exactly the body's ``max_tokens`` (vLLM's ``ignore_eos``) and count a 2xx answer with another
    #: count as failed (:data:`SHORT`): a cut-off answer is a lost one to whoever sent it.
    exact_tokens: bool = False
    #: Arrivals as a Poisson process of the same rate (exponential gaps, drawn from ``seed``), as independent
    #: clients arrive, instead of one every 1/rate seconds: a fixed schedule meets another at fixed offsets.
    poisson: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.duration_s <= 0 or self.timeout_s <= 0 or self.max_in_flight < 1:
            raise ValueError("rate, duration and timeout must be positive, max_in_flight at least 1")
        if self.distinct_prompts and len(set(str(self.body["prompt"]).split())) < 2:
            raise ValueError("distinct prompts are marked with the prompt's own words: it needs two different ones")

    def request_body(self) -> dict[str, Any]:
        """The body of one request: the plan's, its prompt marked anew when prompts are to be distinct."""
        body = {**self.body, "ignore_eos": True} if self.exact_tokens else self.body
        if not self.distinct_prompts:
            return body
        prompt = str(body["prompt"])
        return {**body, "prompt": f"{distinct_mark(prompt)} {prompt}"}

    def schedule(self) -> list[float]:
        """When each request is due, in seconds from the start, within the duration."""
        if not self.poisson:
            return [index / self.rate for index in range(math.ceil(self.rate * self.duration_s))]
        gaps = random.Random(self.seed)
        due, times = 0.0, []
        while due < self.duration_s:
            times.append(due)
            due += gaps.expovariate(self.rate)
        return times

    @property
    def requests(self) -> int:
        """How many requests the plan sends: its :meth:`schedule`'s."""
        return len(self.schedule())


@dataclass(frozen=True)
class Outcome:
    """One request: when it was due (seconds from the start), how long it took, and how it ended."""

    index: int
    sent_at_s: float
    latency_s: float
    #: "200", "503", ..., or TIMEOUT, REFUSED, TRANSPORT_ERROR, DROPPED, SHORT.
    result: str
    header: str | None = None
    #: The values of the plan's ``also_record`` headers the response carried.
    recorded: dict[str, str] = field(default_factory=dict)
    #: A 2xx answer's ``usage.completion_tokens`` (None when its body has none).
    tokens: int | None = None
    #: Another answer's own words: its body's ``error.message`` (OpenAI's form), else the body's start.
    error: str | None = None
    #: The local port of the connection the request opened (None when it reused one, or its connect failed).
    client_port: int | None = None

    @property
    def ok(self) -> bool:
        """A 2xx answer."""
        return self.result.isdigit() and 200 <= int(self.result) < 300

    def to_json(self) -> str:
        """The outcome as one line of JSON."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of ``values``, nearest rank; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class LoadReport:
    """Every outcome of a run, and what a reader wants from them."""

    plan: LoadPlan
    outcomes: list[Outcome] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: Wall-clock time (Unix seconds) of the first send: outcomes' ``sent_at_s`` count from it.
    started_at: float = 0.0
    #: Whether the run was stopped before the plan's last send.
    stopped_early: bool = False

    @property
    def sent(self) -> int:
        """Requests sent (dropped ones were not)."""
        return sum(o.result != DROPPED for o in self.outcomes)

    @property
    def succeeded(self) -> int:
        """Requests answered 2xx."""
        return sum(o.ok for o in self.outcomes)

    @property
    def failures(self) -> Counter[str]:
        """Requests that did not succeed, by status or kind of failure."""
        return Counter(o.result for o in self.outcomes if not o.ok)

    def latency(self, q: float) -> float:
        """The ``q``-th percentile of successful requests' latency, seconds."""
        return percentile([o.latency_s for o in self.outcomes if o.ok], q)

    def headers(self) -> Counter[str | None]:
        """How many successful responses carried each value of ``plan.record_header``."""
        return Counter(o.header for o in self.outcomes if o.ok)

    def summary(self) -> dict[str, Any]:
        """The figures as one JSON-ready mapping."""
        return {
            "url": self.plan.url,
            "rate": self.plan.rate,
            "duration_s": self.plan.duration_s,
            "sent": self.sent,
            "succeeded": self.succeeded,
            "failed": dict(sorted(self.failures.items())),
            "latency_s": {f"p{q}": round(self.latency(q), 4) for q in (50, 90, 99, 100)},
            "elapsed_s": round(self.elapsed_s, 3),
            "started_at": round(self.started_at, 3),
            "stopped_early": self.stopped_early,
        }

    def to_json(self) -> str:
        """:meth:`summary` as one line of JSON (NaN latencies, from no successes, become null)."""
        summary = self.summary()
        summary["latency_s"] = {k: None if math.isnan(v) else v for k, v in summary["latency_s"].items()}
        return json.dumps(summary, sort_keys=True)


async def _one(client: httpx.AsyncClient, plan: LoadPlan, index: int, due: float) -> Outcome:
    opened: list[int] = []

    async def trace(event: str, info: dict[str, Any]) -> None:
        # The connection this request opened, if it opened one: the port that names it to the network.
        if event == "connection.connect_tcp.complete":
            opened.append(info["return_value"].get_extra_info("client_addr")[1])

    began = time.monotonic()
    failed = None
    try:
        response = await client.post(plan.url, json=plan.request_body(), extensions={"trace": trace})
    except httpx.TimeoutException:
        failed = TIMEOUT
    except httpx.ConnectError:
        failed = REFUSED
    except httpx.HTTPError:
        failed = TRANSPORT_ERROR
    latency = time.monotonic() - began
    port = opened[0] if opened else None
    if failed is not None:
        return Outcome(index, due, latency, failed, client_port=port)
    header = response.headers.get(plan.record_header) if plan.record_header else None
    recorded = {name: response.headers[name] for name in plan.also_record if name in response.headers}
    tokens = completion_tokens(response)
    result = str(response.status_code)
    if plan.exact_tokens and response.is_success and tokens != plan.body.get("max_tokens"):
        result = SHORT
    error = None if response.is_success else error_message(response)
    return Outcome(index, due, latency, result, header, recorded, tokens, error, port)


def error_message(response: httpx.Response) -> str:
    """What a failed answer says: its OpenAI-style ``error.message``, else the start of its body."""
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def completion_tokens(response: httpx.Response) -> int | None:
    """The completion tokens a 2xx answer's body reports (``usage.completion_tokens``); None without them."""
    if not response.is_success:
        return None
    try:
        tokens = response.json()["usage"]["completion_tokens"]
    except (ValueError, KeyError, TypeError):
        return None
    return tokens if isinstance(tokens, int) else None


async def run_load(
    plan: LoadPlan, on_outcome: Callable[[Outcome], None] | None = None, stop: asyncio.Event | None = None
) -> LoadReport:
    """Send ``plan`` and wait for every answer (at most ``timeout_s`` after the last send).

    Once ``stop`` is set, nothing more is sent; the answers to what was sent are still waited for.
    """
    report = LoadReport(plan)
    stopping = stop or asyncio.Event()
    kept = plan.max_in_flight if plan.keep_alive else 0
    limits = httpx.Limits(max_connections=plan.max_in_flight, max_keepalive_connections=kept)
    in_flight: set[asyncio.Task[Outcome]] = set()

    def record(outcome: Outcome) -> None:
        report.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)

    def finished(task: asyncio.Task[Outcome]) -> None:
        in_flight.discard(task)
        record(task.result())

    async with httpx.AsyncClient(timeout=plan.timeout_s, limits=limits) as client:
        start = time.monotonic()
        report.started_at = time.time()
        for index, due in enumerate(plan.schedule()):
            delay = start + due - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
            if stopping.is_set():
                report.stopped_early = True
                break
            if len(in_flight) >= plan.max_in_flight:
                record(Outcome(index, due, 0.0, DROPPED))
                continue
            task = asyncio.create_task(_one(client, plan, index, due))
            in_flight.add(task)
            task.add_done_callback(finished)
        while in_flight:
            await asyncio.wait(set(in_flight))
        report.elapsed_s = time.monotonic() - start
    report.outcomes.sort(key=lambda o: o.index)
    return report
