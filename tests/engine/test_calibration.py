"""The cost model against Neuron's published latencies: the rows it was fitted on, and the rows held out."""

from __future__ import annotations

import statistics

import pytest

from neuronfleet.contract.hardware import INSTANCE_TYPES
from neuronfleet.contract.model_shapes import SHAPES
from neuronfleet.engine.sim.calibration import CALIBRATIONS, TRAINIUM2, TRAINIUM3, calibration_for
from neuronfleet.engine.sim.published import (
    ROWS,
    PublishedRow,
    cached_tokens,
    chip_of,
    fit,
    predict,
    prefix_caching_cost,
    prefix_hit_seconds,
)

#: How far the simulated device may be from a reference row (the issue's bound).
REFERENCE_TOLERANCE = 0.25


def ratios(row: PublishedRow) -> list[float]:
    """Predicted over published, TTFT then TPOT (where published)."""
    ttft, tpot = predict(row)
    found = [ttft * 1e3 / row.ttft_ms]
    if row.tpot_ms is not None:
        found.append(tpot * 1e3 / row.tpot_ms)
    return found


@pytest.mark.parametrize("row", [row for row in ROWS if row.role == "reference"], ids=lambda row: row.id)
def test_every_reference_row_is_reproduced_within_25_percent(row: PublishedRow) -> None:
    found = ratios(row)
    assert all(abs(ratio - 1) <= REFERENCE_TOLERANCE for ratio in found), f"{row.id}: predicted/published {found}"


def test_rows_never_fitted_on_are_predicted() -> None:
    errors = [abs(ratio - 1) for row in ROWS if row.role == "holdout" for ratio in ratios(row)]
    # 11 rows, 22 figures: the median within 10%, none off by half (docs/engine.md gives each).
    assert len(errors) == 22
    assert statistics.median(errors) <= 0.10
    assert max(errors) <= 0.5


def test_the_holdout_is_never_fitted_on() -> None:
    holdout = {row.id for row in ROWS if row.role == "holdout"}
    assert not holdout & {row_id for c in CALIBRATIONS.values() for row_id in c.fitted_on}


def test_the_committed_constants_are_what_the_published_rows_give() -> None:
    inferentia2 = fit("Inferentia2")
    assert inferentia2 == calibration_for("Inferentia2")
    assert fit("Trainium", ratios_from=inferentia2) == calibration_for("Trainium")
    assert fit("Trainium2", ratios_from=inferentia2) == TRAINIUM2


def test_trainium3_borrows_trainium2s_constants_until_neuron_publishes_its_own() -> None:
    assert TRAINIUM3.chip == "Trainium3"
    assert TRAINIUM3.fitted_on == TRAINIUM2.fitted_on
    assert not [row for row in ROWS if chip_of(row) == "Trainium3"]


def test_every_catalogued_chip_is_calibrated_and_every_row_has_a_shape() -> None:
    assert {instance.chip.name for instance in INSTANCE_TYPES.values()} == set(CALIBRATIONS)
    assert all(row.shape in SHAPES and row.instance_type in INSTANCE_TYPES for row in ROWS)
    assert len({row.id for row in ROWS}) == len(ROWS)


def test_a_chip_without_rows_cannot_be_fitted() -> None:
    with pytest.raises(ValueError, match="no published rows to fit Trainium3 on"):
        fit("Trainium3")


def test_a_prefix_hit_prefills_only_its_new_tokens_in_their_bucket_over_the_whole_context() -> None:
    cost = prefix_caching_cost()
    # 90% of 4,096 cached: 416 new tokens, the 512 bucket, attention over 3,680 cached tokens.
    cached = cached_tokens(4096, 0.9)
    assert cached == 3680
    hit = prefix_hit_seconds(cost, 4096, cached)
    assert hit == cost.prefill_seconds(512, 3680)
    assert cost.prefill_seconds(512, 0) < hit < prefix_hit_seconds(cost, 4096, 0) / 1.5
    # A quarter cached leaves 768 new tokens of a 1,024-token prompt: the same bucket, so no saving at all.
    assert prefix_hit_seconds(cost, 1024, cached_tokens(1024, 0.25)) >= prefix_hit_seconds(cost, 1024, 0)
