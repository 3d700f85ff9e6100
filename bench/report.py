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


def _spread(figure: Obj, fmt: str = "{:.2f}") -> str:
    """A benchmark's ``median [min-max]``."""
    return f"{fmt.format(figure['median'])} [{fmt.format(figure['min'])}-{fmt.format(figure['max'])}]"


def calibration_rows(data: Obj) -> Iterator[Row]:
    """The simulated device against Neuron's published latencies."""
    for role, errors in data["errors"].items():
        yield Row(
            "calibration",
            f"|model - published| / published, {role} rows (TTFT and TPOT)",
            f"median {errors['median']:.1%}",
            "",
            None,
            f"max {errors['max']:.1%}",
        )
    mean = data["reference_geometric_mean"]
    yield Row(
        "calibration",
        "model / published on the reference rows, geometric mean",
        f"TTFT {mean['ttft_ratio']:.2f}, TPOT {mean['tpot_ratio']:.2f}",
        "",
        None,
        f"commit {data['commit']}",
    )


def _option(row: Obj) -> str:
    """What a stall or KV row adds: packing, the prefill cap while decoding."""
    parts = [f"{row['max_prefills_per_step']} packed"] if row["max_prefills_per_step"] > 1 else []
    if row["auto"]:
        parts.append(f"cap auto ({row['max_prefill_tokens_while_decoding'] or 'none'})")
    return ", ".join(parts)


def stall_rows(data: Obj) -> Iterator[Row]:
    """Decode ITL during long prefills, each variant against the unbounded design on its deployment."""
    for row in data["rows"]:
        if row["bound"] is None:
            reference = row
            continue
        if row["bound"] != 1:
            continue
        label = ", ".join(filter(None, ["stall bound 1", _option(row)]))
        yield Row(
            "decode stalls",
            f"{row['deployment']}: ITL p99 during 32k prefills, {label}",
            f"{_spread(row['itl_p99_ms'], '{:.0f}')} ms",
            f"{reference['itl_p99_ms']['median']:,.0f} ms (unbounded)",
            row["itl_p99_vs_reference"]["median"],
            f"32k TTFT x{_spread(row['ttft_vs_reference'], '{:.2f}')}",
        )


def kv_rows(data: Obj) -> Iterator[Row]:
    """Chat throughput with per-request KV admission against admission by max_model_len, per deployment."""
    for row in data["rows"]:
        if row["kv_admission"] == "max_model_len":
            reference = row
            continue
        label = ", ".join(filter(None, ["request-bound admission", _option(row)]))
        yield Row(
            "KV admission",
            f"{row['deployment']}, 131k context: output tokens/s, {label}",
            _spread(row["output_tokens_per_s"], "{:,.0f}"),
            f"{reference['output_tokens_per_s']['median']:,.0f} (by max_model_len)",
            row["throughput_vs_reference"]["median"],
            f"mean TTFT {row['mean_ttft_s']['median']:.1f} s vs {reference['mean_ttft_s']['median']:.1f} s",
        )


def serving_rows(data: Obj) -> Iterator[Row]:
    """Goodput of the defaults against the design's, by deployment, workload and load."""
    reachable = {deployment["name"]: deployment["reachable"] for deployment in data["deployments"]}
    design = {(r["deployment"], r["workload"], r["load"]): r for r in data["rows"] if r["scheduler"] == "design"}
    for row in data["rows"]:
        if row["scheduler"] != "defaults":
            continue
        base = design[(row["deployment"], row["workload"], row["load"])]
        ratio = row.get("goodput_vs_design") if reachable[row["deployment"]] else None
        yield Row(
            "serving (calibrated sim)",
            f"{row['deployment']}, {row['workload']} at {row['load']:.0%}: goodput, cap {row['prefill_cap']}",
            f"{_spread(row['goodput_rps'])} req/s",
            f"{base['goodput_rps']['median']:.2f} req/s (design)",
            None if ratio is None else ratio["median"],
            "" if ratio is None else f"seed by seed {_spread(ratio)}",
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
    for steady in data.get("steady", [])[-1:]:
        observed, size = steady["observed"], steady["services"]
        yield Row(
            "operator",
            f"{steady['rate']:g} changes/s, {size:,} serving services: spec -> observedGeneration p50 / p99",
            f"{1000 * observed['median_s']:.0f} / {1000 * observed['p99_s']:.0f} ms",
            "",
            None,
            f"n={steady['changes']}, max {1000 * observed['max_s']:.0f} ms; -> Ready p50 "
            f"{steady['ready']['median_s']:.1f} s",
        )
        yield Row(
            "operator",
            f"API requests per spec change at {size:,} serving services, its rollout's included",
            f"{steady['requests_per_change']:.1f}",
            "",
            None,
            f"{steady['writes_per_change']:.1f} writes, {steady['reads_per_change']:.1f} reads",
        )
    if "restart" in data:
        restart = data["restart"]
        yield Row(
            "operator",
            f"operator restart at {restart['services']:,} services: start -> every service reconciled",
            f"{restart['reconciled_s']:.1f} s",
            "",
            None,
            f"{restart['requests'] - restart['watches']} requests, {restart['writes']} writes (must be 0)",
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
    """Short requests' TTFT through the operator's picker on each mix, against the plain Service and a picker
    that reads the engines' metrics alone."""
    args = data["args"]
    for name, mix in data["mixes"].items():
        picker = mix["sides"]["picker"]
        load = f"{name}: {mix['short_rate']:g}/s short, {mix['long_rate']:g}/s of {mix['long_tokens']}-token prompts"
        for side, against in (("service", "Service"), ("picker-engine-metrics", "picker, engine metrics alone")):
            base = mix["sides"][side]
            yield Row(
                "routing",
                "short-request TTFT p99 through the picker, 2 sim replicas",
                f"{1000 * picker['ttft_p99_s']:.0f} ms",
                f"{1000 * base['ttft_p99_s']:.0f} ms ({against})",
                _ratio(picker["ttft_p99_s"], base["ttft_p99_s"]),
                f"{load}; {picker['failed']} + {base['failed']} failed",
            )
        yield Row(
            "routing",
            f"{name}: the same p99, window by window: Service / picker",
            _spread(picker["window_p99_ratio"]),
            "",
            None,
            f"{args['rounds']} windows of {args['window']:g} s a side, a connection per request",
        )
        service = mix["sides"]["service"]
        yield Row(
            "routing",
            f"{name}: short-request goodput at TTFT <= {args['slo_ms']:g} ms through the picker",
            f"{picker['goodput_rps']:.2f} req/s",
            f"{service['goodput_rps']:.2f} req/s (Service)",
            _ratio(picker["goodput_rps"], service["goodput_rps"]),
        )


def prefix_routing_rows(data: Obj) -> Iterator[Row]:
    """Conversations' TTFT through the prefix-aware picker on each mix, against the load-only picker and the plain
    Service."""
    args = data["args"]
    for name, mix in data["mixes"].items():
        workload = f"{mix['clients']} conversations on {mix['prefixes']} prompts of {args['system_tokens']} tokens"
        prefix = mix["sides"]["picker-prefix"]
        for side, against in (("picker", "load-only picker"), ("service", "Service")):
            base = mix["sides"][side]
            for key, label in (("ttft_p50_s", "p50"), ("ttft_p99_s", "p99")):
                yield Row(
                    "routing",
                    f"{name}: conversation TTFT {label} through the prefix-aware picker, 3 sim replicas",
                    f"{1000 * prefix[key]:.0f} ms",
                    f"{1000 * base[key]:.0f} ms ({against})",
                    _ratio(prefix[key], base[key]),
                    workload if label == "p50" else f"{prefix['failed']} + {base['failed']} failed",
                )


def canary_rows(data: Obj) -> Iterator[Row]:
    """How soon the canary analysis aborts a slow revision, against how soon it passes a good one."""
    bad, good = data["sides"]["bad"], data["sides"]["good"]
    args = data["args"]
    yield Row(
        "canary",
        f"first request -> abort, a revision {args['factor']:g}x slower, 1 canary replica beside 2",
        f"{bad['decision_s']['median']:.1f} s",
        f"{good['decision_s']['median']:.1f} s (a good one passed)",
        _ratio(bad["decision_s"]["median"], good["decision_s"]["median"]),
        f"trial by trial {_spread(data['abort_to_pass'])}; minRequests {args['min_requests']}",
    )
    yield Row(
        "canary",
        "the bad revision's share of requests before its abort",
        f"{100 * bad['canary_share']['median']:.0f}%",
        f"{100 * good['canary_share']['median']:.0f}% (the good one's, until it passed)",
        _ratio(bad["canary_share"]["median"], good["canary_share"]["median"]),
        f"{bad['failed']} + {good['failed']} failed of {bad['sent']} + {good['sent']}",
    )


SOURCES: dict[str, tuple[str, Callable[[Any], Iterator[Row]]]] = {
    "calibration.json": ("make bench-calibration", calibration_rows),
    "scheduler_cost.json": ("make bench-scheduler", scheduler_rows),
    "padding_waste.json": ("make bench-padding", padding_rows),
    "decode_stalls.json": ("make bench-stalls", stall_rows),
    "kv_admission.json": ("make bench-kv", kv_rows),
    "serving.json": ("make bench-serving", serving_rows),
    "operator.json": ("make bench-operator", operator_rows),
    "routing.json": ("make bench-routing", routing_rows),
    "prefix_routing.json": ("make bench-prefix", prefix_routing_rows),
    "canary.json": ("make bench-canary", canary_rows),
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
    """Four panels: scheduler cost, padding waste, serving goodput, operator apply -> Ready."""
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
        rows = found["serving.json"]["rows"]
        for deployment in dict.fromkeys(row["deployment"] for row in rows):
            chat = [r for r in rows if r["deployment"] == deployment and r["workload"] == "chat"]
            ratios = [
                (r["load"], r["goodput_vs_design"]["median"])
                for r in chat
                if "goodput_vs_design" in r and r["scheduler"] == "defaults"
            ]
            if ratios:
                ax.plot(*zip(*ratios, strict=True), marker="o", label=deployment)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(xlabel="load (fraction of the design's capacity)", ylabel="goodput, defaults / design", yscale="log")
        ax.set_title("Chat goodput on the calibrated simulated device")
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
