"""How long a Neuron replica takes to start, phase by phase: weights fetched, loaded, sharded; graphs; warm-up.

The simulated device spends this time before it serves (scaled by its ``start_time_scale``), the fleet twin
uses it as a new replica's start time, and the operator sizes the startup probe and the rollout's progress
deadline from it, so that a large model is never restarted while it loads. ``docs/engine.md`` ("Replica start
time") gives every figure's source.

- **fetch**: the weights from where the model lives to the node's disk, at the store's throughput.
- **load** and **shard**: fitted on the one published measurement with phases, NxD Inference's weights-sharding
  guide (Llama 3.1 405B, BF16, trn2.48xlarge, NVMe instance storage): from pre-sharded files, 108 s of loading;
  sharding on load (the default since Neuron 2.23), 187 s of loading, 49 s of it sharding. The rates are per
  node, whatever the tensor parallelism: the guide gives one size only.
- **graphs**: the artifact's NEFFs onto the device. No load time is published per graph, so they are read at the
  pre-sharded weights' rate.
- **warm-up**: one step of every compiled graph (vLLM Neuron runs each once before it serves); the caller times
  them, since the step costs belong to the device.

Standard library only: the operator imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

from neuronfleet.contract.model_shapes import SHAPES, get_shape, shape_for_model

#: Where a replica's weights come from: the Hugging Face Hub, S3, a shared volume, or the node's own disk.
StoreKind = Literal["hf", "s3", "pvc", "local"]

_MB = 1e6
#: Bytes per second one replica fetches weights at, by store (``docs/engine.md`` gives the sources).
FETCH_BYTES_PER_S: dict[StoreKind, float] = {
    # hf_transfer's stated "up to 500 MB/s" on a well-connected machine (huggingface_hub's environment docs).
    "hf": 500 * _MB,
    # S3's per-request throughput (about 85-90 MB/s) times 16 parallel ranged reads: a bounded client, well
    # under the 100 Gb/s one instance can reach with enough of them (S3 performance guidelines).
    "s3": 16 * 85 * _MB,
    # A shared file system's throughput per client: EFS's 1,500 MiB/s read ceiling per client.
    "pvc": 1500 * 2**20,
    # Already on the node.
    "local": math.inf,
}

#: The weights-sharding guide's model: Llama 3.1 405B in BF16.
_GUIDE_BYTES = get_shape("llama-3.1-405b").num_parameters * 2
#: Loading pre-sharded weights onto the devices: 108 s for the guide's model.
LOAD_PRESHARDED_BYTES_PER_S = _GUIDE_BYTES / 108.0
#: Loading a checkpoint that is sharded on load, sharding aside: 187 s - 49 s.
LOAD_CHECKPOINT_BYTES_PER_S = _GUIDE_BYTES / (187.0 - 49.0)
#: Sharding on load: 49 s.
SHARD_BYTES_PER_S = _GUIDE_BYTES / 49.0

#: Bytes per weight the operator assumes for a replica's start: BF16, as every published row.
BF16_BYTES = 2


@dataclass(frozen=True)
class StartTime:
    """Seconds a replica spends in each phase before it serves."""

    fetch_s: float
    load_s: float
    shard_s: float
    graphs_s: float
    warmup_s: float

    @property
    def total_s(self) -> float:
        """Seconds from the container's start to serving."""
        return self.fetch_s + self.load_s + self.shard_s + self.graphs_s + self.warmup_s

    def phases(self) -> dict[str, float]:
        """Each phase's seconds by its name (``fetch``, ``load``, ``shard``, ``graphs``, ``warmup``)."""
        return {field.name.removesuffix("_s"): getattr(self, field.name) for field in fields(self)}

    def scaled(self, factor: float) -> StartTime:
        """Every phase times ``factor`` (the simulated device's ``start_time_scale``)."""
        return StartTime(*(seconds * factor for seconds in self.phases().values()))

    def describe(self) -> str:
        """One line: the total, then each phase."""
        phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases().items())
        return f"{self.total_s:.1f} s ({phases})"


def weights_store(model_uri: str) -> StoreKind:
    """Where the weights of ``model_uri`` are fetched from: ``hf://`` the Hub, ``s3://`` S3, else the node."""
    if model_uri.startswith("hf://"):
        return "hf"
    if model_uri.startswith("s3://"):
        return "s3"
    return "local"


def predict_start(
    weights_bytes: int,
    store: StoreKind,
    *,
    graphs_bytes: int = 0,
    warmup_s: float = 0.0,
    presharded: bool = False,
) -> StartTime:
    """A replica's start: ``weights_bytes`` fetched from ``store`` and loaded (sharded on load unless
    ``presharded``), ``graphs_bytes`` of NEFFs loaded, and ``warmup_s`` of warm-up steps."""
    if weights_bytes < 0 or graphs_bytes < 0 or warmup_s < 0:
        raise ValueError("weights, graphs and warm-up must not be negative")
    load_rate = LOAD_PRESHARDED_BYTES_PER_S if presharded else LOAD_CHECKPOINT_BYTES_PER_S
    return StartTime(
        fetch_s=weights_bytes / FETCH_BYTES_PER_S[store],
        load_s=weights_bytes / load_rate,
        shard_s=0.0 if presharded else weights_bytes / SHARD_BYTES_PER_S,
        graphs_s=graphs_bytes / LOAD_PRESHARDED_BYTES_PER_S,
        warmup_s=warmup_s,
    )


def predict_model_start(model_uri: str) -> StartTime | None:
    """The weights' part of a replica's start for ``model_uri`` in BF16, when its name is a known shape's (the
    graphs and warm-up, seconds at most, left out); None for a model of unknown size."""
    shape = shape_for_model(model_uri)
    if shape == "tiny":
        return None
    return predict_start(SHAPES[shape].num_parameters * BF16_BYTES, weights_store(model_uri))
