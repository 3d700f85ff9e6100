"""Multi-turn conversations' time to first token through a prefix-aware picker, a load-only one and the Service.

One ``device: sim`` service (Llama 3.1 8B on trn2.48xlarge's calibrated clock, TP 1, the default prefill
buckets: powers of two from 128 to 4,096) with three replicas on the real node, rolled out by the operator from
the chart with ``spec.routing``: the operator's router scores load alone (its default). Beside it the bench runs a
copy of that router whose picker adds GIE's prefix-cache scorer at the weight the operator writes for
``prefixCacheWeight`` (:func:`neuronfleet.operator.plan.routing.picker_config`). The same conversations
(``bench/conversations.py``: clients on a few long shared system prompts, each conversation growing turn by
turn, one token asked per turn unless the engine writes the replies) go through the plain Service, the load-only
router and the prefix-aware one, in windows of ``--window`` seconds (``--rounds`` each, the order rotating every
round), every request on a connection of its own. Each of :data:`DEFAULT_MIXES` is run in turn: replies of 30
tokens, then a chat's 150, a chat whose conversations all share one system prompt, and a busy chat (twice the
clients and the prompts). Two more run when ``--mixes`` names them: a long chat (twenty turns: its history grows
past 4,096 tokens), and a chat whose replies the engine generates (streamed; TTFT is the first token's), so a
reply's KV cache is only on the replica that wrote it, as in a real chat.

vLLM's prefix cache is on in every replica: a turn sent back to the replica that served the conversation's last
turn prefills only what is new (the last reply and the new message: a 128-token bucket with short replies, about
80 ms after the history, a 256-token one in a chat, about 125 ms); sent elsewhere, it prefills the history it
misses there (short replies: up to 900 tokens, 0.1 to 0.4 s; a chat: up to 2,000, 0.2 to 0.85 s) and, on a
replica that never saw its system prompt, that too. Every window draws new system prompts and conversations,
so none starts with another's cache, and sends each system prompt once before its clients start (a long-lived
shared prompt is cached somewhere already; where, is the picker's business).

Reported for each mix and side: TTFT p50 and p99 over all windows and each window's median [min-max], turns
answered per second, failures, how often a turn went to the replica that served its conversation's previous
turn, and the p50 of the turns that did and did not; then the load-only picker's p50 and p99 over the
prefix-aware one's (the goal: at least 2x lower).

Run: ``make bench-prefix`` (root: the real node), or ``.venv/bin/python bench/prefix_routing.py --mixes long-chat
generated-chat`` for the other two. Prints a table per mix and the commit it ran on; writes
bench/results/prefix_routing.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from harness.fleet import NAME, Fleet
from provenance import commit, show, spread
from routing import quantile, routed_fleet, side_cells, start_router_copy
from tables import print_table

from neuronfleet.contract import picker
from neuronfleet.contract.model_shapes import served_name
from neuronfleet.contract.names import HTTP_PORT
from neuronfleet.engine.fleet import rig
from neuronfleet.engine.fleet.workloads import PREFIX_MIXES as MIXES
from neuronfleet.operator import api
from neuronfleet.operator.plan import picker as picker_plan
from neuronfleet.operator.plan import routing

RESULTS = Path(__file__).resolve().parent / "results" / "prefix_routing.json"
DRIVER = Path(__file__).resolve().parent / "conversations.py"
Obj = dict[str, Any]
#: The engines' limits (the twin's, ``rig.PREFIX_ENGINE``), and their prefill buckets: the engine's default ladder,
#: powers of two from 128. A long chat's history runs past 4,096 tokens. (Eight sequences of 8,192 tokens would not
#: fit one replica's cache of about 54k; the scheduler's default KV admission goes by the requests' own bounds, and
#: these ask one token.) A decode step reads the KV cache of the shortest context bucket that holds its longest
#: sequence, not 8,192.
ENGINE: Obj = dict(rig.PREFIX_ENGINE)


#: The mixes run unless ``--mixes`` names others (27 minutes).
DEFAULT_MIXES = ("short-replies", "chat", "one-prompt", "busy-chat")
REPLICAS = 3
#: The prefix-aware copy of the operator's router.
PREFIX_AWARE = f"{routing.router_name(NAME)}-prefix"
SIDES = {"service": NAME, "picker": routing.router_name(NAME), "picker-prefix": PREFIX_AWARE}


def window(fleet: Fleet, mix: str, side: str, args: argparse.Namespace, index: int) -> list[Obj]:
    """One window of ``mix``'s conversations through ``side``: each turn's outcome."""
    cluster_ip = fleet.get("service", SIDES[side])["spec"]["clusterIP"]
    argv = [
        "ip", "netns", "exec", fleet.node.netns, sys.executable, str(DRIVER),
        f"--url=http://{cluster_ip}:{HTTP_PORT}/v1/completions",
        f"--model={served_name(fleet.manifest['spec']['model']['uri'])}",
        f"--duration={window_seconds(args, mix)}",
        f"--conversations={MIXES[mix].clients}",
        f"--prefixes={MIXES[mix].prefixes}",
        f"--system-tokens={args.system_tokens}",
        f"--turns={turns_of(args, mix)}",
        f"--user-tokens={args.user_tokens}",
        f"--reply-tokens={MIXES[mix].reply_tokens}",
        f"--think={args.think}",
        # New prompts every window: no side starts with what another left cached.
        f"--seed={mix}-{side}-{index}",
        *(["--generate"] if MIXES[mix].generated else []),
    ]  # fmt: skip
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=window_seconds(args, mix) + 120, check=False)
    if ran.returncode != 0:
        raise RuntimeError(f"the conversations driver failed: {ran.stderr[-2000:]}")
    outcomes = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    for failed in [t for t in outcomes if t["status"] != 200]:
        print(
            f"    {mix}: failed through the {side}, window {index + 1}: {json.dumps(failed, sort_keys=True)}",
            flush=True,
        )
    return outcomes


def turns_of(args: argparse.Namespace, mix: str) -> int:
    """Turns per conversation of ``mix``."""
    return MIXES[mix].turns or args.turns


def window_seconds(args: argparse.Namespace, mix: str) -> float:
    """Seconds per window of ``mix``."""
    return float(args.window) * MIXES[mix].window_scale


def summary(outcomes: list[Obj], seconds: float) -> Obj:
    """TTFT p50/p99 of the answered turns, turns per second, failures, and how often a turn stayed put."""
    turns = [t for t in outcomes if not t.get("warmup")]
    ok = [t for t in turns if t["status"] == 200]
    latencies = sorted(t["latency_s"] for t in ok)
    last: dict[tuple[int, int], str] = {}
    # A later turn's latency by whether it went to the replica that served the conversation's previous turn.
    later: dict[bool, list[float]] = {True: [], False: []}
    for turn in ok:
        key = (turn["client"], turn["prefix"])
        if turn["turn"] > 0 and key in last:
            later[last[key] == turn["replica"]].append(turn["latency_s"])
        last[key] = turn["replica"]
    stayed, moved = len(later[True]), len(later[False])
    return {
        "sent": len(turns),
        "failed": len(turns) - len(ok),
        "ttft_p50_s": _quantile(latencies, 0.5),
        "ttft_p99_s": _quantile(latencies, 0.99),
        "turns_per_s": len(ok) / seconds,
        "same_replica_share": stayed / (stayed + moved) if stayed + moved else float("nan"),
        "stayed_ttft_p50_s": _quantile(sorted(later[True]), 0.5),
        "moved_ttft_p50_s": _quantile(sorted(later[False]), 0.5),
        "replicas_used": len({t["replica"] for t in ok} - {None}),
    }


def _quantile(latencies: list[float], q: float) -> float:
    return quantile(latencies, q) if latencies else float("nan")


def parse() -> argparse.Namespace:
    """The bench's options."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=40.0, help="seconds per window")
    parser.add_argument("--rounds", type=int, default=3, help="windows per side")
    parser.add_argument("--system-tokens", type=int, default=1500, help="words (tokens) in a system prompt")
    parser.add_argument("--turns", type=int, default=10, help="turns per conversation")
    parser.add_argument("--user-tokens", type=int, default=60, help="words (tokens) in a user message")
    parser.add_argument("--think", type=float, default=1.5, help="seconds between an answer and the next turn")
    parser.add_argument("--prefix-weight", type=float, default=4.0, help="the prefix-aware picker's prefixCacheWeight")
    parser.add_argument("--mixes", nargs="+", choices=list(MIXES), default=list(DEFAULT_MIXES), help="the mixes to run")
    return parser.parse_args()


def main() -> None:
    """Start the rig, run the windows, print the table and write the results."""
    args = parse()
    began = time.monotonic()
    windows: dict[str, dict[str, list[list[Obj]]]] = {mix: {side: [] for side in SIDES} for mix in args.mixes}
    with routed_fleet("bench-prefix", ENGINE, REPLICAS) as fleet:
        engine = api.parse_service_spec(fleet.manifest["spec"]).engine
        # As the operator's own picker here, the prefix-aware copy counts its tokens in flight too, against the
        # same prefill step.
        scoring = picker.PickerScoring(
            args.prefix_weight, engine.block_size, inflight_tokens=True, step_tokens=engine.max_num_batched_tokens
        )
        start_router_copy(fleet, PREFIX_AWARE, picker_plan.picker_config(scoring))
        print(f"[{time.monotonic() - began:5.0f} s] {REPLICAS} replicas Ready behind both pickers", flush=True)
        sides = list(SIDES)
        for mix in args.mixes:
            for index in range(args.rounds):
                for side in sides[index % len(sides) :] + sides[: index % len(sides)]:
                    windows[mix][side].append(window(fleet, mix, side, args, index))
                    print(
                        f"[{time.monotonic() - began:5.0f} s] {mix}: window {index + 1} through the {side}", flush=True
                    )
    results = {"commit": commit(), "args": vars(args), "engine": ENGINE, "wall_s": time.monotonic() - began}
    results["mixes"] = {mix: {**asdict(MIXES[mix]), **figures(args, mix, windows[mix])} for mix in args.mixes}
    for mix in args.mixes:
        print_mix(args, mix, results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"wrote {RESULTS}")


def figures(args: argparse.Namespace, mix: str, windows: dict[str, list[list[Obj]]]) -> Obj:
    """A mix's figures: each side's over all its windows and window by window, the load-only picker's p50 and p99
    over the prefix-aware one's, and every turn (to look into a figure afterwards)."""
    seconds = window_seconds(args, mix)
    sides = {
        side: {
            **summary([t for got in rounds for t in got], seconds * args.rounds),
            "window_ttft_p50_s": spread([summary(got, seconds)["ttft_p50_s"] for got in rounds]),
            "window_ttft_p99_s": spread([summary(got, seconds)["ttft_p99_s"] for got in rounds]),
        }
        for side, rounds in windows.items()
    }
    load_only, prefix = sides["picker"], sides["picker-prefix"]
    ratios = {q: load_only[f"ttft_{q}_s"] / prefix[f"ttft_{q}_s"] for q in ("p50", "p99")}
    return {"sides": sides, "load_only_over_prefix": ratios, "turns": windows}


def print_mix(args: argparse.Namespace, mix: str, results: Obj) -> None:
    """Print one mix's table and its ratios."""
    sides, ratios = results["mixes"][mix]["sides"], results["mixes"][mix]["load_only_over_prefix"]
    title = (
        f"{mix}: {MIXES[mix].clients} clients in conversations of {turns_of(args, mix)} turns "
        f"({args.user_tokens}-token messages, {MIXES[mix].reply_tokens}-token replies) on {MIXES[mix].prefixes} "
        f"system prompts of {args.system_tokens} tokens "
        f"({args.think:g} s between turns, {'the replies generated' if MIXES[mix].generated else '1 token asked'}), "
        f"{REPLICAS} sim replicas (Llama 3.1 8B, trn2.48xlarge, TP 1), {args.rounds} windows of "
        f"{window_seconds(args, mix):g} s per side, rotating, a connection per request; took "
        f"{results['wall_s'] / 60:.1f} min in all; commit {results['commit']}"
    )
    printed = []
    for side, figures in sides.items():
        p50s, p99s = (
            {k: 1000 * v for k, v in figures[key].items()} for key in ("window_ttft_p50_s", "window_ttft_p99_s")
        )
        printed.append(
            [
                *side_cells(side, figures),
                show(p50s, "{:.0f}"),
                show(p99s, "{:.0f}"),
                f"{figures['turns_per_s']:.2f}",
                f"{figures['same_replica_share']:.0%}",
                f"{1000 * figures['stayed_ttft_p50_s']:.0f} / {1000 * figures['moved_ttft_p50_s']:.0f} ms",
            ]
        )
    columns = ["route", "sent", "failed", "TTFT p50", "TTFT p99", "p50 by window, ms", "p99 by window, ms"]
    print_table(title, [*columns, "turns/s", "same replica", "p50 stayed / moved"], printed)
    answered = sides["picker-prefix"]["turns_per_s"] / sides["picker"]["turns_per_s"]
    print(
        f"{mix}: TTFT, load-only picker / prefix-aware picker (weight {args.prefix_weight:g}): p50 "
        f"{ratios['p50']:.2f}x, p99 {ratios['p99']:.2f}x (goal >= 2x); turns/s {answered:.2f}x"
    )


if __name__ == "__main__":
    main()
