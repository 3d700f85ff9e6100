"""Scripted workloads for the trace tool and the scheduler tests.

The first four are the examples of the Neuron scheduler design; the others show
its admission rules at work. They run the reference scheduler's behaviour
(``REFERENCE_SCHEDULER``), so the trace shows the design as written.
``neuronfleet.engine.offline.driver.run_scenario`` runs one on the real vLLM scheduler.
This module is plain data: listing scenarios does not import vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from neuronfleet.contract.config import REFERENCE_SCHEDULER, EngineConfig
from neuronfleet.contract.model_shapes import TINY_VOCAB_SIZE


@dataclass(frozen=True)
class ScenarioRequest:
    """One request of a scenario."""

    req_id: str
    prompt_len: int
    max_tokens: int
    #: Added before this step is scheduled.
    arrival_step: int = 0
    #: Leading prompt tokens shared by every request with the same ``prefix_len``.
    prefix_len: int = 0


@dataclass(frozen=True)
class Scenario:
    """A configuration and a request script."""

    name: str
    summary: str
    engine: EngineConfig
    num_kv_blocks: int
    requests: tuple[ScenarioRequest, ...]
    enable_prefix_caching: bool = False


def prompt_token_ids(request: ScenarioRequest) -> list[int]:
    """Deterministic prompt tokens; the first ``prefix_len`` are common to all requests."""
    shared = [(i * 7919) % (TINY_VOCAB_SIZE - 1) + 1 for i in range(request.prefix_len)]
    seed = sum(request.req_id.encode())
    own = [
        (seed * 104729 + i * 15485863) % (TINY_VOCAB_SIZE - 1) + 1
        for i in range(request.prompt_len - request.prefix_len)
    ]
    return shared + own


DESIGN_BUCKETS = [512, 1024, 2048, 4096, 8192]

SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            name="prompt-200",
            summary="A 200-token prompt runs in the 256-token prefill bucket, then decodes.",
            engine=EngineConfig(
                scheduler=REFERENCE_SCHEDULER, max_num_seqs=8, max_num_batched_tokens=8192, max_model_len=8192
            ),
            num_kv_blocks=1024,
            requests=(ScenarioRequest("req_0", prompt_len=200, max_tokens=4),),
        ),
        Scenario(
            name="prompt-5000",
            summary="A 5000-token prompt is padded to 8192; num_computed_tokens advances by 5000, not 8192.",
            engine=EngineConfig(
                scheduler=REFERENCE_SCHEDULER,
                max_num_seqs=8,
                max_num_batched_tokens=8192,
                max_model_len=131072,
                num_batched_tokens_buckets=DESIGN_BUCKETS,
            ),
            num_kv_blocks=8192,
            requests=(ScenarioRequest("req_0", prompt_len=5000, max_tokens=3),),
        ),
        Scenario(
            name="prompt-32000",
            summary="A 32000-token prompt is chunked by max_num_batched_tokens=8192 over 4 prefill steps.",
            engine=EngineConfig(
                scheduler=REFERENCE_SCHEDULER,
                max_num_seqs=8,
                max_num_batched_tokens=8192,
                max_model_len=131072,
                num_batched_tokens_buckets=DESIGN_BUCKETS,
            ),
            num_kv_blocks=8192,
            requests=(ScenarioRequest("req_0", prompt_len=32000, max_tokens=2),),
        ),
        Scenario(
            name="prefix-cache",
            summary=("A 5000-token prompt whose first 1000 tokens are cached computes 4000 tokens, padded to 4096."),
            # Block size 8 puts the 1000-token prefix on a block boundary.
            engine=EngineConfig(
                scheduler=REFERENCE_SCHEDULER,
                max_num_seqs=8,
                max_num_batched_tokens=8192,
                max_model_len=8192,
                block_size=8,
            ),
            num_kv_blocks=4096,
            requests=(
                ScenarioRequest("warm", prompt_len=1016, max_tokens=1, prefix_len=1000),
                ScenarioRequest("req_0", prompt_len=5000, max_tokens=2, prefix_len=1000, arrival_step=2),
            ),
            enable_prefix_caching=True,
        ),
        Scenario(
            name="decode-hidden",
            summary="Running decodes are hidden while a new prompt prefills, then resume together.",
            engine=EngineConfig(
                scheduler=REFERENCE_SCHEDULER, max_num_seqs=4, max_num_batched_tokens=2048, max_model_len=8192
            ),
            num_kv_blocks=2048,
            requests=(
                ScenarioRequest("req_0", prompt_len=100, max_tokens=8),
                ScenarioRequest("req_1", prompt_len=300, max_tokens=8),
                ScenarioRequest("req_2", prompt_len=5000, max_tokens=4, arrival_step=4),
            ),
        ),
        Scenario(
            name="kv-deadlock",
            summary=(
                "max_num_seqs=8 but the KV cache holds 2 requests at max_model_len: "
                "later prompts wait while decodes run, so nothing stalls."
            ),
            engine=EngineConfig(
                scheduler=REFERENCE_SCHEDULER,
                max_num_seqs=8,
                max_num_batched_tokens=1024,
                max_model_len=1024,
                block_size=16,
            ),
            # 64 blocks per request at max_model_len: 160 blocks hold 2.
            num_kv_blocks=160,
            requests=tuple(ScenarioRequest(f"req_{i}", prompt_len=100, max_tokens=6) for i in range(4)),
        ),
    )
}
