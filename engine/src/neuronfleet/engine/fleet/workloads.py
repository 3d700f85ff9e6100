"""Named loads for the twin: the rig's routing and prefix mixes (one definition, read by the rig's benches too,
so the twin replays exactly what the rig ran) and open-loop traffic shaped after the tuning workloads.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from neuronfleet.engine.fleet import arrivals
from neuronfleet.engine.tuning.workloads import WORKLOADS

#: What the rig's load tool adds to a prompt it marks as its own (``--distinct-prompts``): 16 of its words.
DISTINCT_MARK_TOKENS = 16
#: The routing bench's short request: 20 words (one token each on the simulated tokenizer), one token asked.
SHORT_TOKENS, SHORT_MAX_TOKENS = 20, 1
#: Tokens each long request asks for: its prefill is what the short ones would wait behind.
LONG_MAX_TOKENS = 4


@dataclass(frozen=True)
class RoutingMix:
    """The routing bench's load: short requests per second, long ones per second, a long one's prompt in tokens."""

    short_rate: float
    long_rate: float
    long_tokens: int

    def window(self, name: str, index: int, seconds: float) -> arrivals.OpenLoop:
        """Window ``index`` of the mix: the Poisson arrivals the rig's load tool draws for it (the same seeds)."""

        def stream(kind: str, rate: float, tokens: int, max_tokens: int) -> tuple[arrivals.TwinRequest, ...]:
            seed = stream_seed(name, index, kind)
            shape = arrivals.Shape(tokens + DISTINCT_MARK_TOKENS, max_tokens)
            return arrivals.generated(arrivals.poisson_times(rate, seconds, seed), shape, seed, kind).requests

        requests = stream("long", self.long_rate, self.long_tokens, LONG_MAX_TOKENS) + stream(
            "short", self.short_rate, SHORT_TOKENS, SHORT_MAX_TOKENS
        )
        return arrivals.OpenLoop(tuple(sorted(requests, key=lambda request: request.at)))


def stream_seed(mix: str, index: int, stream: str) -> int:
    """The seed of a stream's Poisson arrivals in a round: every side of the round gets the same arrivals."""
    return zlib.crc32(f"{mix}/{index}/{stream}".encode())


#: Rates and prompt lengths: long prompts rarely, as long but more often, and more of everything with shorter
#: longs (a 2,000-token prefill, in the 2,048 bucket, takes about 0.6 s on the bench's replicas).
ROUTING_MIXES: Mapping[str, RoutingMix] = {
    "rare-long": RoutingMix(short_rate=2.0, long_rate=0.3, long_tokens=3900),
    "frequent-long": RoutingMix(short_rate=3.0, long_rate=0.5, long_tokens=3900),
    "busy": RoutingMix(short_rate=5.0, long_rate=0.8, long_tokens=2000),
}


@dataclass(frozen=True)
class ConversationMix:
    """The prefix bench's conversations: a reply's tokens, the system prompts they share, the clients."""

    reply_tokens: int
    prefixes: int = 3
    clients: int = 6
    #: Turns per conversation; the bench's ``--turns`` (10) when None.
    turns: int | None = None
    #: The engine writes each reply (streamed; TTFT is its first token), and its KV cache stays where it did.
    generated: bool = False
    #: Its windows are this many times the bench's window, to hold as many whole conversations.
    window_scale: float = 1.0

    def clients_for(
        self, seconds: float, seed: str, *, turns: int = 10, think_s: float = 1.5
    ) -> arrivals.Conversations:
        """One window's conversations (``seconds`` long, ``seed`` drawing its prompts), as the bench's driver runs
        them with its defaults: 1,500-token system prompts, 60-token messages."""
        return arrivals.Conversations(
            clients=self.clients,
            prefixes=self.prefixes,
            duration_s=seconds * self.window_scale,
            reply_tokens=self.reply_tokens,
            turns=self.turns or turns,
            think_s=think_s,
            generate=self.generated,
            seed=seed,
        )


#: A chat's replies run to hundreds of tokens; 150 keeps ten turns on a 1,500-token system prompt within 4,096
#: tokens. On one prompt every conversation starts where the first went. A busy chat: twice the clients, on twice
#: the prompts. A long chat: twenty turns, its history up to 5,700 tokens. A chat whose replies the engine writes.
PREFIX_MIXES: Mapping[str, ConversationMix] = {
    "short-replies": ConversationMix(30),
    "chat": ConversationMix(150),
    "one-prompt": ConversationMix(150, prefixes=1),
    "busy-chat": ConversationMix(150, prefixes=6, clients=12),
    "long-chat": ConversationMix(150, turns=20, window_scale=2.0),
    "generated-chat": ConversationMix(100, generated=True, window_scale=2.5),
}


def prompt_lengths(workload: str, cap: int) -> Callable[[random.Random], int]:
    """Draws one prompt length of a tuning workload (``chat``, ``summarization``, ``code``), at most ``cap``."""
    shape = WORKLOADS[workload]
    mu = math.log(shape.median)
    return lambda draw: min(cap, max(shape.minimum, round(draw.lognormvariate(mu, shape.sigma))))


@dataclass(frozen=True)
class Traffic:
    """Open-loop traffic of a tuning workload's prompt lengths, and the tokens each request asks for."""

    workload: str
    max_tokens: int

    def requests(self, times: list[float], *, cap: int, seed: int = 0) -> arrivals.OpenLoop:
        """A request at each of ``times``, its prompt drawn from the workload and cut, as a client would, to leave
        its answer room within ``cap`` tokens (``max_model_len``)."""
        limit = cap - self.max_tokens
        shape = arrivals.Shape(max_tokens=self.max_tokens, prompt_lengths=prompt_lengths(self.workload, limit))
        return arrivals.generated(times, shape, seed)


#: The planner's and the benches' open-loop traffic: chat turns, and long prompts with short answers (RAG-like).
TRAFFIC: Mapping[str, Traffic] = {
    "chat": Traffic("chat", 150),
    "rag": Traffic("summarization", 64),
    "code": Traffic("code", 64),
}
