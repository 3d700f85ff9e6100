"""The fleet twin: GIE's scoring rules, the picker's own counts, the autoscaler, and runs of the real scheduler."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from neuronfleet.contract import picker as scoring_rules
from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.start_time import predict_start
from neuronfleet.devcluster.demo.load import LoadPlan
from neuronfleet.engine.fleet import arrivals, planner, rig, twin
from neuronfleet.engine.fleet.autoscaler import Autoscaler, AutoscalingPolicy, Signals, WarmFloor
from neuronfleet.engine.fleet.engines import LocalEngines
from neuronfleet.engine.fleet.picker import RULES, PrefixIndex, Scoring, ServiceRouter, View
from neuronfleet.engine.fleet.replica import ReplicaEngine, ReplicaStuck
from neuronfleet.engine.fleet.workloads import ROUTING_MIXES, stream_seed
from neuronfleet.operator import api


def views(**columns: list[float]) -> list[View]:
    count = len(next(iter(columns.values())))
    defaults: dict[str, object] = {
        "waiting": 0,
        "running": 0,
        "kv_usage": 0.0,
        "inflight_tokens": 0,
        "prefix_blocks": 0,
    }
    rows = [{**defaults, **{name: values[i] for name, values in columns.items()}} for i in range(count)]
    return [View(None, adapters=frozenset(), **row) for row in rows]  # type: ignore[arg-type]


def scoring(**parameters: object) -> Scoring:
    return Scoring(arrivals.TwinRequest("r", 0.0, (1,), 1), blocks=4, parameters=parameters, max_loras=0)


def test_every_scorer_the_contract_can_name_has_a_rule_in_the_twin() -> None:
    everything = scoring_rules.PickerScoring(2.0, lora_affinity=True, inflight_tokens=True)
    assert {scorer.type for scorer in everything.scorers()} == set(RULES)


def test_load_scorers_spread_from_the_least_loaded_as_gie_does() -> None:
    queue = RULES[scoring_rules.QUEUE_SCORER](scoring(), views(waiting=[0, 2, 4]))
    assert queue == [1.0, 0.5, 0.0]
    # All equal: every candidate scores 1, not 0 (a division by the spread would fail).
    assert RULES[scoring_rules.RUNNING_REQUESTS_SCORER](scoring(), views(running=[3, 3])) == [1.0, 1.0]
    assert RULES[scoring_rules.KV_CACHE_SCORER](scoring(), views(kv_usage=[0.25, 1.0])) == [0.75, 0.0]


def test_inflight_tokens_count_against_a_full_prefill_step_when_the_spread_is_smaller() -> None:
    rule = RULES[scoring_rules.INFLIGHT_TOKENS_SCORER]
    assert rule(scoring(stepTokens=1000), views(inflight_tokens=[0, 100])) == [1.0, 0.9]
    assert rule(scoring(stepTokens=1000), views(inflight_tokens=[0, 4000])) == [1.0, 0.0]


def test_the_prefix_index_credits_blocks_up_to_the_first_no_replica_holds() -> None:
    index = PrefixIndex(block_bytes=20, chars_per_token=5)
    prompt = arrivals.segment("prompt", 40)
    hashes = index.hashes(prompt)
    assert len(hashes) == 10  # 200 bytes, 20 a block
    index.record(hashes[:6], "a", capacity=100)
    index.record(hashes[:3], "b", capacity=100)
    assert index.matched(hashes) == {"a": 6, "b": 3}
    # A prompt that shares the first block only is credited that block.
    other = index.hashes(prompt[:4] + arrivals.segment("other", 36))
    assert index.matched(other) == {"a": 1, "b": 1}
    # Past its capacity a replica forgets its least recently sent blocks.
    index.record(index.hashes(arrivals.segment("third", 40)), "b", capacity=10)
    assert "b" not in index.matched(hashes)


def test_the_picker_keeps_a_short_request_off_the_replica_it_just_sent_a_long_prompt() -> None:
    spec = rig.rig_spec(rig.ROUTING_ENGINE, 2)
    long = arrivals.TwinRequest("long", 0.0, arrivals.segment("long", 3916), 4)
    short = arrivals.TwinRequest("short", 0.01, arrivals.segment("short", 36), 1)
    source = arrivals.OpenLoop((long, short))
    run = twin.run(spec, source, rig.router("picker", spec.engine, seed=0))
    replicas = {served.request.req_id: served.replica for served in run.served}
    assert replicas["long"] != replicas["short"]
    # The short one ran at once: its TTFT is one small prefill, not the long one's 1.26 s.
    (short_served,) = [s for s in run.served if s.request.req_id == "short"]
    assert short_served.ttft_s < 0.1
    # Within the scrape, the engines' metrics alone cannot tell: over seeds, the short one sometimes waits.
    waits = 0
    for seed in range(8):
        alone = twin.run(spec, source, rig.router("picker-engine-metrics", spec.engine, seed))
        waits += any(s.request.req_id == "short" and s.ttft_s > 1.0 for s in alone.served)
    assert 0 < waits < 8


def test_poisson_arrivals_are_the_rig_load_tools_for_the_same_seed() -> None:
    seed = stream_seed("busy", 1, "short")
    plan = LoadPlan("http://x", rate=5.0, duration_s=40.0, body={"prompt": "a b"}, poisson=True, seed=seed)
    window = ROUTING_MIXES["busy"].window("busy", 1, 40.0)
    shorts = [request.at for request in window.requests if request.req_id.startswith("short")]
    assert shorts == plan.schedule()


def test_conversations_send_the_next_turn_a_think_after_the_answer_with_the_history() -> None:
    clients = arrivals.Conversations(clients=1, prefixes=1, duration_s=100.0, system_tokens=64, user_tokens=8)
    (warmup,) = clients.initial()
    (first,) = clients.answered(warmup, 1.0, (7,))
    assert first.at == 1.0
    assert first.prompt[:64] == warmup.prompt
    (second,) = clients.answered(first, 2.0, (7,))
    assert second.at == 2.0 + clients.think_s
    # The history: the system prompt, the first message and its reply, then the new message.
    assert second.prompt[: len(first.prompt)] == first.prompt
    assert len(second.prompt) == len(first.prompt) + clients.reply_tokens + clients.user_tokens


def test_a_trace_file_is_read_with_shared_prefixes_and_bad_lines_refused(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"time": 1.5, "prompt_tokens": 100, "max_tokens": 8, "prefix": [["system", 60]]}\n'
        '{"time": 0.5, "prompt_tokens": 80, "max_tokens": 4, "prefix": [["system", 60]], "conversation": "c"}\n'
    )
    late, early = sorted(arrivals.read_trace(trace).requests, key=lambda r: -r.at)
    assert (early.at, late.at) == (0.5, 1.5)
    assert early.prompt[:60] == late.prompt[:60]
    assert early.prompt[60:] != late.prompt[60:80]
    assert (len(early.prompt), early.conversation) == (80, "c")
    trace.write_text('{"time": 1, "prompt_tokens": 10}\n')
    with pytest.raises(arrivals.TraceError, match=r"trace\.jsonl:1"):
        arrivals.read_trace(trace)


def test_the_autoscalers_defaults_are_the_crds() -> None:
    crd = api.Autoscaling(max_replicas=8)
    policy = AutoscalingPolicy()
    for field in ("min_replicas", "max_replicas", "waiting_requests_per_replica", "scale_up_replicas"):
        assert getattr(policy, field) == getattr(crd, field), field
    assert policy.scale_up_period_seconds == crd.scale_up_period_seconds
    assert policy.scale_down_stabilization_seconds == crd.scale_down_stabilization_seconds


def test_the_hpa_adds_a_few_replicas_per_period_and_removes_them_only_after_the_window() -> None:
    scaler = Autoscaler(AutoscalingPolicy(min_replicas=1, max_replicas=10, scale_up_replicas=2))
    assert scaler.decide(0.0, 1, Signals(waiting=40)) == 3  # wants 10, adds 2
    assert scaler.decide(15.0, 3, Signals(waiting=40)) == 3  # the period's two are spent
    assert scaler.decide(120.0, 3, Signals(waiting=40)) == 5
    # Load gone: the window remembers wanting 10 for 300 s.
    assert scaler.decide(135.0, 5, Signals(waiting=0)) == 5
    assert scaler.decide(436.0, 5, Signals(waiting=0)) == 1


def test_the_rendered_hpa_keeps_a_replica_that_takes_longer_to_start_than_the_window() -> None:
    """As the operator renders it: with replicas that start in 400 s, the 300 s window becomes 400 s, so the
    replicas added at 0 s are not removed before they serve."""
    policy = AutoscalingPolicy(min_replicas=1, max_replicas=10, scale_up_replicas=2)
    scaler = Autoscaler.rendered(policy, start_s=400.0)
    assert scaler.decide(0.0, 1, Signals(waiting=40)) == 3
    assert scaler.decide(301.0, 3, Signals(waiting=0)) == 3, "still loading at 301 s"
    assert scaler.decide(401.0, 3, Signals(waiting=0)) == 1
    assert Autoscaler.rendered(policy, start_s=30.0).policy == policy


def test_the_hpa_follows_the_trigger_that_wants_most_replicas() -> None:
    """Nothing waits while capacity matches the load: the queue asks for none, the prefill backlog (seconds of
    prefill work held, 2 s a replica) and the warm floor (the load's 3.2 busy replicas doubling during a 300 s
    lag, 2 s of waiting allowed: 6.36) ask for what the load needs."""
    floor = WarmFloor(step=1.0, ttft_s=2.0)
    policy = AutoscalingPolicy(max_replicas=16, prefill_backlog_seconds=2.0, warm_floor=floor)
    quiet_queue = Signals(waiting=0, prefill_backlog_s=9.0, busy=3.2, lag_s=300.0)
    assert Autoscaler(AutoscalingPolicy(max_replicas=16)).wanted(4, quiet_queue) == 0
    assert Autoscaler(dataclasses.replace(policy, warm_floor=None)).wanted(4, quiet_queue) == 5
    assert Autoscaler(policy).wanted(4, quiet_queue) == 7
    # Within the HPA's 10% of what runs, a trigger keeps it.
    assert Autoscaler(policy).wanted(7, dataclasses.replace(quiet_queue, prefill_backlog_s=0.0)) == 7
    assert Autoscaler(policy).wanted(4, Signals(waiting=30, busy=3.2, lag_s=300.0)) == 8


def test_a_new_replica_takes_nothing_before_its_start_time() -> None:
    spec = rig.rig_spec(rig.ROUTING_ENGINE, 1)
    policy = AutoscalingPolicy(min_replicas=1, max_replicas=2, waiting_requests_per_replica=1, scrape_interval_s=1)
    slow = twin.FleetSpec(spec.engine, spec.cost, spec.num_kv_blocks, 1, start_s=30.0, autoscaling=policy)
    times = [i * 0.25 for i in range(400)]
    source = arrivals.generated(times, arrivals.Shape(2000, 4), seed=0)
    run = twin.run(slow, source, ServiceRouter(0))
    added = [s for s in run.served if s.replica == "replica-1"]
    assert added, "the autoscaler added no replica"
    first_scale = policy.sync_s
    assert min(s.request.at for s in added) >= first_scale + slow.start_s
    assert any(sample.starting for sample in run.samples)


def test_a_new_replica_of_a_planned_fleet_starts_as_a_neuron_replica_does_unless_told_otherwise() -> None:
    engine = EngineConfig.model_validate({**rig.ROUTING_ENGINE, "tensor_parallel_size": 32})
    trn2 = get_instance_type("trn2.48xlarge")
    spec, _ = planner.fleet_of(engine, trn2, "llama-3.1-70b", 1, "picker")
    start = twin.replica_start(spec.engine, spec.cost)
    assert spec.start_s == start.total_s
    # Minutes: the 70B's 141 GB from the Hub, loaded and sharded, then one step of each compiled graph.
    assert start.phases() == pytest.approx(
        {**predict_start(spec.cost.weight_bytes, "hf").phases(), "warmup": start.warmup_s}
    )
    assert 0 < start.warmup_s < 0.1 * start.total_s
    assert 240 < spec.start_s < 600
    assert planner.fleet_of(engine, trn2, "llama-3.1-70b", 1, "picker", start_s=0.0)[0].start_s == 0.0


def test_the_command_lines_look_ahead_triggers_come_with_autoscaling_and_read_as_the_crds() -> None:
    engine = EngineConfig.model_validate({**rig.ROUTING_ENGINE, "tensor_parallel_size": 32})
    trn2 = get_instance_type("trn2.48xlarge")
    spec, _ = planner.fleet_of(
        engine, trn2, "llama-3.1-70b", 1, "picker", autoscale="1:8", prefill_backlog_s=0.5, warm_floor="50:1.5"
    )
    assert spec.autoscaling is not None
    assert spec.autoscaling.prefill_backlog_seconds == 0.5
    assert spec.autoscaling.warm_floor == WarmFloor(step=0.5, ttft_s=1.5)
    with pytest.raises(ValueError, match="give --autoscale too"):
        planner.fleet_of(engine, trn2, "llama-3.1-70b", 1, "picker", warm_floor="100:2")
    for wrong in ("100", "x:2", "100:0"):
        with pytest.raises(ValueError, match="STEP_PERCENT:TTFT_SECONDS"):
            planner.fleet_of(engine, trn2, "llama-3.1-70b", 1, "picker", autoscale="1:8", warm_floor=wrong)


def test_engines_stepping_in_worker_processes_run_the_same_fleet_as_one_process() -> None:
    # A burst, then quiet: the autoscaler adds replicas, then drains and removes them, while the picker routes.
    spec = rig.rig_spec(rig.ROUTING_ENGINE, 1)
    policy = AutoscalingPolicy(
        min_replicas=1,
        max_replicas=4,
        waiting_requests_per_replica=1,
        scale_up_period_seconds=15,
        scale_down_stabilization_seconds=20,
        scrape_interval_s=1,
    )
    fleet = twin.FleetSpec(
        spec.engine, spec.cost, spec.num_kv_blocks, 2, start_s=5.0, autoscaling=policy, enable_prefix_caching=False
    )
    times = [i * 0.05 for i in range(100)] + [20.0 + i * 1.5 for i in range(40)]
    source = arrivals.generated(times, arrivals.Shape(512, 96), seed=0)
    one, two = (twin.run(fleet, source, rig.router("picker", spec.engine, seed=0), workers=n) for n in (1, 2))
    assert {s.replica for s in one.served} >= {"replica-2", "replica-3"}, "the autoscaler added no replica"
    assert any(sample.draining for sample in one.samples), "no replica drained on scale-in"
    assert [(s.request.req_id, s.replica, s.token_times) for s in two.served] == [
        (s.request.req_id, s.replica, s.token_times) for s in one.served
    ]
    assert (two.samples, two.steps, two.replica_seconds) == (one.samples, one.steps, one.replica_seconds)


def test_a_workers_error_stops_the_run_with_it() -> None:
    spec = rig.rig_spec(rig.ROUTING_ENGINE, 2)
    # A prompt larger than a replica's KV cache: its engine runs nothing while it waits.
    cramped = twin.FleetSpec(spec.engine, spec.cost, 8, 2)
    source = arrivals.generated([0.0], arrivals.Shape(4 * 8 * spec.engine.block_size, 4), seed=0)
    with pytest.raises(ReplicaStuck, match="runs nothing while requests wait"):
        twin.run(cramped, source, ServiceRouter(0), workers=2)


@pytest.fixture(scope="module")
def chat_replays() -> dict[str, rig.Replayed]:
    """The prefix bench's chat through each side in the twin (the rig's conversations, seed 0)."""
    return {side: rig.replay("prefix", "chat", side, seeds=(0,)) for side in rig.PREFIX_SIDES}


def rig_figure(side: str) -> rig.RigFigure:
    (figure,) = [f for f in rig.RIG_FIGURES if (f.bench, f.mix, f.side) == ("prefix", "chat", side)]
    return figure


@pytest.mark.parametrize("side", rig.PREFIX_SIDES)
def test_the_twin_agrees_with_the_rig_on_the_prefix_benchs_chat(
    chat_replays: dict[str, rig.Replayed], side: str
) -> None:
    """Pinned to the rig's run at e20277b (``RIG_FIGURES``): p50 within 15%, p99 within 30%."""
    figure = rig_figure(side)
    assert figure.p50_ms is not None
    assert 1000 * chat_replays[side].p50_s == pytest.approx(figure.p50_ms, rel=0.15)
    assert 1000 * chat_replays[side].p99_s == pytest.approx(figure.p99_ms, rel=0.30)


def test_the_twin_gives_the_rigs_routing_gains_on_the_chat(chat_replays: dict[str, rig.Replayed]) -> None:
    """Each picker's p99 against the Service's, and locality's against load alone: within 25% of the rig's."""
    for side, over in (("picker", "service"), ("picker-prefix", "service"), ("picker-prefix", "picker")):
        rig_ratio = rig_figure(over).p99_ms / rig_figure(side).p99_ms
        twin_ratio = chat_replays[over].p99_s / chat_replays[side].p99_s
        assert twin_ratio == pytest.approx(rig_ratio, rel=0.25), (side, over)


def test_the_planner_tries_the_smallest_tensor_parallelism_that_holds_the_model() -> None:
    from neuronfleet.contract.hardware import get_instance_type
    from neuronfleet.engine.fleet import planner

    # 70B in bf16 is 141 GB: no trn2 core holds it alone; the smallest TPs that leave room for the KV cache come first.
    sizes = planner.tensor_parallel_sizes("llama-3.1-70b", get_instance_type("trn2.48xlarge"), 8192)
    assert sizes == sorted(sizes)
    assert len(sizes) == planner.TP_CHOICES
    assert sizes[0] > 1
    # An inf2.48xlarge has 24 NeuronCores of 16 GB: a 70B needs 12 of them, and 16 does not split 24.
    assert planner.tensor_parallel_sizes("llama-3.1-70b", get_instance_type("inf2.48xlarge"), 8192) == [12, 24]


def test_a_planned_replica_meets_the_slo_at_its_capacity_and_its_manifest_is_admitted() -> None:
    from neuronfleet.contract.hardware import get_instance_type
    from neuronfleet.engine.fleet import planner

    slo = planner.SLO(ttft_p99_s=3.0, itl_p99_s=0.5)
    instance = get_instance_type("trn2.48xlarge")
    every = list(planner.candidates("llama-3.1-8b", [instance], "rag", 4096, (16,)))
    # The recommender's buckets for RAG's long prompts end at max_model_len, not at max_num_batched_tokens.
    assert {c.engine.effective_num_batched_tokens_buckets[-1] for c in every} == {4096}
    candidate = next(c for c in every if c.tensor_parallel_size == 4 and c.buckets == "default")
    rate, figures = planner.capacity(candidate, "llama-3.1-8b", "rag", slo, duration_s=20.0, steps=2, min_requests=20)
    assert rate > 0
    assert slo.met(figures)
    # Twice the capacity breaks the SLO: the search found an edge, not a floor.
    assert not slo.met(planner.measure(candidate, "llama-3.1-8b", "rag", 2 * rate, 20.0, 0, min_requests=20))
    chosen = planner.Plan(candidate, rate, replicas=3, instances=1, figures=figures)
    manifest = planner.manifest(chosen, "hf://org/model", "planned")
    spec = api.parse_service_spec(manifest["spec"])
    assert spec.replicas == 3
    assert spec.engine.tensor_parallel_size == candidate.tensor_parallel_size


def test_fleet_run_writes_every_request_and_refuses_an_unknown_workload(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from neuronfleet.engine.cli.main import app

    out = tmp_path / "run.json"
    args = ["fleet", "run", "--replicas", "2", "--rate", "2", "--duration", "10", "--workload", "rag"]
    ran = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert ran.exit_code == 0, ran.output
    document = json.loads(out.read_text())
    assert document["summary"]["answered"] == len(document["requests"]) > 0
    assert {request["replica"] for request in document["requests"]} == {"replica-0", "replica-1"}
    refused = CliRunner().invoke(app, [*args[:-1], "nope"])
    assert refused.exit_code == 2
    assert "unknown workload 'nope'" in refused.output
    no_autoscaling = CliRunner().invoke(app, [*args, "--warm-floor", "100:2"])
    assert no_autoscaling.exit_code != 0
    assert "give --autoscale too" in no_autoscaling.output


def test_scale_in_takes_a_starting_replica_then_the_one_holding_fewest_requests() -> None:
    spec = rig.rig_spec(rig.ROUTING_ENGINE, 3)
    fleet_spec = twin.FleetSpec(spec.engine, spec.cost, spec.num_kv_blocks, 3, start_s=60.0)

    def build(name: str, ready_at: float) -> ReplicaEngine:
        return ReplicaEngine(name, spec.engine, spec.cost, spec.num_kv_blocks, ready_at)

    # The engines never step: the fleet's scale decisions alone.
    fleet = twin._Fleet(fleet_spec, LocalEngines(build))
    for ready_at in (0.0, 1.0, 2.0):
        fleet.add(0.0, ready_at)
    old, middle, new = fleet.replicas
    for i, replica in enumerate([old, old, new, new, new]):
        replica.admit(arrivals.TwinRequest(f"r{i}", 5.0, (1,), 1))
    fleet.scale_to(4, now=20.0)
    starting = fleet.replicas[-1]
    # Down again, at Prometheus's scrape of second 15: the one still starting goes at once, then the idle middle
    # one, then the oldest, which drains.
    fleet.scale_to(3, now=21.0)
    assert starting not in fleet.replicas
    for i in range(2):
        old.admit(arrivals.TwinRequest(f"after-the-scrape-{i}", 22.0, (1,), 1))
    fleet.scale_to(1, now=23.0)
    assert middle not in fleet.replicas
    # The oldest held 2 at the scrape (4 now), the newest 3: the oldest goes, as the scrape ranked them.
    assert (old.draining_since, new.draining_since) == (23.0, None)
