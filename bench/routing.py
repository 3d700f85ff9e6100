"""Short requests' time to first token through the Endpoint Picker, against the plain Service, on real pods.

One ``device: sim`` service (Llama 3.1 8B on trn2.48xlarge's calibrated clock, TP 1: a 4,096-token prefill takes
about 1.26 s, a 20-token one 66 ms) with two replicas on the real node, rolled out by the operator from the chart,
with ``spec.routing``: neuronfleet's build of GIE v1.5.0's Endpoint Picker (``tools/gie``: with the in-flight
tokens scorer) and Envoy 1.40 in front of the same pods. Beside the operator's router the bench runs a copy of
it whose picker scores by the engines' metrics alone (the operator's scoring without the in-flight tokens
scorer, as with GIE's own image), so what the picker's own count adds is measured as well as routing against
no picker. The same load goes through the plain Service (kube-proxy: a random replica) and through each
router's Service, in windows of ``--window`` seconds (``--rounds`` each, the order rotating every round), every
request on a connection of its own on every side (so kube-proxy picks a replica per request, as a picker does):
two open-loop streams of Poisson arrivals (every side of a round gets the same ones, from the same seeds), long
prompts (near the largest bucket, or shorter) and short chat-sized prompts (20 words) asking for one token, so
a short request's latency is its time to first token. A replica runs one prefill per step: a short request sent
to a replica in a long prefill waits it out. Long prompts arrive on average further apart than one takes to
prefill, so a picker that knows where each went can mostly keep the short ones off it; evenly spaced arrivals
would meet each other at the same few offsets all window long, and hide or exaggerate what a picker does in
the moments right after it routes a long prompt. Each of ``--mixes`` (``fleet.workloads.ROUTING_MIXES``: rates
and prompt lengths, which the fleet twin replays) is run in turn. Every prompt starts with a mark of its own,
made of its own words (the load's ``--distinct-prompts``): vLLM's prefix cache is on, and would serve a repeated
long prompt in about 70 ms instead of prefilling it in 1.26 s.

Reported, for the short requests of each mix on each side: TTFT p50 and p99 (inclusive quantiles) over all
windows and each window's as median [min-max], goodput (short requests per second whose TTFT met ``--slo-ms``),
failures, and the ratio of the Service's p99 to each picker's, round by round (the goal: at least 1.5x lower
through the operator's picker on every mix).

Run: ``make bench-routing`` (root: the real node). Prints one table and the commit it ran on; writes
bench/results/routing.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from harness.fleet import LLAMA_8B_MODEL, NAME, Fleet, started
from harness.node_load import Answer
from provenance import commit, show, spread
from tables import print_table

from neuronfleet.contract import picker
from neuronfleet.contract.names import MANAGED_BY_LABEL
from neuronfleet.devcluster.addons.routing import install_gie_crds
from neuronfleet.devcluster.cluster.local import LocalCluster, reap_orphans
from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.images.dockerfile import BuiltImage, build
from neuronfleet.devcluster.images.inputs import TARGETS, Target
from neuronfleet.devcluster.process.tools import NodeTools
from neuronfleet.devcluster.realnode import node
from neuronfleet.devcluster.realnode.node import RealNode
from neuronfleet.devcluster.realnode.store import NodeImageStore, OciImage
from neuronfleet.engine.fleet.workloads import LONG_MAX_TOKENS, ROUTING_MIXES, SHORT_TOKENS, stream_seed
from neuronfleet.operator.plan import RouterImages, routing
from neuronfleet.operator.plan import envoy as envoy_plan
from neuronfleet.operator.plan import picker as picker_plan

RESULTS = Path(__file__).resolve().parent / "results" / "routing.json"
Obj = dict[str, Any]
#: The service's engine: room for prompts up to the long ones, buckets for them and one for chat.
ENGINE: Obj = {
    "max_model_len": 4096,
    "max_num_batched_tokens": 4096,
    "num_batched_tokens_buckets": [128, 2048, 4096],
    "max_num_seqs": 8,
}
#: The copy of the operator's router whose picker scores by the engines' metrics alone.
ENGINE_METRICS = f"{routing.router_name(NAME)}-engine-metrics"
SIDES = {"service": NAME, "picker": routing.router_name(NAME), "picker-engine-metrics": ENGINE_METRICS}
#: The pickers measured against the Service.
PICKERS = ("picker", "picker-engine-metrics")


def node_image(real_node: RealNode) -> Callable[[Target], BuiltImage]:
    """The operator or engine image, built (or up to date) and imported into the real node."""
    imported: dict[Target, BuiltImage] = {}

    def load(target: Target) -> BuiltImage:
        if target not in imported:
            image = build(target)
            real_node.import_image(OciImage.of(image))
            imported[target] = image
        return imported[target]

    return load


def router_images(real_node: RealNode) -> RouterImages:
    """The picker's and Envoy's images, built (or cached) and imported into the real node."""
    for archive in (node_images.picker_image(), node_images.envoy_image()):
        real_node.import_image(OciImage.read(archive))
    return RouterImages(node_images.PICKER_IMAGE, node_images.ENVOY_IMAGE, picker_inflight_tokens=True)


def start_router_copy(fleet: Fleet, name: str, config: Obj | None) -> None:
    """A copy of the operator's router (its pods' spec, its Envoy, its pool) named ``name``, whose picker scores by
    ``config`` (an ``EndpointPickerConfig``) or, for ``None``, GIE's defaults (no ``--config-text``).

    Its own labels keep it out of the operator's watches and out of the router Service's endpoints.
    """
    original = fleet.get("deployment", routing.router_name(NAME))
    spec = copy.deepcopy(original["spec"])
    labels = {**spec["selector"]["matchLabels"], "app.kubernetes.io/instance": name}
    labels.pop(MANAGED_BY_LABEL, None)
    spec["selector"] = {"matchLabels": labels}
    spec["template"]["metadata"]["labels"] = labels
    picker = spec["template"]["spec"]["containers"][0]
    picker["args"] = [arg for arg in picker["args"] if not arg.startswith("--config-text=")]
    if config is not None:
        picker["args"].append(f"--config-text={json.dumps(config, sort_keys=True)}")
    service = fleet.get("service", routing.router_name(NAME))
    objects = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": labels, "ports": service["spec"]["ports"]},
        },
    ]
    path = fleet.workdir / f"{name}-router.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    fleet.kubectl("apply", "-f", str(path))
    fleet.kubectl("rollout", "status", f"deployment/{name}", "--timeout=300s")


@contextlib.contextmanager
def routed_fleet(name: str, engine: Obj, replicas: int = 2, *, router: bool = True) -> Iterator[Fleet]:
    """A real-node cluster with the service of Llama 3.1 8B (``engine`` its engine fields) Ready behind the
    operator's router (without ``router``: its Service alone), ``replicas`` of it; the cluster stopped
    afterwards."""
    if os.geteuid() != 0:
        sys.exit("the real node needs root")
    reap_orphans()
    store = NodeImageStore.default(NodeTools.locate().directory)
    store.prepare([OciImage.of(build(target)) for target in TARGETS], say=lambda line: print(f"==> {line}"))
    cluster = LocalCluster.start(
        f"{name}-{os.getpid()}", fleet=node.fleet_beside(), owner_pid=os.getpid(), real_node=True
    )
    try:
        real_node = cluster.real_node
        assert real_node is not None
        install_gie_crds(cluster)
        workdir = cluster.state.workdir / "bench"
        workdir.mkdir()
        with started(
            cluster,
            real_node,
            node_image(real_node),
            workdir,
            model=LLAMA_8B_MODEL,
            router_images=router_images(real_node) if router else None,
            engine_config=engine,
            replicas=replicas,
        ) as fleet:
            yield fleet
    finally:
        cluster.stop()


def prompt(words: int) -> str:
    """``words`` words (tokens, to the simulated tokenizer); the load marks each request's copy as its own."""
    vocabulary = ["bada", "bade", "badi", "bado", "badu", "beda", "bede", "bedi"]
    return " ".join(vocabulary[(i * 7) % len(vocabulary)] for i in range(words))


def window(fleet: Fleet, side: str, seconds: float, mix: str, index: int) -> tuple[list[Answer], int]:
    """One window of both streams of ``mix`` through ``side``: the short requests' answers, and how many longs
    failed."""
    through, load = SIDES[side], ROUTING_MIXES[mix]
    longs = fleet.load(
        f"{mix}-{side}-{index}-long",
        rate=load.long_rate,
        max_tokens=LONG_MAX_TOKENS,
        through=through,
        prompt=prompt(load.long_tokens),
        distinct_prompts=True,
        keep_alive=False,
        poisson_seed=stream_seed(mix, index, "long"),
    )
    shorts = fleet.load(
        f"{mix}-{side}-{index}-short",
        rate=load.short_rate,
        max_tokens=1,
        through=through,
        prompt=prompt(SHORT_TOKENS),
        distinct_prompts=True,
        keep_alive=False,
        poisson_seed=stream_seed(mix, index, "short"),
    )
    longs.start()
    shorts.start()
    time.sleep(seconds)
    short_result, long_result = shorts.stop(), longs.stop()
    return short_result.answers, len([a for a in long_result.answers if not a.ok])


def quantile(values: list[float], q: float) -> float:
    """Inclusive quantile (the median for 0.5)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def summary(answers: list[Answer], seconds: float, slo_s: float) -> Obj:
    """TTFT p50/p99 of the short requests that succeeded, goodput at the SLO, failures."""
    ok = sorted(a.latency_s for a in answers if a.ok)
    return {
        "sent": len(answers),
        "failed": len(answers) - len(ok),
        "ttft_p50_s": quantile(ok, 0.5),
        "ttft_p99_s": quantile(ok, 0.99),
        "goodput_rps": sum(1 for latency in ok if latency <= slo_s) / seconds,
        # Envoy names the replica; through the plain Service nothing does (0: not known).
        "replicas_used": len({a.recorded.get(envoy_plan.UPSTREAM_HEADER) for a in answers if a.ok} - {None}),
    }


def main() -> None:
    """Start the rig, run each mix's windows, print the tables and write the results."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=40.0, help="seconds per window")
    parser.add_argument("--rounds", type=int, default=3, help="windows per side and mix")
    parser.add_argument(
        "--mixes", default=",".join(ROUTING_MIXES), help=f"which of {', '.join(ROUTING_MIXES)}, comma-separated"
    )
    parser.add_argument("--slo-ms", type=float, default=300.0, help="TTFT goal of a short request")
    args = parser.parse_args()
    mixes = args.mixes.split(",")
    if unknown := set(mixes) - set(ROUTING_MIXES):
        parser.error(f"no such mix: {', '.join(sorted(unknown))} (known: {', '.join(ROUTING_MIXES)})")

    began = time.monotonic()
    windows: dict[str, dict[str, list[list[Answer]]]] = {mix: {side: [] for side in SIDES} for mix in mixes}
    long_failures = {mix: dict.fromkeys(SIDES, 0) for mix in mixes}
    with routed_fleet("bench-routing", ENGINE) as fleet:
        start_router_copy(fleet, ENGINE_METRICS, picker_plan.picker_config(picker.PickerScoring(inflight_tokens=False)))
        print(f"[{time.monotonic() - began:5.0f} s] service Ready behind both pickers", flush=True)
        sides = list(SIDES)
        for mix in mixes:
            for index in range(args.rounds):
                # Each side goes first, in the middle and last once every len(SIDES) rounds.
                for side in sides[index % len(sides) :] + sides[: index % len(sides)]:
                    got, failed_longs = window(fleet, side, args.window, mix, index)
                    windows[mix][side].append(got)
                    long_failures[mix][side] += failed_longs
                    elapsed = time.monotonic() - began
                    print(f"[{elapsed:5.0f} s] {mix}: window {index + 1} through the {side}", flush=True)
    results: Obj = {
        "commit": commit(),
        "args": vars(args),
        "engine": ENGINE,
        "wall_s": time.monotonic() - began,
        "mixes": {
            mix: {**asdict(ROUTING_MIXES[mix]), "sides": mix_figures(windows[mix], long_failures[mix], args)}
            for mix in mixes
        },
    }
    report(results)


def mix_figures(windows: dict[str, list[list[Answer]]], long_failures: dict[str, int], args: argparse.Namespace) -> Obj:
    """Each side's figures over one mix's windows, and each picker's ratios to the Service, window by window."""
    seconds, slo_s = args.window * args.rounds, args.slo_ms / 1000
    sides: Obj = {
        side: {
            **summary([a for got in rounds for a in got], seconds, slo_s),
            "long_failed": long_failures[side],
            "window_ttft_p99_s": spread([summary(got, args.window, slo_s)["ttft_p99_s"] for got in rounds]),
        }
        for side, rounds in windows.items()
    }
    service = sides["service"]
    for side in PICKERS:
        picker = sides[side]
        picker["p99_ratio"] = service["ttft_p99_s"] / picker["ttft_p99_s"]
        picker["window_p99_ratio"] = spread(
            [
                summary(theirs, args.window, slo_s)["ttft_p99_s"] / summary(ours, args.window, slo_s)["ttft_p99_s"]
                for ours, theirs in zip(windows[side], windows["service"], strict=True)
            ]
        )
        picker["goodput_ratio"] = picker["goodput_rps"] / service["goodput_rps"] if service["goodput_rps"] else None
    return sides


def side_cells(side: str, figures: Obj) -> list[str]:
    """The first cells of a side's row in a routing bench's table: its name, requests sent and failed, TTFT p50
    and p99."""
    return [
        side,
        str(figures["sent"]),
        str(figures["failed"]),
        f"{1000 * figures['ttft_p50_s']:.0f} ms",
        f"{1000 * figures['ttft_p99_s']:.0f} ms",
    ]


def report(results: Obj) -> None:
    """Print a table per mix and write the JSON."""
    args = results["args"]
    for name, mix in results["mixes"].items():
        title = (
            f"{name}: short requests ({SHORT_TOKENS} tokens, 1 generated) at {mix['short_rate']:g}/s beside long ones "
            f"({mix['long_tokens']} tokens) at {mix['long_rate']:g}/s, two sim replicas (Llama 3.1 8B, "
            f"trn2.48xlarge, TP 1), {args['rounds']} windows of {args['window']:g} s per side, alternating, a "
            f"connection per request; commit {results['commit']}"
        )
        printed = []
        for side, figures in mix["sides"].items():
            by_window = {key: 1000 * value for key, value in figures["window_ttft_p99_s"].items()}
            printed.append(
                [
                    *side_cells(side, figures),
                    show(by_window, "{:.0f}"),
                    f"{figures['goodput_rps']:.2f} req/s",
                    str(figures["replicas_used"] or "-"),
                ]
            )
        columns = ["route", "sent", "failed", "TTFT p50", "TTFT p99", "p99 by window, ms", "goodput", "replicas"]
        print_table(title, columns, printed)
        for side in PICKERS:
            figures = mix["sides"][side]
            print(
                f"{name}: short-request TTFT p99, Service / {side}: {figures['p99_ratio']:.2f}x over all windows, "
                f"{show(figures['window_p99_ratio'])} window by window (goal >= 1.5x); goodput at "
                f"TTFT <= {args['slo_ms']:g} ms, {side} / Service: {figures['goodput_ratio'] or float('nan'):.2f}x"
            )
    print(f"took {results['wall_s'] / 60:.1f} min")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
