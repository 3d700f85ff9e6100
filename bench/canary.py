"""How soon the operator's canary analysis turns a bad revision away, against how soon it passes a good one, on
real pods.

One ``device: sim`` service (Llama 3.1 8B on trn2.48xlarge's calibrated clock) with two replicas on the real node,
rolled out by the operator from the chart. Each trial sends a load through the Service (a connection per request,
so kube-proxy picks a replica for each) and changes the prefill buckets as a canary: one step at 34% (one canary
replica beside the two stable ones) held for an hour, so only the analysis ends it. As the first request starts
on the canary's replica, its simulated device is made ``--factor`` times slower (a bad revision) or left as fast
(a good one: a slowdown of 1, the same action). Measured from that request: until the canary is aborted (bad) or
its analysis first passes (good: TTFT, ITL, errors and padding within the limits over ``--min-requests``
completions); the share of the requests sent meanwhile that the canary served; failed requests. Then the service
goes back to its stable buckets and the canary's replica goes. Trials alternate, good first in odd rounds.

Abort time / pass time says what turning a bad revision away costs beside accepting a good one: both wait for the
same evidence, so about 1x is the goal; the share says what the bad revision served before it was turned away.

Run: ``make bench-canary`` (root: the real node). Prints one table and the commit it ran on; writes
bench/results/canary.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from harness.fleet import Fleet, identity_hash
from provenance import commit, show, spread
from routing import routed_fleet
from tables import print_table

from neuronfleet.contract.names import LABEL_ARTIFACT
from neuronfleet.devcluster.process.waiting import wait_for

RESULTS = Path(__file__).resolve().parent / "results" / "canary.json"
Obj = dict[str, Any]

#: One canary replica beside two stable ones (``canary_replicas(2, 34)``).
WEIGHT = 34
HOLD_S = 3600
#: Each side's revision: other prefill buckets than the fleet's ([128, 256]), and than each other's.
BUCKETS = {"good": [64, 256], "bad": [64, 128, 256]}
#: The engine of the real-node tests' canary: two cores run both revisions and the load, so the latency limits
#: are loose enough for that noise and tight enough for a device made five times slower.
LIMITS = {"maxTtftP99Ratio": 2.5, "maxItlP99Ratio": 2.5}


def as_canary(fleet: Fleet, buckets: list[int], min_requests: int) -> Obj:
    """The service with other prefill buckets, rolled out as a canary that only its analysis ends."""
    manifest = fleet.with_buckets(buckets)
    manifest["spec"]["rollout"]["canary"] = {
        "steps": [{"weight": WEIGHT, "pauseSeconds": HOLD_S}],
        "analysis": {"minRequests": min_requests, **LIMITS},
    }
    return manifest


def canary_state(fleet: Fleet) -> Obj:
    """The service's canary status ({} without one)."""
    return dict(fleet.status().get("canary") or {})


def verdict(state: Obj) -> str | None:
    """``aborted``, ``passed`` (an analysis within the limits, as its message reads) or None while undecided."""
    if state.get("phase") == "Aborted":
        return "aborted"
    analysis = state.get("analysis") or ""
    # A passing analysis names its figures "(over N canary and M stable completions)"; a waiting one counts.
    return "passed" if analysis.endswith("stable completions)") and "limits broken" not in analysis else None


def trial(fleet: Fleet, side: str, index: int, args: argparse.Namespace) -> Obj:
    """One canary of ``side``'s revision under load, until the analysis decides; then back to the stable one."""
    stable_manifest, stable = copy.deepcopy(fleet.manifest), fleet.status()["currentRevision"]
    manifest = as_canary(fleet, BUCKETS[side], args.min_requests)
    revision = identity_hash(manifest)
    assert revision != stable, f"the {side} revision is the stable one: no canary to run"
    factor = args.factor if side == "bad" else 1.0
    with fleet.load(f"{side}-{index}", rate=args.rate, keep_alive=False) as load:
        fleet.apply(manifest)
        fleet.wait(lambda: canary_state(fleet).get("stepStartedAt"), "the canary's replica Ready")
        (pod,) = [p for p in fleet.pods() if p["metadata"]["labels"][LABEL_ARTIFACT] == revision]
        first_at, _ = fleet.inject_fault(pod, {"kind": "slow", "factor": factor})
        decided, decided_at = wait_for(
            lambda: (canary_state(fleet), time.time()),
            lambda seen: verdict(seen[0]) is not None,
            timeout=args.timeout,
            interval=0.25,
            what=f"the {side} canary's analysis decided",
        )
        result = load.stop()
    fleet.apply(stable_manifest)
    fleet.wait(lambda: fleet.rolled_out_to(stable), "back on the stable revision")
    meanwhile = result.sent_between(first_at, decided_at)
    return {
        "verdict": verdict(decided),
        "decision_s": decided_at - first_at,
        "canary_share": sum(a.header == revision for a in meanwhile) / max(len(meanwhile), 1),
        "sent_meanwhile": len(meanwhile),
        "sent": len(result.answers),
        "failed": sum(result.failed.values()),
        "analysis": decided["analysis"],
    }


def main() -> None:
    """Start the rig, run the trials, print the table and write the results."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="trials per side")
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second through the Service")
    parser.add_argument("--factor", type=float, default=5.0, help="how many times slower the bad revision's device")
    parser.add_argument("--min-requests", type=int, default=20, help="the analysis' minRequests")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds a trial waits for a decision")
    args = parser.parse_args()

    began = time.monotonic()
    trials: dict[str, list[Obj]] = {"good": [], "bad": []}
    with routed_fleet("bench-canary", {}, router=False) as fleet:
        print(f"[{time.monotonic() - began:5.0f} s] service Ready", flush=True)
        for index in range(args.rounds):
            for side in ("good", "bad") if index % 2 == 0 else ("bad", "good"):
                trials[side].append(figures := trial(fleet, side, index, args))
                print(
                    f"[{time.monotonic() - began:5.0f} s] {side} canary {index + 1}: {figures['verdict']} after "
                    f"{figures['decision_s']:.1f} s, {figures['canary_share']:.0%} of {figures['sent_meanwhile']}",
                    flush=True,
                )
    results: Obj = {
        "commit": commit(),
        "args": vars(args),
        "wall_s": time.monotonic() - began,
        "trials": trials,
        "sides": {side: summary(got) for side, got in trials.items()},
        "abort_to_pass": spread(
            [b["decision_s"] / g["decision_s"] for b, g in zip(trials["bad"], trials["good"], strict=True)]
        ),
    }
    report(results)
    wrong = [t for side, want in (("good", "passed"), ("bad", "aborted")) for t in trials[side] if t["verdict"] != want]
    if wrong:
        sys.exit(f"{len(wrong)} trials decided the other way: {wrong}")


def summary(trials: list[Obj]) -> Obj:
    """A side's figures over its trials."""
    return {
        "decision_s": spread([t["decision_s"] for t in trials]),
        "canary_share": spread([t["canary_share"] for t in trials]),
        "sent": sum(t["sent"] for t in trials),
        "failed": sum(t["failed"] for t in trials),
        "verdicts": [t["verdict"] for t in trials],
    }


def report(results: Obj) -> None:
    """Print the table and write the JSON."""
    args = results["args"]
    title = (
        f"A canary at {WEIGHT}% (1 replica beside 2), Llama 3.1 8B sim on trn2.48xlarge, {args['rate']:g} req/s "
        f"through the Service, minRequests {args['min_requests']}, the bad revision {args['factor']:g}x slower; "
        f"{args['rounds']} trials a side; took {results['wall_s'] / 60:.1f} min; commit {results['commit']}"
    )
    rows = [
        [
            f"{side} revision: {', '.join(figures['verdicts'])}",
            show(figures["decision_s"], "{:.1f}"),
            show({k: 100 * v for k, v in figures["canary_share"].items()}, "{:.0f}"),
            str(figures["sent"]),
            str(figures["failed"]),
        ]
        for side, figures in results["sides"].items()
    ]
    columns = ["canary", "first request -> decision, s", "canary's share meanwhile, %", "sent", "failed"]
    print_table(title, columns, rows)
    print(f"abort time / pass time, trial by trial: {show(results['abort_to_pass'])} (goal: about 1x)")
    for side, trials in results["trials"].items():
        for figures in trials:
            print(f"  {side}, {figures['verdict']}: {figures['analysis']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
