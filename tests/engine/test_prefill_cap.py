"""``max_prefill_tokens_while_decoding: auto``: the cap derived from a deployment's step times."""

from __future__ import annotations

import pytest

from neuronfleet.contract.config import EngineConfig, SchedulerOptions
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.cli.serve import resolve_on_neuron
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning.prefill_cap import DEFAULT_STALL_MARGIN, derive_prefill_cap, resolve_prefill_cap


def deployment(
    instance: str, shape: str, tensor_parallel_size: int, **scheduler: object
) -> tuple[EngineConfig, CostModel]:
    engine = EngineConfig(
        max_num_seqs=64,
        max_model_len=8192,
        tensor_parallel_size=tensor_parallel_size,
        scheduler=SchedulerOptions.model_validate(scheduler),
    )
    return engine, CostModel(get_instance_type(instance), get_shape(shape), tensor_parallel_size)


@pytest.mark.parametrize(
    ("instance", "shape", "tensor_parallel_size", "cap"),
    [
        # The shortest stall is a fixed-cost prefill beside a decode step; the cap keeps a stall within 1.25x it.
        ("trn2.48xlarge", "llama-3.1-8b", 8, 512),
        ("trn2.48xlarge", "llama-3.1-70b", 64, 1024),
        ("inf2.48xlarge", "llama-3.1-70b", 24, 256),
    ],
)
def test_without_a_target_the_cap_keeps_a_stall_within_a_quarter_of_the_shortest(
    instance: str, shape: str, tensor_parallel_size: int, cap: int
) -> None:
    engine, cost = deployment(instance, shape, tensor_parallel_size)
    assert derive_prefill_cap(engine, cost) == cap
    buckets = engine.effective_num_batched_tokens_buckets
    decode = cost.decode_seconds(64, 8192)
    shortest = cost.prefill_seconds(buckets[0], 0) + decode
    above = buckets[buckets.index(cap) + 1]
    assert cost.prefill_seconds(cap, 0) + decode <= DEFAULT_STALL_MARGIN * shortest
    assert cost.prefill_seconds(above, 0) + decode > DEFAULT_STALL_MARGIN * shortest


def test_a_costlier_fixed_prefill_cost_does_not_raise_the_cap_past_what_the_stall_allows() -> None:
    # Trainium2's per-layer prefill cost doubled (inside its leave-one-out spread): a ratio of prefill steps would
    # allow 2,048 tokens (under twice a smallest step that is itself long); the stall bound keeps 1,024.
    engine, fitted = deployment("trn2.48xlarge", "llama-3.1-8b", 8)
    slower = CostModel(fitted.instance, fitted.shape, 8, calibration=fitted.calibration.scaled("prefill_layer_s", 2))
    assert slower.prefill_seconds(2048, 0) <= 2 * slower.prefill_seconds(128, 0)
    assert derive_prefill_cap(engine, slower) == 1024


def test_an_itl_target_fits_a_prefill_step_beside_a_full_decode_step() -> None:
    engine, cost = deployment("trn2.48xlarge", "llama-3.1-8b", 8, itl_target_ms=100)
    decode = cost.decode_seconds(64, 8192)
    cap = derive_prefill_cap(engine, cost)
    assert cap == 1024
    assert cost.prefill_seconds(1024, 0) + decode <= 0.1 < cost.prefill_seconds(2048, 0) + decode


def test_no_cap_where_it_cannot_help() -> None:
    # Not even the smallest bucket fits beside a decode step: chunking would only add steps.
    tight, cost = deployment("trn2.48xlarge", "llama-3.1-8b", 8, itl_target_ms=60)
    assert derive_prefill_cap(tight, cost) is None
    # Every bucket fits: a cap at the largest is no cap.
    loose, _ = deployment("trn2.48xlarge", "llama-3.1-8b", 8, itl_target_ms=10_000)
    assert derive_prefill_cap(loose, cost) is None


def test_resolve_replaces_auto_only() -> None:
    engine, cost = deployment("trn2.48xlarge", "llama-3.1-8b", 8)
    assert resolve_prefill_cap(engine, cost).scheduler.max_prefill_tokens_while_decoding == 512
    for chosen in (512, None):
        given = engine.model_copy(update={"scheduler": SchedulerOptions(max_prefill_tokens_while_decoding=chosen)})
        assert resolve_prefill_cap(given, cost) == given


def test_on_neuron_serve_derives_it_for_an_architecture_it_knows() -> None:
    engine = EngineConfig(max_num_seqs=64, max_model_len=8192, tensor_parallel_size=8)
    known = resolve_on_neuron(engine, "hf://meta-llama/Llama-3.1-8B-Instruct", "trn2", None, "trn2.48xlarge")
    assert known.scheduler.max_prefill_tokens_while_decoding == 512
    # An architecture the cost model has no shape for keeps auto: the scheduler runs it as no cap.
    unknown = resolve_on_neuron(engine, "hf://google/gemma-2-9b", "trn2", None, "trn2.48xlarge")
    assert unknown.scheduler.max_prefill_tokens_while_decoding == "auto"
