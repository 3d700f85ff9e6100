"""The deployments every simulated-device benchmark runs on, and the SLO each one's users hold it to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from neuronfleet.contract.config import EngineConfig, SchedulerOptions
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.sim.calibration import Calibration
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning.prefill_cap import resolve_prefill_cap

BLOCK_SIZE = 32
MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class Deployment:
    """A replica's hardware and limits, and the SLO its users hold it to."""

    name: str
    instance_type: str
    shape: str
    tensor_parallel_size: int
    max_num_seqs: int
    ttft_slo_s: float
    itl_slo_s: float

    def cost(self, calibration: Calibration | None = None) -> CostModel:
        """The replica's step times (its chip's fitted constants unless ``calibration``)."""
        return CostModel(
            get_instance_type(self.instance_type),
            get_shape(self.shape),
            self.tensor_parallel_size,
            calibration=calibration,  # type: ignore[arg-type]
        )

    def engine(self, scheduler: SchedulerOptions, cost: CostModel, **limits: object) -> EngineConfig:
        """The serving configuration: default buckets, ``limits`` over 8192-token ones, ``auto`` derived."""
        engine = EngineConfig.model_validate(
            {
                "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": 8192,
                "max_model_len": 8192,
                "block_size": BLOCK_SIZE,
                "tensor_parallel_size": self.tensor_parallel_size,
                "scheduler": scheduler,
                **limits,
            }
        )
        return resolve_prefill_cap(engine, cost)


def prefill_cap(engine: EngineConfig) -> int:
    """The cap a derived configuration runs with, 0 for none."""
    cap = engine.scheduler.max_prefill_tokens_while_decoding
    assert cap != "auto", "derive the cap first (Deployment.engine does)"
    return cap or 0


def scheduler_options(packed: int, cap_setting: int | str | None, cap: int) -> str:
    """How a table names a row's packing and prefill cap (after its first option): ``, 8 packed, cap auto (1024)``."""
    text = f", {packed} packed" if packed > 1 else ""
    return text + (f", cap auto ({cap or 'none'})" if cap_setting is not None else "")


def scheduler_fields(packed: int, cap_setting: int | str | None, cap: int) -> dict[str, Any]:
    """A row's packing and prefill cap, as its JSON gives them."""
    return {
        "max_prefills_per_step": packed,
        "max_prefill_tokens_while_decoding": (cap or None) if cap_setting else None,
        "auto": cap_setting is not None,
    }


def num_kv_blocks(cost: CostModel) -> int:
    """KV blocks the replica's HBM holds beside the weights, every replicated KV head counted."""
    return cost.kv_cache_bytes(MEMORY_UTILIZATION) // (cost.kv_bytes_per_token() * BLOCK_SIZE)


# The SLOs: an interactive chat's TTFT for the 8B, longer for the 70Bs; an ITL above each deployment's shortest
# stall (the smallest prefill bucket's step and a decode step of the largest batch: 75 ms for the 8B, 177 and 181
# ms for the 70Bs), so that a scheduler can meet it.
DEPLOYMENTS = (
    Deployment("8B TP 8, trn2.48xlarge", "trn2.48xlarge", "llama-3.1-8b", 8, 64, 1.0, 0.1),
    Deployment("70B TP 64, trn2.48xlarge", "trn2.48xlarge", "llama-3.1-70b", 64, 64, 2.0, 0.25),
    Deployment("70B TP 24, inf2.48xlarge", "inf2.48xlarge", "llama-3.1-70b", 24, 32, 3.0, 0.25),
)
