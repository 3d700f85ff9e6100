"""One table of every benchmark, side by side with its baseline: printed, as JSON and as a PNG plot.

Reads what the benchmarks wrote to bench/results/ (``make bench`` runs them all
first) and writes bench/results/summary.json and bench/results/summary.png. Each
row is a measured value, the baseline measured in the same run, and their ratio
(value / baseline). A benchmark whose results are missing is named with the
command that makes them, and the report exits 1.

Run: ``make bench`` (or ``.venv/bin/python bench/report.py`` after the benchmarks).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from rich.console import Console
from rich.table import Table

RESULTS = Path(__file__).resolve().parent / "results"
SUMMARY_JSON = RESULTS / "summary.json"
SUMMARY_PNG = RESULTS / "summary.png"

Obj = dict[str, Any]


@dataclass(frozen=True)
class Row:
    """One measured figure beside its baseline."""

    section: str
    measure: str
    value: str
    baseline: str
    #: value / baseline, when both are numbers of the same kind.
    ratio: float | None
    note: str = ""


def _ratio(value: float, baseline: float) -> float | None:
    return value / baseline if baseline else None


def scheduler_rows(data: Obj) -> Iterator[Row]:
    """schedule() cost per step, by queue length, against vLLM's scheduler."""
    by_key = {(row["waiting"], row["scheduler"]): row["us_per_step"] for row in data["rows"]}
    for waiting in sorted({waiting for waiting, _ in by_key}):
        base = by_key[(waiting, "vllm Scheduler")]
        for name, label in (("NeuronScheduler (constant-cost)", "default"), ("NeuronScheduler (reference)", "design")):
            us = by_key[(waiting, name)]
            yield Row(
                "scheduler cost",
                f"schedule(), {data['running']} running, {waiting:,} waiting, {label}",
                f"{us:,.0f} µs",
                f"{base:,.0f} µs (vLLM)",
                _ratio(us, base),
            )


def padding_rows(data: Obj) -> Iterator[Row]:
    """Padding waste of the recommended buckets against power-of-two ones of the same count."""
    for row in data["results"]:
        yield Row(
            "padding waste",
            f"{row['workload']}, {row['count']} prefill buckets, recommended",
            f"{row['recommended_waste']:.1%}",
            f"{row['default_waste']:.1%} (power of two)",
            _ratio(row["recommended_waste"], row["default_waste"]),
            f"best K powers of two {row['best_power_of_two_waste']:.1%}; any sizes {row['theoretical_waste']:.1%}",
        )


def _packed(row: Obj) -> int:
    return int(row.get("max_prefills_per_step", 1))


def _cap(row: Obj) -> int | None:
    cap = row.get("max_prefill_tokens_while_decoding")
    return None if cap is None else int(cap)


def _variant(row: Obj) -> str:
    """What a row adds to the option its section measures: packing, the prefill cap while decoding."""
    parts = [f"up to {_packed(row)} prefills packed per step"] if _packed(row) > 1 else []
    if _cap(row) is not None:
        parts.append(f"prefill steps capped at {_cap(row)} tokens while decoding")
    return ", ".join(parts)


def stall_rows(data: list[Obj]) -> Iterator[Row]:
    """Decode ITL during long prefills with a stall bound of 1 against the unbounded design, then packed and capped."""
    reference = next(row for row in data if row["bound"] is None)
    bounded = next(row for row in data if row["bound"] == 1 and not _variant(row))
    yield Row(
        "decode stalls",
        "ITL p99 during 32k-token prefills, 1 prefill step between decodes",
        f"{bounded['itl_p99_ms']:,.0f} ms",
        f"{reference['itl_p99_ms']:,.0f} ms (unbounded)",
        _ratio(bounded["itl_p99_ms"], reference["itl_p99_ms"]),
        f"32k TTFT x{bounded['long_prompt_ttft_s'] / reference['long_prompt_ttft_s']:.3f}",
    )
    for row in data:
        if row["bound"] == 1 and _variant(row):
            yield Row(
                "decode stalls",
                f"the same, {_variant(row)}",
                f"{row['itl_p99_ms']:,.0f} ms",
                f"{bounded['itl_p99_ms']:,.0f} ms (neither)",
                _ratio(row["itl_p99_ms"], bounded["itl_p99_ms"]),
                f"32k TTFT x{row['long_prompt_ttft_s'] / bounded['long_prompt_ttft_s']:.3f}",
            )


def kv_rows(data: list[Obj]) -> Iterator[Row]:
    """Chat throughput with per-request KV admission against admission by max_model_len, then packed and capped."""
    by_mode = {(row["kv_admission"], _variant(row)): row for row in data}
    ours, reference = by_mode[("request_bound", "")], by_mode[("max_model_len", "")]
    yield Row(
        "KV admission",
        "chat output tokens/s, 70B TP 32, 131k context, request-bound admission",
        f"{ours['output_tokens_per_s']:,.0f}",
        f"{reference['output_tokens_per_s']:,.0f} (by max_model_len)",
        _ratio(ours["output_tokens_per_s"], reference["output_tokens_per_s"]),
        f"mean batch {ours['mean_decode_batch']:.1f} vs {reference['mean_decode_batch']:.1f}",
    )
    for (mode, variant), row in by_mode.items():
        if mode == "request_bound" and variant:
            yield Row(
                "KV admission",
                f"the same, {variant}",
                f"{row['output_tokens_per_s']:,.0f}",
                f"{ours['output_tokens_per_s']:,.0f} (neither)",
                _ratio(row["output_tokens_per_s"], ours["output_tokens_per_s"]),
                f"mean TTFT {row['mean_ttft_s']:.1f} s vs {ours['mean_ttft_s']:.1f} s",
            )


#: The serving benchmark's schedulers beside the design's, as the table names them.
SERVING_LABELS = {
    "uncapped": "defaults without the prefill cap",
    "uncapped-packing": "packed prefills without the prefill cap",
    "neuronfleet": "defaults (prefill cap while decoding)",
    "packing": "packed prefills and the prefill cap",
}
#: Schedulers shown by saturation and goodput only: what the prefill cap adds is read against them.
SERVING_GOODPUT_ONLY = {"uncapped", "uncapped-packing"}


def serving_rows(data: list[Obj]) -> Iterator[Row]:
    """Saturation, then goodput, throughput and latency by load, each scheduler against the design's."""
    reference = {row["load"]: row for row in data if row["scheduler"] == "reference"}
    for row in data:
        label = SERVING_LABELS.get(row["scheduler"])
        if label is None:
            continue
        base = reference[row["load"]]
        if row["load"] is None:
            yield Row(
                "serving (sim trn2)",
                f"chat, all requests at once: output tokens/s (saturation), {label}",
                f"{row['output_tokens_per_s']:,.0f}",
                f"{base['output_tokens_per_s']:,.0f} (design)",
                _ratio(row["output_tokens_per_s"], base["output_tokens_per_s"]),
            )
            continue
        at = f"chat at {row['load']:.0%} of saturation ({row['rate']:.1f} req/s), {label}"
        if "goodput_rps" in row:
            yield Row(
                "serving (sim trn2)",
                f"{at}: goodput (TTFT <= 500 ms, ITL p99 <= 50 ms)",
                f"{row['goodput_rps']:,.2f} req/s",
                f"{base['goodput_rps']:,.2f} req/s (design)",
                _ratio(row["goodput_rps"], base["goodput_rps"]),
            )
        if row["scheduler"] in SERVING_GOODPUT_ONLY:
            continue
        yield Row(
            "serving (sim trn2)",
            f"{at}: output tokens/s",
            f"{row['output_tokens_per_s']:,.0f}",
            f"{base['output_tokens_per_s']:,.0f} (design)",
            _ratio(row["output_tokens_per_s"], base["output_tokens_per_s"]),
        )
        for metric in ("ttft", "itl"):
            p50, p99 = row[f"{metric}_p50_ms"], row[f"{metric}_p99_ms"]
            base_p50, base_p99 = base[f"{metric}_p50_ms"], base[f"{metric}_p99_ms"]
            yield Row(
                "serving (sim trn2)",
                f"{at}: {metric.upper()} p50 / p99",
                f"{p50:,.1f} / {p99:,.1f} ms",
                f"{base_p50:,.1f} / {base_p99:,.1f} ms",
                _ratio(p99, base_p99),
                f"ratio of p99; p50 {p50 / base_p50:.2f}x",
            )


def operator_rows(data: Obj) -> Iterator[Row]:
    """The operator on a local control plane, against plain YAML where there is one."""
    applied, plain = data["apply_to_ready"], data["apply_to_ready"]["plain"]
    baseline = f"{plain['median_s']:.2f} s (plain YAML)"
    for key, label in (("fresh", "new artifact, compile 0 s"), ("compiled", "artifact already compiled")):
        yield Row(
            "operator",
            f"apply -> Ready, {label} (median)",
            f"{applied[key]['median_s']:.2f} s",
            baseline,
            _ratio(applied[key]["median_s"], plain["median_s"]),
            f"p99 {applied[key]['p99_s']:.2f} s",
        )
    latency = data["reconcile_latency"]
    yield Row(
        "operator",
        "reconcile latency p50 / p99, spec -> observedGeneration",
        f"{latency['median_s']:.2f} / {latency['p99_s']:.2f} s",
        "",
        None,
        f"n={latency['n']}",
    )
    for phase, figures in data["requests"].items():
        yield Row(
            "operator",
            f"API requests per reconcile, {phase}",
            f"{figures['requests_per_reconcile']:.1f}",
            "",
            None,
            f"{figures['writes_per_reconcile']:.1f} writes, {figures['operator_cpu_ms_per_reconcile']:.0f} ms CPU",
        )
    memory = data["memory"]
    yield Row(
        "operator",
        f"operator RSS with {memory['fleet']['services']:,} services",
        f"{memory['fleet']['rss_mib']:.0f} MiB",
        f"{memory['started']['rss_mib']:.0f} MiB (no services)",
        _ratio(memory["fleet"]["rss_mib"], memory["started"]["rss_mib"]),
    )
    idle = data["idle"]
    yield Row(
        "operator",
        f"writes by the idle operator over {idle['idle_seconds']:g} s (must be 0)",
        str(idle["idle_writes"]),
        "",
        None,
        f"{idle['services']} services, between full resyncs",
    )


def routing_rows(data: Obj) -> Iterator[Row]:
    """Short requests' TTFT through the operator's picker, against the plain Service and GIE's default scoring."""
    picker = data["sides"]["picker"]
    args = data["args"]
    mix = f"{args['short_rate']:g}/s short beside {args['long_rate']:g}/s of {args['long_tokens']}-token prompts"
    for side, against in (("service", "Service"), ("picker-gie-defaults", "picker, GIE's default scorers")):
        base = data["sides"][side]
        for key, label in (("ttft_p99_s", "p99"), ("ttft_p50_s", "p50")):
            yield Row(
                "routing",
                f"short-request TTFT {label} through the picker, 2 sim replicas",
                f"{1000 * picker[key]:.0f} ms",
                f"{1000 * base[key]:.0f} ms ({against})",
                _ratio(picker[key], base[key]),
                mix if label == "p99" else f"{picker['failed']} + {base['failed']} failed",
            )
        yield Row(
            "routing",
            f"short-request goodput at TTFT <= {args['slo_ms']:g} ms through the picker",
            f"{picker['goodput_rps']:.2f} req/s",
            f"{base['goodput_rps']:.2f} req/s ({against})",
            _ratio(picker["goodput_rps"], base["goodput_rps"]),
        )


SOURCES: dict[str, tuple[str, Callable[[Any], Iterator[Row]]]] = {
    "scheduler_cost.json": ("make bench-scheduler", scheduler_rows),
    "padding_waste.json": ("make bench-padding", padding_rows),
    "decode_stalls.json": ("make bench-stalls", stall_rows),
    "kv_admission.json": ("make bench-kv", kv_rows),
    "serving.json": ("make bench-serving", serving_rows),
    "operator.json": ("make bench-operator", operator_rows),
    "routing.json": ("make bench-routing", routing_rows),
}


def load() -> tuple[dict[str, Any], list[str]]:
    """The results that exist, by file name, and the commands that make the missing ones."""
    found, missing = {}, []
    for name, (command, _) in SOURCES.items():
        path = RESULTS / name
        if path.exists():
            found[name] = json.loads(path.read_text())
        else:
            missing.append(f"{path.relative_to(RESULTS.parent.parent)}: run {command}")
    return found, missing


def rows_of(found: dict[str, Any]) -> list[Row]:
    """Every row, in the order of ``SOURCES``."""
    return [row for name, (_, make_rows) in SOURCES.items() if name in found for row in make_rows(found[name])]


def print_table(rows: list[Row]) -> None:
    """The table, on stdout."""
    table = Table(title="neuronfleet benchmarks (ratio = value / baseline, same run)", title_justify="left")
    for column, justify in (("measure", "left"), ("value", "right"), ("baseline", "right"), ("ratio", "right")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    table.add_column("note")
    section = None
    for row in rows:
        if row.section != section:
            table.add_section()
            table.add_row(f"[bold]{row.section}[/bold]", "", "", "", "")
            section = row.section
        ratio = "" if row.ratio is None else f"{row.ratio:.2f}x"
        table.add_row(row.measure, row.value, row.baseline, ratio, row.note)
    Console(width=200).print(table)


def plot(found: dict[str, Any], path: Path) -> None:
    """Four panels: scheduler cost, padding waste, serving latency, operator apply -> Ready."""
    # A bare Figure draws to a file with no pyplot state and no display.
    figure = Figure(figsize=(13, 9))
    axes = figure.subplots(2, 2)
    if "scheduler_cost.json" in found:
        ax = axes[0][0]
        data = found["scheduler_cost.json"]["rows"]
        for name in sorted({row["scheduler"] for row in data}):
            points = sorted((max(row["waiting"], 1), row["us_per_step"]) for row in data if row["scheduler"] == name)
            ax.plot(*zip(*points, strict=True), marker="o", label=name)
        ax.set(xscale="log", yscale="log", xlabel="waiting requests (0 drawn at 1)", ylabel="µs per schedule()")
        ax.set_title("Scheduler cost per step, 64 running")
        ax.legend(fontsize=8)
    if "padding_waste.json" in found:
        ax = axes[0][1]
        data = found["padding_waste.json"]["results"]
        labels = [f"{row['workload']}\nK={row['count']}" for row in data]
        width = 0.27
        for offset, (key, label) in enumerate(
            (("default_waste", "power of two"), ("recommended_waste", "recommended"), ("theoretical_waste", "optimum"))
        ):
            positions = [i + (offset - 1) * width for i in range(len(data))]
            ax.bar(positions, [100 * row[key] for row in data], width, label=label)
        ax.set_xticks(range(len(data)), labels)
        ax.set(ylabel="% of padded prefill tokens that are padding")
        ax.set_title("Padding waste at equal bucket counts")
        ax.legend(fontsize=8)
    if "serving.json" in found:
        ax = axes[1][0]
        data = found["serving.json"]
        for scheduler, style in (("reference", "--"), ("neuronfleet", "-"), ("packing", ":")):
            loaded = (row for row in data if row["scheduler"] == scheduler and row["rate"] is not None)
            rows = sorted(loaded, key=lambda row: row["rate"])
            rates = [row["rate"] for row in rows]
            for metric, color in (("ttft", "tab:blue"), ("itl", "tab:orange")):
                values = [row[f"{metric}_p99_ms"] for row in rows]
                ax.plot(rates, values, style, color=color, marker="o", label=f"{metric.upper()} p99, {scheduler}")
        ax.set(xlabel="request rate (req/s)", ylabel="ms", yscale="log")
        ax.set_title("Serving chat on a simulated trn2 (8B, TP 8)")
        ax.legend(fontsize=8)
    if "operator.json" in found:
        ax = axes[1][1]
        applied = found["operator.json"]["apply_to_ready"]
        keys = [
            ("plain", "plain YAML\n(baseline)"),
            ("compiled", "compiled\nartifact"),
            ("fresh", "new artifact\n(compile 0 s)"),
        ]
        ax.bar(
            [label for _, label in keys],
            [applied[key]["median_s"] for key, _ in keys],
            yerr=[[0.0] * len(keys), [applied[key]["p99_s"] - applied[key]["median_s"] for key, _ in keys]],
            capsize=4,
        )
        ax.set(ylabel="seconds (median, bar to p99)")
        ax.set_title("kubectl apply -> Ready on a local control plane")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    """Print the table, write the JSON and the plot; exit 1 if a benchmark's results are missing."""
    found, missing = load()
    rows = rows_of(found)
    print_table(rows)
    SUMMARY_JSON.write_text(json.dumps([asdict(row) for row in rows], indent=2) + "\n")
    plot(found, SUMMARY_PNG)
    print(f"wrote {SUMMARY_JSON} and {SUMMARY_PNG}")
    for line in missing:
        print(f"missing {line}", file=sys.stderr)
    if missing:
        sys.exit(1)


if __name__ == "__main__":
    main()
