"""The rig's routing benches replayed in the twin, and what the rig measured.

``bench/routing.py`` and ``bench/prefix_routing.py`` run these mixes on the real node: simulated Llama 3.1 8B
replicas (trn2.48xlarge, TP 1) rolled out by the operator, requests through the plain Service and through
Endpoint Pickers. Here the same arrivals (the same seeds, the same conversations) go through the twin at the
same replica counts, and :data:`RIG_FIGURES` keeps the rig's own figures, each with the commit and command that
produced it, to hold the twin to.

A replayed side's figures are pooled over its windows, as the bench pools them, and taken over several seeds of
the routers' own randomness (kube-proxy's pick, the picker's ties): the median, with the spread.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.fleet import twin
from neuronfleet.engine.fleet.picker import Router, router_named
from neuronfleet.engine.fleet.workloads import PREFIX_MIXES, ROUTING_MIXES
from neuronfleet.engine.offline.virtual_clock import percentile
from neuronfleet.engine.sim.cost_model import CostModel

#: The routing bench's engines: room for prompts up to the long ones, buckets for them and one for chat.
ROUTING_ENGINE: Mapping[str, Any] = {
    "max_model_len": 4096,
    "max_num_batched_tokens": 4096,
    "num_batched_tokens_buckets": [128, 2048, 4096],
    "max_num_seqs": 8,
}
#: The prefix bench's: the default prefill ladder from 128, a long chat's history past 4,096 tokens, and decode
#: context buckets so a decode reads the shortest cache that holds its longest sequence.
PREFIX_ENGINE: Mapping[str, Any] = {
    "max_model_len": 8192,
    "max_num_batched_tokens": 4096,
    "num_batched_tokens_buckets": [128, 256, 512, 1024, 2048, 4096],
    "max_num_seqs": 8,
    "decode_context_length_buckets": [2048, 4096],
    # The cap `auto` derived when the twin was validated against the rig (docs/fleet.md), kept so that the
    # comparison keeps its configuration; `auto` derives 256 here since it bounds the stall, not the step.
    "scheduler": {"max_prefill_tokens_while_decoding": 512},
}
ROUTING_REPLICAS, PREFIX_REPLICAS = 2, 3
#: Seconds per window, and windows per side, as both benches run by default.
WINDOW_S, ROUNDS = 40.0, 3
#: The rig's path outside the engine (client, kube-proxy or Envoy and the picker, the API server's tokenizing
#: and streaming), per request: ``docs/deploy.md`` gives about 40 ms for the prefix bench's turns.
HOST_PATH_S = 0.04
#: Bytes per token of the simulated tokenizer's prompts: four-letter words and a space.
SIM_CHARS_PER_TOKEN = 5
#: Each bench's sides: how the rig routes them.
ROUTING_SIDES = ("service", "picker", "picker-engine-metrics")
PREFIX_SIDES = ("service", "picker", "picker-prefix")


def rig_spec(engine: Mapping[str, Any], replicas: int) -> twin.FleetSpec:
    """The rig's fleet: ``replicas`` of the simulated Llama 3.1 8B on trn2.48xlarge at TP 1, with ``engine``."""
    config = EngineConfig.model_validate(dict(engine))
    cost = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), 1)
    return twin.FleetSpec.of(config, cost, replicas, host_path_s=HOST_PATH_S)


def router(side: str, engine: EngineConfig, seed: int) -> Router:
    """The rig's ``side``: the Service, the operator's picker (tokens in flight counted), the picker on the
    engines' metrics alone, or the operator's picker with prefix-cache locality."""
    return router_named(side, engine, seed, SIM_CHARS_PER_TOKEN)


def routing_ttfts(mix: str, side: str, seed: int, rounds: int = ROUNDS) -> list[float]:
    """The short requests' TTFTs of ``rounds`` windows of a routing mix through ``side``."""
    spec = rig_spec(ROUTING_ENGINE, ROUTING_REPLICAS)
    found: list[float] = []
    for index in range(rounds):
        run = twin.run(spec, ROUTING_MIXES[mix].window(mix, index, WINDOW_S), router(side, spec.engine, seed + index))
        found += [s.ttft_s + spec.host_path_s for s in run.served if s.request.req_id.startswith("short")]
    return found


def prefix_ttfts(mix: str, side: str, seed: int, rounds: int = ROUNDS) -> list[float]:
    """The turns' TTFTs of ``rounds`` windows of a prefix mix through ``side`` (each window's conversations the
    rig's own: seeded ``{mix}-{side}-{index}``)."""
    spec = rig_spec(PREFIX_ENGINE, PREFIX_REPLICAS)
    found: list[float] = []
    for index in range(rounds):
        clients = PREFIX_MIXES[mix].clients_for(WINDOW_S, f"{mix}-{side}-{index}")
        found += twin.run(spec, clients, router(side, spec.engine, seed + index)).ttfts()
    return found


@dataclass(frozen=True)
class Replayed:
    """A side's TTFT p50 and p99 in the twin, in seconds: the median over seeds, and each seed's."""

    p50_s: float
    p99_s: float
    p50s: tuple[float, ...]
    p99s: tuple[float, ...]


def replay(bench: str, mix: str, side: str, seeds: Sequence[int] = (0, 1, 2)) -> Replayed:
    """``side`` of ``bench`` (``routing`` or ``prefix``) on ``mix`` in the twin, once per seed."""
    measure = routing_ttfts if bench == "routing" else prefix_ttfts
    runs = [sorted(measure(mix, side, 1000 * seed)) for seed in seeds]
    p50s = tuple(percentile(ttfts, 50) for ttfts in runs)
    p99s = tuple(percentile(ttfts, 99) for ttfts in runs)
    return Replayed(statistics.median(p50s), statistics.median(p99s), p50s, p99s)


@dataclass(frozen=True)
class RigFigure:
    """A side's TTFT p50 and p99 on the rig, in ms (None: the run did not report it), and where they come from."""

    bench: str
    mix: str
    side: str
    p50_ms: float | None
    p99_ms: float
    commit: str
    command: str


_ROUTING = "make bench-routing (3 windows of 40 s a side), docs/deploy.md"
_PREFIX = "make bench-prefix (3 windows of 40 s a side), docs/deploy.md"
_PREFIX_MORE = "bench/prefix_routing.py --mixes long-chat generated-chat, docs/deploy.md"

#: What the rig measured: the routing bench's last run reported p99s only.
RIG_FIGURES: tuple[RigFigure, ...] = (
    RigFigure("routing", "rare-long", "picker", None, 184, "38beb50", _ROUTING),
    RigFigure("routing", "rare-long", "picker-engine-metrics", None, 1176, "38beb50", _ROUTING),
    RigFigure("routing", "rare-long", "service", None, 1336, "38beb50", _ROUTING),
    RigFigure("routing", "frequent-long", "picker", None, 1532, "38beb50", _ROUTING),
    RigFigure("routing", "frequent-long", "picker-engine-metrics", None, 2072, "38beb50", _ROUTING),
    RigFigure("routing", "frequent-long", "service", None, 2525, "38beb50", _ROUTING),
    RigFigure("routing", "busy", "picker", None, 684, "38beb50", _ROUTING),
    RigFigure("routing", "busy", "picker-engine-metrics", None, 1071, "38beb50", _ROUTING),
    RigFigure("routing", "busy", "service", None, 1039, "38beb50", _ROUTING),
    RigFigure("prefix", "short-replies", "picker-prefix", 141, 355, "e20277b", _PREFIX),
    RigFigure("prefix", "short-replies", "picker", 170, 656, "e20277b", _PREFIX),
    RigFigure("prefix", "short-replies", "service", 155, 1037, "e20277b", _PREFIX),
    RigFigure("prefix", "chat", "picker-prefix", 181, 367, "e20277b", _PREFIX),
    RigFigure("prefix", "chat", "picker", 244, 1162, "e20277b", _PREFIX),
    RigFigure("prefix", "chat", "service", 255, 1287, "e20277b", _PREFIX),
    RigFigure("prefix", "one-prompt", "picker-prefix", 158, 611, "e20277b", _PREFIX),
    RigFigure("prefix", "one-prompt", "picker", 228, 921, "e20277b", _PREFIX),
    RigFigure("prefix", "one-prompt", "service", 252, 1210, "e20277b", _PREFIX),
    RigFigure("prefix", "busy-chat", "picker-prefix", 181, 471, "e20277b", _PREFIX),
    RigFigure("prefix", "busy-chat", "picker", 261, 1364, "e20277b", _PREFIX),
    RigFigure("prefix", "busy-chat", "service", 380, 2153, "e20277b", _PREFIX),
    RigFigure("prefix", "long-chat", "picker-prefix", 181, 260, "c6d41bd", _PREFIX_MORE),
    RigFigure("prefix", "long-chat", "picker", 258, 1871, "c6d41bd", _PREFIX_MORE),
    RigFigure("prefix", "long-chat", "service", 327, 1994, "c6d41bd", _PREFIX_MORE),
    RigFigure("prefix", "generated-chat", "picker-prefix", 188, 423, "c6d41bd", _PREFIX_MORE),
    RigFigure("prefix", "generated-chat", "picker", 223, 1096, "c6d41bd", _PREFIX_MORE),
    RigFigure("prefix", "generated-chat", "service", 218, 1262, "c6d41bd", _PREFIX_MORE),
)
