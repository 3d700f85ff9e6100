"""The requests a fleet twin serves: open-loop arrivals from a seeded generator or a trace file, and closed-loop
conversations whose next turn waits for the last one's answer.

A prompt is made of segments: named ones (a system prompt, a conversation's earlier turns) have the same tokens
wherever they appear, so replicas' prefix caches and the picker's prefix index see them as shared; the rest of a
prompt is the request's own. Tokens are deterministic functions of the names: the same seed, the same run.
"""

from __future__ import annotations

import functools
import json
import math
import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from neuronfleet.contract.model_shapes import TINY_VOCAB_SIZE


@dataclass(frozen=True)
class TwinRequest:
    """One request: when it arrives (seconds of virtual time), its prompt's tokens and the tokens it asks for."""

    req_id: str
    at: float
    prompt: tuple[int, ...]
    max_tokens: int
    conversation: str | None = None
    adapter: str | None = None
    #: Sent before the measured load (a conversation's system prompt, once): served, not reported.
    warmup: bool = False


@functools.lru_cache(maxsize=4096)
def segment(name: str, length: int) -> tuple[int, ...]:
    """The tokens of the segment ``name``: the same wherever it appears."""
    draw = np.random.default_rng(zlib.crc32(name.encode()))
    return tuple(draw.integers(1, TINY_VOCAB_SIZE, size=length).tolist())


class Source(Protocol):
    """Where a twin's requests come from."""

    #: True when an answer may bring a request (a conversation's next turn): the twin then waits for each answer.
    closed_loop: ClassVar[bool]

    def initial(self) -> list[TwinRequest]:
        """The requests known before the run starts."""
        ...

    def answered(self, request: TwinRequest, at: float, output: Sequence[int]) -> list[TwinRequest]:
        """What the answer to ``request`` (its tokens ``output``, complete at ``at``) makes its sender send."""
        ...


@dataclass(frozen=True)
class OpenLoop:
    """Requests whose arrival times do not depend on answers: a generator's or a trace's."""

    requests: tuple[TwinRequest, ...]
    closed_loop: ClassVar[bool] = False

    def initial(self) -> list[TwinRequest]:
        """All of them."""
        return list(self.requests)

    def answered(self, request: TwinRequest, at: float, output: Sequence[int]) -> list[TwinRequest]:
        """Nothing: an open loop sends on its own schedule."""
        return []


def poisson_times(rate: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process of ``rate`` per second over ``duration_s``: the exponential gaps the rig's
    load tool draws from the same seed (``neuronfleet-dev load --poisson``), so the rig and the twin get the same
    arrivals."""
    gaps = random.Random(seed)
    due, times = 0.0, []
    while due < duration_s:
        times.append(due)
        due += gaps.expovariate(rate)
    return times


def modulated_times(rate: Callable[[float], float], peak: float, duration_s: float, seed: int) -> list[float]:
    """Arrival times of a Poisson process whose rate changes with time (``rate(t)`` at most ``peak``): a
    homogeneous process of ``peak`` thinned by ``rate(t) / peak``."""
    draw = random.Random(seed)
    return [t for t in poisson_times(peak, duration_s, seed) if draw.random() * peak < rate(t)]


def step_rate(base: float, factor: float, start_s: float, length_s: float) -> Callable[[float], float]:
    """``base`` per second, ``factor`` times that from ``start_s`` for ``length_s``."""
    return lambda t: base * factor if start_s <= t < start_s + length_s else base


def burst_rate(base: float, factor: float, every_s: float, length_s: float) -> Callable[[float], float]:
    """``base`` per second, with a burst of ``factor`` times it for ``length_s`` at the start of every ``every_s``."""
    return lambda t: base * factor if t % every_s < length_s else base


def diurnal_rate(mean: float, swing: float, period_s: float) -> Callable[[float], float]:
    """A day's shape: ``mean`` per second, up and down by ``swing`` of it (0 to 1) over ``period_s``, lowest at 0."""
    return lambda t: mean * (1 - swing * math.cos(2 * math.pi * t / period_s))


@dataclass(frozen=True)
class Shape:
    """What each generated request looks like: its prompt length (fixed, or drawn by ``prompt_lengths``), the
    tokens it asks for, and a shared leading segment, if any."""

    prompt_tokens: int = 512
    max_tokens: int = 128
    prompt_lengths: Callable[[random.Random], int] | None = None
    shared_prefix: tuple[str, int] | None = None


def generated(times: Iterable[float], shape: Shape, seed: int, label: str = "req") -> OpenLoop:
    """One request of ``shape`` at each of ``times``, each prompt its own (after any shared segment)."""
    draw = random.Random(seed)
    requests = []
    for index, at in enumerate(times):
        length = shape.prompt_lengths(draw) if shape.prompt_lengths else shape.prompt_tokens
        head = segment(*shape.shared_prefix) if shape.shared_prefix else ()
        own = segment(f"{label}/{seed}/{index}", max(length - len(head), 1))
        requests.append(TwinRequest(f"{label}-{index}", at, head + own, shape.max_tokens))
    return OpenLoop(tuple(requests))


class TraceError(ValueError):
    """A trace file's line that the twin cannot read."""


def read_trace(path: Path) -> OpenLoop:
    """Requests from a JSON-lines trace: ``time`` (seconds), ``prompt_tokens``, ``max_tokens``, and optionally
    ``prefix`` (leading shared segments, ``[[name, tokens], ...]``, part of ``prompt_tokens``), ``conversation``
    and ``adapter``. Lines may come in any order."""
    requests = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            head = tuple(token for name, length in row.get("prefix", ()) for token in segment(str(name), int(length)))
            total, at, max_tokens = int(row["prompt_tokens"]), float(row["time"]), int(row["max_tokens"])
        except (ValueError, KeyError, TypeError) as error:
            raise TraceError(f"{path}:{number}: {error!r}: each line needs time, prompt_tokens, max_tokens") from error
        if total < len(head) or total < 1 or max_tokens < 1 or at < 0:
            raise TraceError(f"{path}:{number}: prompt_tokens must cover the prefix, max_tokens be positive, time >= 0")
        own = segment(f"{path.name}/{number}", total - len(head)) if total > len(head) else ()
        requests.append(
            TwinRequest(f"trace-{number}", at, head + own, max_tokens, row.get("conversation"), row.get("adapter"))
        )
    return OpenLoop(tuple(sorted(requests, key=lambda request: request.at)))


@dataclass
class Conversations:
    """Clients in multi-turn conversations on shared system prompts, as the rig's prefix bench runs them
    (``bench/conversations.py``): each turn sends the system prompt, the conversation so far and a new message,
    and ``think_s`` after its answer the next; after ``turns`` turns the client starts a new conversation. A
    turn asks for one token and the client writes the reply, or (``generate``) the engine writes it. Each system
    prompt is sent once before the clients start (``warmup``)."""

    clients: int
    prefixes: int
    duration_s: float
    system_tokens: int = 1500
    user_tokens: int = 60
    reply_tokens: int = 30
    turns: int = 10
    think_s: float = 1.5
    generate: bool = False
    seed: str = "0"
    #: Each client's conversation number, its history so far and its turn.
    _state: dict[int, tuple[int, tuple[int, ...], int]] = field(default_factory=dict)
    #: No turn is sent after this: ``duration_s`` after the clients start.
    _deadline: float = math.inf
    closed_loop: ClassVar[bool] = True

    def initial(self) -> list[TwinRequest]:
        """The first system prompt's warm-up: each is sent once its predecessor is answered, then the clients."""
        return [self._warmup(0, 0.0)]

    def answered(self, request: TwinRequest, at: float, output: Sequence[int]) -> list[TwinRequest]:
        """After a warm-up, the next one or every client's first turn; after a turn, the client's next one,
        ``think_s`` after this answer, while the run lasts."""
        if request.warmup:
            prefix = int(request.req_id.rsplit("-", 1)[1]) + 1
            if prefix < self.prefixes:
                return [self._warmup(prefix, at)]
            self._deadline = at + self.duration_s
            return [self._turn(client, at) for client in range(self.clients)]
        assert request.conversation is not None
        client = int(request.conversation.split("/")[0])
        conversation, history, turn = self._state[client]
        key = f"{self.seed}/{client}/{conversation}"
        reply = tuple(output) if self.generate else segment(f"{key}/reply/{turn}", self.reply_tokens)
        self._state[client] = (conversation, history + reply, turn + 1)
        if turn + 1 >= self.turns:
            self._state[client] = (conversation + 1, (), 0)
        send_at = at + self.think_s
        return [self._turn(client, send_at)] if send_at < self._deadline else []

    def _warmup(self, prefix: int, at: float) -> TwinRequest:
        return TwinRequest(f"warmup-{prefix}", at, self._system(prefix), 1, warmup=True)

    def _system(self, prefix: int) -> tuple[int, ...]:
        return segment(f"{self.seed}/system/{prefix}", self.system_tokens)

    def _turn(self, client: int, at: float) -> TwinRequest:
        conversation, history, turn = self._state.get(client, (0, (), 0))
        key = f"{self.seed}/{client}/{conversation}"
        if not history:
            history = self._system((client + conversation) % self.prefixes)
        history = history + segment(f"{key}/user/{turn}", self.user_tokens)
        self._state[client] = (conversation, history, turn)
        max_tokens = self.reply_tokens if self.generate else 1
        return TwinRequest(f"{key}/{turn}", at, history, max_tokens, conversation=f"{client}/{conversation}")
