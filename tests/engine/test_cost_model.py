"""The cost model: compiled shapes cost what they compute and read, on every catalogued instance type."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuronfleet.contract.hardware import GIB, INSTANCE_TYPES, get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.sim.cost_model import CostModel

LLAMA_8B = get_shape("llama-3.1-8b")
TRN2_8B = CostModel(get_instance_type("trn2.48xlarge"), LLAMA_8B, tensor_parallel_size=8)


def fixed_prefill(cost: CostModel) -> float:
    return cost.calibration.host_dispatch_s + cost.shape.num_hidden_layers * cost.calibration.prefill_layer_s


def test_prefill_pays_fixed_costs_then_compute_on_the_padded_tokens() -> None:
    c = TRN2_8B.calibration
    # 2 x 6.98e9 layer weights x 4096 tokens, plus the output head, at the fitted share of 8 cores' 1334 TFLOPS.
    dense = (2 * 32 * LLAMA_8B.layer_parameters * 4096 + 2 * 4096 * 128256) / 1334e12
    # Causal attention: each of the 4096 positions over the ones before it.
    attention = 4 * 32 * 32 * 128 * 4096 * 2048 / 1334e12
    expected = fixed_prefill(TRN2_8B) + dense / c.dense_efficiency + attention / c.attention_efficiency
    assert TRN2_8B.prefill_seconds(4096, 0) == pytest.approx(expected, rel=1e-9)
    # The fixed costs dominate a short chunk: 128 tokens cost several times 1/32 of 4096.
    assert TRN2_8B.prefill_seconds(128, 0) > 5 * TRN2_8B.prefill_seconds(4096, 0) / 32


def test_two_chunks_cost_more_than_the_same_tokens_in_one_step() -> None:
    one = TRN2_8B.prefill_seconds(2048, 0)
    first, second = TRN2_8B.prefill_seconds(1024, 0), TRN2_8B.prefill_seconds(1024, 1024)
    # The second chunk attends over the first: causal attention adds up to the single step's, so the chunks
    # cost one more step's fixed costs (and one more output head).
    assert second > first
    assert first + second - one == pytest.approx(fixed_prefill(TRN2_8B), rel=1e-3)


@given(st.lists(st.integers(1, 4096), min_size=1, max_size=6))
def test_a_chunked_prompt_never_costs_less_than_one_step(chunks: list[int]) -> None:
    context, chunked = 0, 0.0
    for chunk in chunks:
        chunked += TRN2_8B.prefill_seconds(chunk, context)
        context += chunk
    assert chunked >= TRN2_8B.prefill_seconds(context, 0) * (1 - 1e-9)


@given(st.lists(st.tuples(st.integers(1, 2048), st.integers(0, 8192)), min_size=1, max_size=8))
def test_a_pack_never_costs_less_than_its_largest_member_alone(members: list[tuple[int, int]]) -> None:
    pack = TRN2_8B.packed_prefill_seconds(members)
    assert all(pack >= TRN2_8B.prefill_seconds(tokens, context) for tokens, context in members)


def test_decode_reads_the_weights_and_every_rows_compiled_context() -> None:
    c = TRN2_8B.calibration
    weights = (32 * LLAMA_8B.layer_parameters + 128256 * 4096) * 2
    fixed = c.host_dispatch_s + 32 * c.decode_layer_s
    assert TRN2_8B.decode_seconds(1, 0) == pytest.approx(fixed + weights / 5.8e12 / c.weight_read_efficiency)
    # Every row of the padded batch reads its compiled context of KV, however few tokens it holds.
    kv = 8 * 8192 * TRN2_8B.kv_bytes_per_token()
    assert TRN2_8B.decode_seconds(8, 8192) - TRN2_8B.decode_seconds(8, 0) == pytest.approx(
        kv / 5.8e12 / c.kv_read_efficiency
    )
    # A shorter compiled context (decode_context_length_buckets) reads less.
    assert TRN2_8B.decode_seconds(64, 1024) < TRN2_8B.decode_seconds(64, 8192) / 2


@pytest.mark.parametrize(
    ("shape", "instance", "tensor_parallel_size", "held"),
    [
        ("llama-3.1-8b", "trn2.48xlarge", 8, 8),
        # 8 KV heads over 64 cores: each held by 8 cores.
        ("llama-3.1-70b", "trn2.48xlarge", 64, 64),
        ("llama-3.1-70b", "inf2.48xlarge", 24, 24),
        # 40 heads over 24 cores: 2 a core, 48 in all.
        ("llama-2-13b", "inf2.48xlarge", 24, 48),
        ("llama-3.1-8b", "trn2.48xlarge", 1, 8),
    ],
)
def test_kv_heads_are_replicated_where_cores_outnumber_them(
    shape: str, instance: str, tensor_parallel_size: int, held: int
) -> None:
    cost = CostModel(get_instance_type(instance), get_shape(shape), tensor_parallel_size)
    assert cost.kv_heads_held == held
    assert cost.kv_bytes_per_token() == cost.shape.kv_bytes_per_token(2) * held // cost.shape.num_key_value_heads


def test_kv_cache_is_what_the_weights_leave() -> None:
    cost = CostModel(get_instance_type("inf2.xlarge"), LLAMA_8B, tensor_parallel_size=2)
    assert cost.kv_cache_bytes(0.9) == int(32 * GIB * 0.9) - LLAMA_8B.num_parameters * 2
    too_big = CostModel(get_instance_type("inf2.xlarge"), get_shape("llama-3.1-70b"), tensor_parallel_size=2)
    assert too_big.kv_cache_bytes(0.9) == 0


def test_tensor_parallelism_must_fit_the_instance() -> None:
    with pytest.raises(ValueError, match=r"tensor_parallel_size 4 does not fit inf2.xlarge \(2 NeuronCores\)"):
        CostModel(get_instance_type("inf2.xlarge"), LLAMA_8B, tensor_parallel_size=4)


def test_a_sensitivity_band_moves_one_constant() -> None:
    slower = CostModel(TRN2_8B.instance, LLAMA_8B, 8, calibration=TRN2_8B.calibration.scaled("dense_efficiency", 0.7))
    assert slower.prefill_seconds(2048, 0) > TRN2_8B.prefill_seconds(2048, 0)
    assert slower.decode_seconds(8, 2048) == TRN2_8B.decode_seconds(8, 2048)
    with pytest.raises(ValueError, match="unknown constant 'speed'"):
        TRN2_8B.calibration.scaled("speed", 2)


@pytest.mark.parametrize("name", list(INSTANCE_TYPES))
def test_every_instance_type_takes_a_replica_on_one_core_and_on_all(name: str) -> None:
    instance = get_instance_type(name)
    one, whole = (CostModel(instance, LLAMA_8B, tensor_parallel_size=tp) for tp in (1, instance.cores))
    assert whole.peak_flops == pytest.approx(instance.devices * instance.chip.bf16_tflops * 1e12)
    assert whole.hbm_bytes == instance.devices * instance.chip.hbm_bytes
    # A whole instance streams the weights faster than one core does.
    assert 0 < whole.decode_seconds(1, 0) < one.decode_seconds(1, 0)


def test_at_lnc_1_a_logical_core_is_one_physical_core_so_a_tp_holds_half_the_device() -> None:
    trn2 = get_instance_type("trn2.48xlarge")
    alone = CostModel(trn2, LLAMA_8B, tensor_parallel_size=8, logical_neuron_cores=1)
    # TP 8 at LNC 1 is one device: the hardware of TP 4 at the default LNC 2, half that of TP 8 there.
    paired_4 = CostModel(trn2, LLAMA_8B, tensor_parallel_size=4)
    assert (alone.peak_flops, alone.hbm_bandwidth, alone.hbm_bytes) == (
        paired_4.peak_flops,
        paired_4.hbm_bandwidth,
        paired_4.hbm_bytes,
    )
    assert alone.prefill_seconds(4096, 0) > TRN2_8B.prefill_seconds(4096, 0)
    # A whole node holds twice the tensor parallelism.
    assert (
        CostModel(trn2, LLAMA_8B, tensor_parallel_size=128, logical_neuron_cores=1).hbm_bytes
        == 16 * trn2.chip.hbm_bytes
    )
    with pytest.raises(ValueError, match=r"does not fit trn2.48xlarge \(64 NeuronCores\)"):
        CostModel(trn2, LLAMA_8B, tensor_parallel_size=128)
