"""The Endpoint Picker's scoring, declared once: which scorers a service's picker adds up, each one's weight and
parameters, and the plugin that produces what a scorer reads.

The operator renders GIE's ``EndpointPickerConfig`` from :meth:`PickerScoring.scorers`
(``neuronfleet.operator.plan.routing.picker_config``); the fleet twin scores its replicas with the same list
(``neuronfleet.engine.fleet.picker``, which has a rule for every scorer type named here), so the twin and the
picker a service runs cannot weigh differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from neuronfleet.contract.config import EngineConfig

#: GIE's load scorers: the waiting queue, the running requests (read from our live in-flight gauge), KV use.
QUEUE_SCORER = "queue-scorer"
RUNNING_REQUESTS_SCORER = "running-requests-size-scorer"
KV_CACHE_SCORER = "kv-cache-utilization-scorer"
#: Each load scorer and its weight: every picker adds these up.
LOAD_SCORER_WEIGHTS: Mapping[str, float] = {QUEUE_SCORER: 2.0, RUNNING_REQUESTS_SCORER: 1.0, KV_CACHE_SCORER: 1.0}
#: GIE's approximate prefix-cache scorer (its producer plugin comes with it: the config loader adds it).
PREFIX_SCORER = "prefix-cache-scorer"
#: GIE's LoRA affinity scorer, and its weight beside load's (the waiting queue weighs 2).
LORA_SCORER, LORA_AFFINITY_WEIGHT = "lora-affinity-scorer", 1.0
#: The scorer of neuronfleet's picker build (``tools/gie/epp``): the tokens the picker itself has sent each replica
#: and not yet seen answered, counted by GIE's producer; the scorer's weight is the waiting queue's.
INFLIGHT_TOKENS_SCORER, INFLIGHT_TOKENS_PRODUCER, INFLIGHT_TOKENS_WEIGHT = (
    "inflight-tokens-scorer",
    "inflight-load-producer",
    2.0,
)
#: What GIE's producer counts for each prompt token: the token (it estimates 4 bytes each), and 1.5 more for the
#: output it expects. The scorer's full step (``stepTokens``) is in the producer's count.
INFLIGHT_TOKENS_PER_PROMPT_TOKEN = 2.5
#: The engines' KV block size and prefill step when a caller names none.
DEFAULT_BLOCK_SIZE, DEFAULT_STEP_TOKENS = EngineConfig().block_size, EngineConfig().max_num_batched_tokens


@dataclass(frozen=True)
class Scorer:
    """One scorer of the picker's profile: its plugin type, its weight, its parameters, and the plugin (listed before
    it) that produces what it reads."""

    type: str
    weight: float
    parameters: Mapping[str, object] = field(default_factory=dict)
    producer: str | None = None


@dataclass(frozen=True)
class PickerScoring:
    """What a service's picker weighs besides its replicas' load figures.

    ``prefix_cache_weight``: locality (``spec.routing.prefixCacheWeight``), in ``block_size`` token blocks, the
    engines' KV block. ``lora_affinity``: a service with LoRA slots. ``inflight_tokens``: the picker image has
    :data:`INFLIGHT_TOKENS_SCORER`, which scores a replica's tokens in flight against a full prefill step of
    ``step_tokens`` (the engines' ``max_num_batched_tokens``).
    """

    prefix_cache_weight: float = 0.0
    block_size: int = DEFAULT_BLOCK_SIZE
    lora_affinity: bool = False
    inflight_tokens: bool = False
    step_tokens: int = DEFAULT_STEP_TOKENS

    def scorers(self) -> list[Scorer]:
        """The profile's scorers in the order the config lists them: load's, then tokens in flight, prefix-cache
        locality and LoRA affinity where this scoring weighs them."""
        found = [Scorer(name, weight) for name, weight in LOAD_SCORER_WEIGHTS.items()]
        if self.inflight_tokens:
            # A replica scores 1 less what it holds beyond the least loaded, over the candidates' spread or a full
            # prefill step, whichever is larger: one short request in flight does not outweigh a cached prefix.
            step = round(self.step_tokens * INFLIGHT_TOKENS_PER_PROMPT_TOKEN)
            found.append(
                Scorer(INFLIGHT_TOKENS_SCORER, INFLIGHT_TOKENS_WEIGHT, {"stepTokens": step}, INFLIGHT_TOKENS_PRODUCER)
            )
        if self.prefix_cache_weight:
            # Hashing prompts in the engines' KV blocks until ``autoTune`` reads each engine's own block size and
            # cache capacity from its ``vllm:cache_config_info``.
            parameters = {"autoTune": True, "blockSizeTokens": self.block_size}
            found.append(Scorer(PREFIX_SCORER, self.prefix_cache_weight, parameters))
        if self.lora_affinity:
            found.append(Scorer(LORA_SCORER, LORA_AFFINITY_WEIGHT))
        return found
