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

from neuronfleet.engine.sim.calibration import CALIBRATIONS, FITTED_CONSTANTS
from neuronfleet.engine.sim.published import ROWS, chip_of, fit, predict

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
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "commit": ran_on,
                "rows": rows,
                "errors": {role: {"median": statistics.median(v), "max": max(v)} for role, v in errors.items()},
                "reference_geometric_mean": geometric,
                "calibrations": {chip: asdict(c) for chip, c in CALIBRATIONS.items()},
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
