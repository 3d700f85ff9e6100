"""The cost model: compute-bound prefill, memory-bound decode, on every catalogued instance type."""

from __future__ import annotations

import pytest

from neuronfleet.engine.hardware import GIB, INSTANCE_TYPES, get_instance_type
from neuronfleet.engine.sim.cost_model import STEP_OVERHEAD_S, CostModel
from neuronfleet.engine.sim.model_shapes import get_shape

LLAMA_8B = get_shape("llama-3.1-8b")


def test_prefill_is_compute_bound_on_the_padded_tokens() -> None:
    cost = CostModel(get_instance_type("trn2.48xlarge"), LLAMA_8B, tensor_parallel_size=8)
    short, long = cost.prefill_seconds(1024, 0), cost.prefill_seconds(4096, 0)
    # Four times the padded tokens: about four times the compute (attention grows faster).
    assert 3.9 < (long - STEP_OVERHEAD_S) / (short - STEP_OVERHEAD_S) < 5
    # 2 * 8.03e9 * 4096 FLOP at half of 8 cores' 1334 TFLOPS: about 0.1 s.
    assert 0.08 < long < 0.12


def test_decode_is_bound_by_reading_weights_and_kv() -> None:
    cost = CostModel(get_instance_type("trn2.48xlarge"), LLAMA_8B, tensor_parallel_size=8)
    weights_only = cost.decode_seconds(1, 0)
    # 16 GB of weights at 70% of 5.8 TB/s, plus the overhead: about 5 ms a token.
    assert weights_only == pytest.approx(STEP_OVERHEAD_S + 16.06e9 / (5.8e12 * 0.7), rel=0.01)
    # A larger padded batch reads the same bytes; more context reads more KV.
    assert cost.decode_seconds(8, 0) == pytest.approx(weights_only)
    kv = LLAMA_8B.kv_bytes_per_token(2) * 100_000
    assert cost.decode_seconds(1, 100_000) - weights_only == pytest.approx(kv / (5.8e12 * 0.7), rel=0.01)


def test_kv_cache_is_what_the_weights_leave() -> None:
    cost = CostModel(get_instance_type("inf2.xlarge"), LLAMA_8B, tensor_parallel_size=2)
    assert cost.kv_cache_bytes(0.9) == int(32 * GIB * 0.9) - LLAMA_8B.num_parameters * 2
    too_big = CostModel(get_instance_type("inf2.xlarge"), get_shape("llama-3.1-70b"), tensor_parallel_size=2)
    assert too_big.kv_cache_bytes(0.9) == 0


def test_tensor_parallelism_must_fit_the_instance() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size 4 does not fit inf2.xlarge \(2 NeuronCores\)"):
        CostModel(get_instance_type("inf2.xlarge"), LLAMA_8B, tensor_parallel_size=4)


@pytest.mark.parametrize("name", list(INSTANCE_TYPES))
def test_every_instance_type_takes_a_replica_on_one_core_and_on_all(name: str) -> None:
    instance = get_instance_type(name)
    one, whole = (CostModel(instance, LLAMA_8B, tensor_parallel_size=tp) for tp in (1, instance.cores))
    assert whole.peak_flops == pytest.approx(instance.devices * instance.chip.bf16_tflops * 1e12)
    assert whole.hbm_bytes == instance.devices * instance.chip.hbm_bytes
    # A whole instance streams the weights faster than one core does.
    assert 0 < whole.decode_seconds(1, 0) < one.decode_seconds(1, 0)
