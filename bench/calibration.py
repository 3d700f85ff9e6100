"""The simulated device against Neuron's published latencies: every row, the fit, and the holdout's error.

For every published row (``neuronfleet.engine.sim.published``) the cost model's TTFT (the row's
prefill step) and TPOT (its median decode step) beside the published p50s, and their ratio; then each
chip's constants fitted again from the rows, beside the committed ones, and the error on the rows held
out of the fit. Pure arithmetic: it runs in a second and gives the same figures everywhere.

Run: ``make bench-calibration`` (or ``.venv/bin/python bench/calibration.py``).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict
from pathlib import Path
from typing import Any

from provenance import commit
from tables import print_table

from neuronfleet.engine.sim.calibration import CALIBRATIONS, FITTED_CONSTANTS, Calibration
from neuronfleet.engine.sim.published import (
    APC_BUCKETS,
    PREFIX_CACHING_ROWS,
    ROWS,
    cached_tokens,
    chip_of,
    fit,
    predict,
    prefix_caching_cost,
    prefix_hit_seconds,
)

RESULTS = Path(__file__).resolve().parent / "results" / "calibration.json"


def main() -> None:
    """Print the rows and the fit, and write them as JSON."""
    ran_on = commit()
    rows: list[dict[str, Any]] = []
    printed: list[list[str]] = []
    for row in ROWS:
        ttft, tpot = predict(row)
        measured: dict[str, Any] = {
            "id": row.id,
            "role": row.role,
            "chip": chip_of(row),
            "ttft_ms": row.ttft_ms,
            "ttft_model_ms": ttft * 1e3,
            "ttft_ratio": ttft * 1e3 / row.ttft_ms,
            "tpot_ms": row.tpot_ms,
            "tpot_model_ms": tpot * 1e3,
            "tpot_ratio": None if row.tpot_ms is None else tpot * 1e3 / row.tpot_ms,
        }
        rows.append(measured)
        tpot_figures = (
            ["", "", ""]
            if row.tpot_ms is None
            else [f"{row.tpot_ms:.2f}", f"{tpot * 1e3:.2f}", f"{measured['tpot_ratio']:.2f}"]
        )
        printed.append(
            [
                row.id,
                row.role,
                row.model,
                row.instance_type,
                str(row.tensor_parallel_size),
                str(row.prompt_tokens),
                f"{row.ttft_ms:.1f}",
                f"{ttft * 1e3:.1f}",
                f"{measured['ttft_ratio']:.2f}",
                *tpot_figures,
            ]
        )
    columns = ["row", "role", "model", "instance", "TP", "in", "TTFT ms published", "model", "ratio"]
    print_table(
        f"published p50 against the cost model (commit {ran_on})",
        [*columns, "TPOT ms published", "model", "ratio"],
        printed,
    )
    errors: dict[str, list[float]] = {}
    for figure in rows:
        for key in ("ttft_ratio", "tpot_ratio"):
            if figure[key] is not None:
                errors.setdefault(figure["role"], []).append(abs(figure[key] - 1))
    print()
    for role, found in errors.items():
        print(f"{role:>9}: {len(found)} figures, |error| median {statistics.median(found):.1%}, max {max(found):.1%}")
    geometric = {
        key: math.exp(statistics.mean(math.log(m[key]) for m in rows if m["role"] == "reference" and m[key]))
        for key in ("ttft_ratio", "tpot_ratio")
    }
    ttft, tpot = geometric["ttft_ratio"], geometric["tpot_ratio"]
    print(f"reference rows, model / published (geometric mean): TTFT {ttft:.2f}, TPOT {tpot:.2f}")
    inferentia2 = fit("Inferentia2")
    refitted = {
        "Inferentia2": inferentia2,
        "Trainium": fit("Trainium", ratios_from=inferentia2),
        "Trainium2": fit("Trainium2", ratios_from=inferentia2),
    }
    print("\nfitted again from the rows (the committed constants must be these):")
    for chip, calibration in refitted.items():
        same = "same" if calibration == CALIBRATIONS[chip] else "DIFFERENT from the committed"
        values = ", ".join(f"{name} {getattr(calibration, name):.3g}" for name in FITTED_CONSTANTS)
        print(f"  {chip}: {values} ({same}; fitted on {len(calibration.fitted_on)} rows)")
    left_out = leave_one_out("Trainium2", inferentia2)
    prefix_hits = prefix_caching()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "commit": ran_on,
                "rows": rows,
                "trainium2_leave_one_out": left_out,
                "prefix_caching": prefix_hits,
                "errors": {role: {"median": statistics.median(v), "max": max(v)} for role, v in errors.items()},
                "reference_geometric_mean": geometric,
                "calibrations": {chip: asdict(c) for chip, c in CALIBRATIONS.items()},
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


def leave_one_out(chip: str, ratios_from: Calibration) -> list[dict[str, Any]]:
    """Each of ``chip``'s fitted rows predicted by the constants fitted on the others (Inferentia2's ratios)."""
    found: list[dict[str, Any]] = []
    printed: list[list[str]] = []
    for row in (row for row in ROWS if row.role != "holdout" and chip_of(row) == chip):
        others = fit(chip, ratios_from=ratios_from, leave_out=row.id)
        ttft, tpot = predict(row, others)
        errors = {"ttft": ttft * 1e3 / row.ttft_ms - 1}
        if row.tpot_ms is not None:
            errors["tpot"] = tpot * 1e3 / row.tpot_ms - 1
        found.append({"id": row.id, "errors": errors, "fitted_without": asdict(others)})
        printed.append([row.id, *(f"{errors[kind]:+.0%}" if kind in errors else "" for kind in ("ttft", "tpot"))])
    print_table(f"{chip}, leave one out", ["row", "TTFT", "TPOT"], printed)
    return found


def prefix_caching() -> list[dict[str, Any]]:
    """Neuron's prefix-caching comparison beside the model's prefill of a hit, where its workload can be
    reconstructed: the prompt length from the dataset's name, or a range over every length the buckets allow."""
    cost = prefix_caching_cost()
    smallest = APC_BUCKETS[0]
    found: list[dict[str, Any]] = []
    printed: list[list[str]] = []
    for row in PREFIX_CACHING_ROWS:
        if row.prompt_tokens is not None:
            cached = cached_tokens(row.prompt_tokens, row.hit_share)
            without = (prefix_hit_seconds(cost, row.prompt_tokens, 0) * 1e3,) * 2
            with_hit = (prefix_hit_seconds(cost, row.prompt_tokens, cached) * 1e3,) * 2
            how = f"{row.prompt_tokens} tokens, {cached} cached"
        elif row.hit_share == 0.0:
            # No hit, and prompts of a few hundred tokens: the smallest bucket, no context, either way.
            without = with_hit = (cost.prefill_seconds(smallest, 0) * 1e3,) * 2
            how = f"a prompt within the {smallest} bucket"
        else:
            # Prompt lengths unpublished: a hit leaves at most the smallest bucket's tokens for every prompt up to
            # their share, over any cached context the compiled length allows.
            without = (cost.prefill_seconds(smallest, 0) * 1e3, cost.prefill_seconds(APC_BUCKETS[-1], 0) * 1e3)
            contexts = range(smallest, APC_BUCKETS[-1] - smallest + 1, smallest)
            hits = [cost.prefill_seconds(smallest, context) * 1e3 for context in contexts]
            with_hit = (min(hits), max(hits))
            how = f"any prompt whose new tokens fit {smallest}"
        found.append(
            {
                "dataset": row.dataset,
                "cache_hit": row.cache_hit,
                "published_ms": [row.ttft_without_ms, row.ttft_with_ms],
                "model_without_ms": list(without),
                "model_with_ms": list(with_hit),
                "workload": how,
            }
        )
        printed.append(
            [
                row.dataset,
                row.cache_hit,
                how,
                f"{row.ttft_without_ms:.1f}",
                _span(without),
                f"{row.ttft_with_ms:.1f}",
                _span(with_hit),
                _span(tuple(value / row.ttft_with_ms for value in with_hit), "{:.2f}"),
            ]
        )
    print_table(
        "prefix caching, Llama 3.3 70B on trn2.48xlarge at TP 64: TTFT p50 in ms, published and the model's prefill",
        ["dataset", "hit", "reconstructed as", "without", "model", "with", "model", "with: model/published"],
        printed,
    )
    print(
        "  published TTFTs are end to end at batch 4, so they include HTTP and any wait behind another prompt's\n"
        "  prefill; prompt lengths and the spread of hits per request are not published."
    )
    return found


def _span(values: tuple[float, ...], form: str = "{:.1f}") -> str:
    low, high = min(values), max(values)
    return form.format(low) if math.isclose(low, high) else f"{form.format(low)}-{form.format(high)}"


if __name__ == "__main__":
    main()
