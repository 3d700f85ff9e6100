"""Every metric series one process writes and another reads, defined once.

An engine's ``/metrics`` is read by the Endpoint Picker (to choose a replica), by Prometheus for KEDA (to scale),
by the operator's canary analysis, and by the bucket recommender. Each reader takes the series' name from here,
as does the engine where it writes one of its own (``engine/scheduler/metrics.py``, ``engine/serving/readiness.py``;
vLLM writes its own). ``tests/contract/test_metric_series.py`` fails on a series name spelled anywhere else in the
shipped code. Standard library only: the operator and the dev harness import it without vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram", "info"]

#: vLLM's gauges, published as each engine step ends: its queue, its batch, and how full its KV cache is.
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
#: An info series (value 1): the KV cache's capacity in tokens is the product of these two labels.
CACHE_CONFIG = "vllm:cache_config_info"
BLOCK_SIZE_LABEL = "block_size"
NUM_BLOCKS_LABEL = "num_gpu_blocks"
#: vLLM's running and waiting LoRA adapters, exported when the engine has LoRA slots.
LORA_INFO = "vllm:lora_requests_info"
#: vLLM's latency and prompt histograms.
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
PROMPT_TOKENS = "vllm:request_prompt_tokens"
#: The engine's own live count of the completions it holds (admitted and not yet answered): vLLM's gauges change
#: only as a step ends, so a replica in a long prefill looks idle in them for the whole prefill.
REQUESTS_IN_FLIGHT = "neuronfleet:requests_in_flight"
#: The Neuron scheduler's prefill padding (a counter: ``_total`` in the exposition) and prefill chunk lengths.
PADDING_TOKENS = "neuronfleet:padding_tokens"
PREFILL_CHUNK_TOKENS = "neuronfleet:prefill_chunk_tokens"
#: Seconds a replica spent starting, by ``phase`` (``contract/start_time.py``'s phases).
REPLICA_START_SECONDS = "neuronfleet:replica_start_seconds"

#: Seconds the device spent in steps, by step ``kind`` (a counter: ``_total``): the load the warm floor sizes for.
DEVICE_BUSY_SECONDS = "neuronfleet:device_busy_seconds"
#: The Neuron scheduler's prompt tokens still to prefill (waiting and running requests): the token-aware signal.
PREFILL_TOKENS_PENDING = "neuronfleet:prefill_tokens_pending"
#: A replica's fastest prefill bucket's tokens per second, as its warm-up timed it.
PREFILL_TOKENS_PER_SECOND = "neuronfleet:prefill_tokens_per_second"

#: Every series the engine exports for GIE v1.5.0's default picker.
PICKER_METRICS = (WAITING, RUNNING, KV_CACHE_USAGE, CACHE_CONFIG)


@dataclass(frozen=True)
class Series:
    """One series that crosses a process boundary: what it is, who writes it, who reads it."""

    name: str
    kind: Kind
    writer: str
    readers: tuple[str, ...]


SERIES = (
    Series(WAITING, "gauge", "vLLM's engine core", ("the Endpoint Picker", "KEDA's ScaledObject", "the fleet twin")),
    Series(RUNNING, "gauge", "vLLM's engine core", ("GIE's default picker",)),
    Series(KV_CACHE_USAGE, "gauge", "vLLM's engine core", ("the Endpoint Picker", "KEDA's ScaledObject")),
    Series(CACHE_CONFIG, "info", "vLLM's engine core", ("the Endpoint Picker (prefix cache capacity)",)),
    Series(LORA_INFO, "gauge", "vLLM's engine core", ("the Endpoint Picker (LoRA affinity)",)),
    Series(TIME_TO_FIRST_TOKEN, "histogram", "vLLM's API server", ("KEDA's TTFT guard", "the canary analysis")),
    Series(INTER_TOKEN_LATENCY, "histogram", "vLLM's API server", ("the canary analysis",)),
    Series(PROMPT_TOKENS, "histogram", "vLLM's API server", ("the bucket recommender",)),
    Series(
        REQUESTS_IN_FLIGHT,
        "gauge",
        "the engine's drain gate",
        ("the operator's Endpoint Picker", "the operator's scale-in"),
    ),
    Series(PADDING_TOKENS, "counter", "the Neuron scheduler", ("the canary analysis",)),
    Series(
        PREFILL_CHUNK_TOKENS, "histogram", "the Neuron scheduler", ("the canary analysis", "the bucket recommender")
    ),
    Series(REPLICA_START_SECONDS, "gauge", "the simulated device", ("dashboards", "KEDA's warm floor")),
    Series(
        DEVICE_BUSY_SECONDS,
        "counter",
        "the simulated device, else the Neuron scheduler",
        ("KEDA's warm floor", "the fleet twin"),
    ),
    Series(PREFILL_TOKENS_PENDING, "gauge", "the Neuron scheduler", ("KEDA's prefill backlog", "the fleet twin")),
    Series(PREFILL_TOKENS_PER_SECOND, "gauge", "the simulated device", ("KEDA's prefill backlog",)),
)
