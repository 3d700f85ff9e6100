"""The twin's routers: the Endpoint Picker, scoring as GIE v1.5.0 and our picker build do, and the Service.

The picker adds up the scorers the contract declares for a service (:meth:`PickerScoring.scorers`), each
``weight x score`` with the score in [0, 1], and takes the highest total, ties broken at random (GIE's
max-score picker shuffles before it sorts). What it knows of a replica:

- the engine's gauges (waiting requests, KV use, requests in flight) as of its last scrape, every
  ``refresh_s`` (GIE's ``--refresh-metrics-interval``, 50 ms), each replica's scrapes at a phase of their own;
- its own counts, exact at the moment it routes: the tokens in flight (GIE's ``inflight-load-producer``, from the
  request's size in bytes) and the prefix index (GIE's approximate prefix cache: the prompt's text hashed in
  blocks of the engines' KV block size times 4 characters, chained, remembered per replica in a least recently
  used cache as large as the replica's KV blocks).

The formulas are GIE's (``pkg/epp/framework/plugins``): queue and running requests scored ``(max - x) / (max -
min)`` over the candidates (1 when all are equal), KV use ``1 - usage``, prefix ``matched blocks / blocks``,
LoRA affinity 1 (running the adapter), 0.8 (a slot free), 0; our in-flight tokens scorer ``1 - (x - least) /
max(most - least, stepTokens)``.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from neuronfleet.contract import picker as rules
from neuronfleet.contract.config import EngineConfig
from neuronfleet.engine.fleet.arrivals import TwinRequest
from neuronfleet.engine.fleet.replica import Replica, Served

#: GIE's estimate of characters per token: its prefix blocks are ``blockSizeTokens`` times this many bytes.
GIE_CHARS_PER_TOKEN = 4
#: GIE's default cap on the blocks a prompt is matched on.
MAX_PREFIX_BLOCKS = 256
#: The prefix-cache weight of a ``picker-prefix`` router (the rig's prefix bench runs it).
PREFIX_WEIGHT = 4.0
#: The bytes of a completions request's JSON around its prompt (model name, max_tokens, ...).
BODY_OVERHEAD_BYTES = 80


class Router(Protocol):
    """Chooses the replica for each request, and learns of each answer."""

    def pick(self, request: TwinRequest, now: float, candidates: Sequence[Replica]) -> Replica:
        """The replica that serves ``request``, of ``candidates`` (not empty)."""
        ...

    def answered(self, served: Served) -> None:
        """``served`` has finished: its last token went out."""
        ...


@dataclass
class ServiceRouter:
    """A Kubernetes Service with a connection per request: kube-proxy picks a ready replica at random."""

    seed: int = 0
    _draw: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._draw = random.Random(self.seed)

    def pick(self, request: TwinRequest, now: float, candidates: Sequence[Replica]) -> Replica:
        """Any of them, uniformly."""
        return self._draw.choice(candidates)

    def answered(self, served: Served) -> None:
        """Nothing: kube-proxy keeps no count."""


def router_named(name: str, engine: EngineConfig, seed: int, chars_per_token: int = GIE_CHARS_PER_TOKEN) -> Router:
    """A router by name: ``service``; ``picker``, the operator's (tokens in flight counted); ``picker-engine-metrics``,
    the picker on the engines' metrics alone (GIE's own image); ``picker-prefix``, the operator's with prefix-cache
    locality at :data:`PREFIX_WEIGHT`."""
    if name == "service":
        return ServiceRouter(seed)
    scoring = rules.PickerScoring(
        prefix_cache_weight=PREFIX_WEIGHT if name == "picker-prefix" else 0.0,
        block_size=engine.block_size,
        inflight_tokens=name != "picker-engine-metrics",
        step_tokens=engine.max_num_batched_tokens,
    )
    return PickerRouter(scoring, chars_per_token=chars_per_token, seed=seed)


@dataclass(frozen=True)
class View:
    """What the picker knows of one candidate when it scores a request."""

    replica: Replica
    waiting: int
    running: int
    kv_usage: float
    inflight_tokens: int
    prefix_blocks: int
    adapters: frozenset[str]


#: A scorer's rule: the candidates' scores for a request of ``blocks`` prefix blocks, from what is known of them.
Rule = Callable[["Scoring", Sequence[View]], list[float]]


@dataclass(frozen=True)
class Scoring:
    """A request's facts the rules read beside the views."""

    request: TwinRequest
    blocks: int
    parameters: Mapping[str, object]
    max_loras: int


def _spread_low_wins(values: Sequence[float]) -> list[float]:
    least, most = min(values), max(values)
    if most == least:
        return [1.0] * len(values)
    return [(most - value) / (most - least) for value in values]


def _inflight_tokens(scoring: Scoring, views: Sequence[View]) -> list[float]:
    tokens = [view.inflight_tokens for view in views]
    least, most = min(tokens), max(tokens)
    step = int(scoring.parameters["stepTokens"])  # type: ignore[call-overload]
    return [1 - (value - least) / max(most - least, step) for value in tokens]


def _lora(scoring: Scoring, views: Sequence[View]) -> list[float]:
    adapter = scoring.request.adapter

    def score(view: View) -> float:
        if adapter in view.adapters:
            return 1.0
        return 0.8 if len(view.adapters) < scoring.max_loras else 0.0

    return [score(view) for view in views]


#: One rule for every scorer type the contract can name (a test holds them to it).
RULES: Mapping[str, Rule] = {
    rules.QUEUE_SCORER: lambda _, views: _spread_low_wins([view.waiting for view in views]),
    rules.RUNNING_REQUESTS_SCORER: lambda _, views: _spread_low_wins([view.running for view in views]),
    rules.KV_CACHE_SCORER: lambda _, views: [1 - view.kv_usage for view in views],
    rules.PREFIX_SCORER: lambda scoring, views: [
        view.prefix_blocks / scoring.blocks if scoring.blocks else 0.0 for view in views
    ],
    rules.LORA_SCORER: _lora,
    rules.INFLIGHT_TOKENS_SCORER: _inflight_tokens,
}


@dataclass
class PrefixIndex:
    """GIE's approximate prefix cache: which replica it sent each block of prompt text to."""

    block_bytes: int
    chars_per_token: int
    _held: dict[str, OrderedDict[int, None]] = field(default_factory=dict)
    _holders: dict[int, set[str]] = field(default_factory=dict)

    def hashes(self, prompt: Sequence[int]) -> list[int]:
        """The chained hashes of the prompt text's whole blocks (at most :data:`MAX_PREFIX_BLOCKS`)."""
        tokens = min(len(prompt), -(-MAX_PREFIX_BLOCKS * self.block_bytes // self.chars_per_token))
        text = np.zeros((tokens, self.chars_per_token), dtype=np.uint8)
        ids = np.asarray(prompt[:tokens], dtype="<u4").view(np.uint8).reshape(tokens, 4)
        text[:, : min(4, self.chars_per_token)] = ids[:, : min(4, self.chars_per_token)]
        data = text.tobytes()
        found, chained = [], 0
        for start in range(
            0, min(len(data), MAX_PREFIX_BLOCKS * self.block_bytes) - self.block_bytes + 1, self.block_bytes
        ):
            chained = hash((chained, data[start : start + self.block_bytes]))
            found.append(chained)
        return found

    def matched(self, hashes: Sequence[int]) -> dict[str, int]:
        """Blocks credited to each replica: every block up to the first that no replica holds."""
        credit: dict[str, int] = {}
        for block in hashes:
            holders = self._holders.get(block)
            if not holders:
                break
            for name in holders:
                credit[name] = credit.get(name, 0) + 1
        return credit

    def record(self, hashes: Sequence[int], replica: str, capacity: int) -> None:
        """``replica`` was sent these blocks: the most recently used, the oldest evicted past ``capacity``."""
        held = self._held.setdefault(replica, OrderedDict())
        for block in hashes:
            held[block] = None
            held.move_to_end(block)
            self._holders.setdefault(block, set()).add(replica)
        while len(held) > capacity:
            evicted, _ = held.popitem(last=False)
            holders = self._holders[evicted]
            holders.discard(replica)
            if not holders:
                del self._holders[evicted]


@dataclass
class PickerRouter:
    """The Endpoint Picker with ``scoring``: the scorers the operator would configure for the service."""

    scoring: rules.PickerScoring
    refresh_s: float = 0.05
    #: Bytes of prompt text per token: 5 for the simulated tokenizer's words, about 4 for English.
    chars_per_token: int = GIE_CHARS_PER_TOKEN
    max_loras: int = 0
    seed: int = 0
    _inflight_tokens: dict[str, int] = field(default_factory=dict)
    _estimates: dict[str, int] = field(default_factory=dict)
    _phases: dict[str, float] = field(default_factory=dict)
    _draw: random.Random = field(init=False)
    _index: PrefixIndex = field(init=False)

    def __post_init__(self) -> None:
        self._draw = random.Random(self.seed)
        self._scorers = self.scoring.scorers()
        if unknown := {scorer.type for scorer in self._scorers} - set(RULES):
            raise ValueError(f"the twin has no rule for the picker's scorers {sorted(unknown)}")
        self._index = PrefixIndex(self.scoring.block_size * GIE_CHARS_PER_TOKEN, self.chars_per_token)
        self._prefix = any(scorer.type == rules.PREFIX_SCORER for scorer in self._scorers)

    def pick(self, request: TwinRequest, now: float, candidates: Sequence[Replica]) -> Replica:
        """The candidate of the highest weighted score, a random one of those tied."""
        hashes = self._index.hashes(request.prompt) if self._prefix else []
        credit = self._index.matched(hashes) if hashes else {}
        views = [self._view(replica, now, credit.get(replica.name, 0)) for replica in candidates]
        totals = [0.0] * len(views)
        for scorer in self._scorers:
            scores = RULES[scorer.type](Scoring(request, len(hashes), scorer.parameters, self.max_loras), views)
            totals = [
                total + scorer.weight * min(max(score, 0.0), 1.0) for total, score in zip(totals, scores, strict=True)
            ]
        best = max(totals)
        chosen = self._draw.choice([view.replica for view, total in zip(views, totals, strict=True) if total == best])
        estimate = self._estimate(request)
        self._estimates[request.req_id] = estimate
        self._inflight_tokens[chosen.name] = self._inflight_tokens.get(chosen.name, 0) + estimate
        if hashes:
            self._index.record(hashes, chosen.name, chosen.num_kv_blocks)
        return chosen

    def answered(self, served: Served) -> None:
        """The producer's count drops by the request's estimate as its answer ends."""
        estimate = self._estimates.pop(served.request.req_id, 0)
        self._inflight_tokens[served.replica] -= estimate

    def _estimate(self, request: TwinRequest) -> int:
        # GIE's producer: the body's bytes over 4 for the prompt, and 1.5 times that for the output.
        prompt = max((len(request.prompt) * self.chars_per_token + BODY_OVERHEAD_BYTES) // 4, 1)
        return prompt + int(prompt * 1.5 + 0.5)

    def _view(self, replica: Replica, now: float, prefix_blocks: int) -> View:
        phase = self._phases.setdefault(replica.name, self._draw.uniform(0, self.refresh_s))
        scraped = now - ((now - phase) % self.refresh_s)
        exported = replica.exported_at(scraped)
        adapters = frozenset(r.adapter for r in replica.in_flight.values() if r.adapter is not None)
        return View(
            replica,
            waiting=exported.waiting,
            running=replica.in_flight_at(scraped),
            kv_usage=exported.kv_usage,
            inflight_tokens=self._inflight_tokens.get(replica.name, 0),
            prefix_blocks=prefix_blocks,
            adapters=adapters,
        )
