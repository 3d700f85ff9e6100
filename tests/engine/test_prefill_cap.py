"""``max_prefill_tokens_while_decoding: auto``: the cap derived from a deployment's step times."""

from __future__ import annotations

import pytest

from neuronfleet.contract.config import EngineConfig, SchedulerOptions
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.cli.serve import resolve_on_neuron
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning.prefill_cap import KNEE, derive_prefill_cap, resolve_prefill_cap


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
        # Fixed costs dominate short prefills: the cap sits where a step costs twice the smallest.
        ("trn2.48xlarge", "llama-3.1-8b", 8, 1024),
        ("trn2.48xlarge", "llama-3.1-70b", 64, 2048),
        ("inf2.48xlarge", "llama-3.1-70b", 24, 256),
    ],
)
def test_without_a_target_the_cap_bounds_a_step_to_twice_the_smallest(
    instance: str, shape: str, tensor_parallel_size: int, cap: int
) -> None:
    engine, cost = deployment(instance, shape, tensor_parallel_size)
    assert derive_prefill_cap(engine, cost) == cap
    buckets = engine.effective_num_batched_tokens_buckets
    smallest = cost.prefill_seconds(buckets[0], 0)
    assert cost.prefill_seconds(cap, 0) <= KNEE * smallest < cost.prefill_seconds(buckets[buckets.index(cap) + 1], 0)


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
    assert resolve_prefill_cap(engine, cost).scheduler.max_prefill_tokens_while_decoding == 1024
    for chosen in (512, None):
        given = engine.model_copy(update={"scheduler": SchedulerOptions(max_prefill_tokens_while_decoding=chosen)})
        assert resolve_prefill_cap(given, cost) == given


def test_on_neuron_serve_derives_it_for_an_architecture_it_knows() -> None:
    engine = EngineConfig(max_num_seqs=64, max_model_len=8192, tensor_parallel_size=8)
    known = resolve_on_neuron(engine, "hf://meta-llama/Llama-3.1-8B-Instruct", "trn2", None, "trn2.48xlarge")
    assert known.scheduler.max_prefill_tokens_while_decoding == 1024
    # An architecture the cost model has no shape for keeps auto: the scheduler runs it as no cap.
    unknown = resolve_on_neuron(engine, "hf://google/gemma-2-9b", "trn2", None, "trn2.48xlarge")
    assert unknown.scheduler.max_prefill_tokens_while_decoding == "auto"
