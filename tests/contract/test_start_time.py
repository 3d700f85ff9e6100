"""The start-time model: it reproduces the published load figures it was fitted on, and adds up as stated."""

from __future__ import annotations

import pytest

from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.contract.start_time import (
    FETCH_BYTES_PER_S,
    StartTime,
    predict_model_start,
    predict_start,
    weights_store,
)

#: NxD Inference's weights-sharding guide: Llama 3.1 405B in BF16 on trn2.48xlarge, from NVMe.
WEIGHTS_405B = get_shape("llama-3.1-405b").num_parameters * 2


def test_the_405b_loads_as_the_weights_sharding_guide_measured_it() -> None:
    on_load = predict_start(WEIGHTS_405B, "local")
    assert on_load.total_s == pytest.approx(187.0)
    assert on_load.shard_s == pytest.approx(49.0)
    assert on_load.fetch_s == 0.0
    presharded = predict_start(WEIGHTS_405B, "local", presharded=True)
    assert presharded.total_s == pytest.approx(108.0)
    assert presharded.shard_s == 0.0


def test_each_phase_grows_with_what_it_moves() -> None:
    small, large = predict_start(10**9, "s3"), predict_start(10**10, "s3")
    for phase in ("fetch", "load", "shard"):
        assert large.phases()[phase] == pytest.approx(10 * small.phases()[phase]), phase
    with_graphs = predict_start(10**9, "s3", graphs_bytes=10**9, warmup_s=3.0)
    assert with_graphs.total_s == pytest.approx(small.total_s + small.load_s * 108 / 138 + 3.0)


def test_a_store_further_away_takes_longer_to_fetch_from() -> None:
    fetch = {store: predict_start(WEIGHTS_405B, store).fetch_s for store in FETCH_BYTES_PER_S}
    assert fetch["local"] == 0.0 < fetch["pvc"] < fetch["s3"] < fetch["hf"]


def test_scaling_and_the_log_line() -> None:
    start = StartTime(fetch_s=10.0, load_s=20.0, shard_s=5.0, graphs_s=1.0, warmup_s=4.0)
    assert start.scaled(0.01).total_s == pytest.approx(0.4)
    assert start.describe() == "40.0 s (fetch 10.0 s, load 20.0 s, shard 5.0 s, graphs 1.0 s, warmup 4.0 s)"


def test_the_store_is_the_models_scheme_and_only_known_shapes_are_predicted() -> None:
    assert [weights_store(uri) for uri in ("hf://a/b", "s3://bucket/m", "/models/m")] == ["hf", "s3", "local"]
    predicted = predict_model_start("s3://models/Llama-3.1-70B-Instruct")
    assert predicted == predict_start(get_shape("llama-3.1-70b").num_parameters * 2, "s3")
    assert predict_model_start("hf://org/a-model-of-unknown-size") is None


def test_negative_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        predict_start(-1, "hf")
