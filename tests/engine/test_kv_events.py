"""KV cache events from the Neuron scheduler, as vLLM publishes them (``--kv-events-config``): what a
precise prefix-aware router (llm-d's KV-cache scorer) learns from them is what the scheduler's prefix
cache holds, block for block, through reuse and eviction."""

from __future__ import annotations

import json

import pytest
from harness.kv_events import replayed
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash

from neuronfleet.contract.config import EngineConfig
from neuronfleet.devcluster.process.managed import free_ports
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.engine.offline.driver import OfflineEngine, build_vllm_config, construct_scheduler
from neuronfleet.engine.scheduler.neuron import NeuronScheduler
from neuronfleet.engine.serving.serve import kv_events_config

pytestmark = pytest.mark.vllm_matrix

BLOCK = 16
SMALL = EngineConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=512, block_size=BLOCK)
#: Room for about three conversations: the later ones evict the earlier ones' blocks.
KV_BLOCKS = 40


def published(replay: str) -> tuple[set[object], int, int]:
    """The blocks the events leave cached, and how many were stored and removed, from the replay socket."""
    live: set[object] = set()
    stored = removed = 0
    for batch in replayed(replay):
        for event in batch.events:
            if isinstance(event, BlockStored):
                live.update(event.block_hashes)
                stored += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                live.difference_update(event.block_hashes)
                removed += len(event.block_hashes)
    return live, stored, removed


def test_the_published_blocks_are_the_blocks_the_scheduler_caches() -> None:
    port, replay_port = free_ports(2)
    vllm_config = build_vllm_config(SMALL, async_scheduling=False, enable_prefix_caching=True)
    # What `neuronfleet-engine serve --kv-events-port` hands vLLM.
    vllm_config.kv_events_config = KVEventsConfig(**json.loads(kv_events_config(port, replay_port)))
    scheduler = construct_scheduler(NeuronScheduler, vllm_config, num_kv_blocks=KV_BLOCKS)
    try:
        engine = OfflineEngine(scheduler)
        # Conversations that share a system prompt, each growing turn by turn: blocks are stored, found
        # again, and evicted once the cache is full.
        system = list(range(1, 3 * BLOCK + 1))
        for conversation in range(12):
            history = system + [1000 + conversation] * BLOCK
            for turn in range(3):
                history = history + [2000 + 10 * conversation + turn] * BLOCK
                engine.add_request(f"c{conversation}-t{turn}", history, max_tokens=4)
                engine.run()
        pool = scheduler.kv_cache_manager.block_pool
        cached = {maybe_convert_block_hash(get_block_hash(key)) for key in pool.cached_block_hash_to_block._cache}
        # The publisher sends from a thread of its own: the last batches may still be on their way.
        _, stored, removed = wait_for(
            lambda: published(f"tcp://127.0.0.1:{replay_port}"),
            lambda events: events[0] == cached,
            timeout=10,
            what="the blocks the events leave cached to be the scheduler's",
            show=lambda events: (events[1:], sorted(map(str, events[0] ^ cached))),
        )
        print(f"    {stored} blocks stored, {removed} removed, {len(cached)} cached at the end")
        assert removed > 0, "nothing was evicted: the test did not reach a full cache"
        # The shared system prompt is cached once, whoever asked for it first.
        assert len(cached) <= KV_BLOCKS
    finally:
        scheduler.shutdown()
