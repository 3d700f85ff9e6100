"""The planner: the cheapest fleet of a model that serves a load within an SLO, found with the twin.

For each instance type, tensor parallelism (those whose weights leave room for the KV cache), ``max_num_seqs``,
prefill bucket set (the power-of-two defaults, or the recommender's for the workload's prompts) and prefill cap
(``auto`` or none), the planner finds one replica's capacity: the highest request rate at which a replica behind
the picker still meets the SLO (TTFT p99 and inter-token p99), by bisection on short twin runs of the
workload. The fleet for the asked rate is then ``ceil(rate / capacity)`` replicas, packed onto instances by
their NeuronCores; the table ranks configurations by instances. Capacities are per replica: the plan assumes a
picker that balances load well makes N replicas serve N times one's rate (``fleet run`` checks a plan's fleet).
Candidates are measured in parallel, one process each.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace
from typing import Any

from neuronfleet.contract.config import AUTO, EngineConfig
from neuronfleet.contract.hardware import InstanceType
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.fleet import arrivals, twin, workloads
from neuronfleet.engine.fleet.autoscaler import AutoscalingPolicy, WarmFloor
from neuronfleet.engine.fleet.picker import Router, router_named
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning import recommend

#: The twin's validated error (``docs/fleet.md``, "Validation"): p50s within 15% of the rig's, p99s within 30%.
P50_ERROR, P99_ERROR = 0.15, 0.30
#: How many tensor parallel sizes the search tries per instance type, from the smallest that fits.
TP_CHOICES = 3
#: The fewest requests a capacity measurement's percentiles are taken over.
MIN_REQUESTS = 200
#: A replica must hold at least this many full-length sequences' KV beside its weights to be a candidate.
MIN_FULL_SEQUENCES = 2


@dataclass(frozen=True)
class SLO:
    """What users hold the service to: TTFT and inter-token latency at the 99th percentile, in seconds."""

    ttft_p99_s: float
    itl_p99_s: float

    def met(self, figures: dict[str, Any]) -> bool:
        """Whether a run's figures meet it."""
        return bool(figures["ttft_p99_s"] <= self.ttft_p99_s and figures["itl_p99_s"] <= self.itl_p99_s)


@dataclass(frozen=True)
class Candidate:
    """One configuration to try: where it runs and what it compiles."""

    instance: InstanceType
    tensor_parallel_size: int
    engine: EngineConfig
    buckets: str

    def describe(self) -> str:
        """A line for the table."""
        cap = self.engine.scheduler.max_prefill_tokens_while_decoding
        return (
            f"{self.instance.name} TP {self.tensor_parallel_size}, max_num_seqs {self.engine.max_num_seqs}, "
            f"{self.buckets} buckets {self.engine.effective_num_batched_tokens_buckets}, cap {cap or 'none'}"
        )


@dataclass(frozen=True)
class Plan:
    """A candidate's capacity and the fleet it takes for the asked rate."""

    candidate: Candidate
    capacity_rps: float
    replicas: int
    instances: int
    figures: dict[str, Any]

    @property
    def cores(self) -> int:
        """NeuronCores the fleet takes."""
        return self.replicas * self.candidate.tensor_parallel_size


def fleet_of(
    engine: EngineConfig,
    instance: InstanceType,
    model: str,
    replicas: int,
    router: str,
    start_s: float | None = None,
    autoscale: str | None = None,
    seed: int = 0,
    *,
    prefill_backlog_s: float | None = None,
    warm_floor: str | None = None,
) -> tuple[twin.FleetSpec, Router]:
    """A fleet spec and its router from a command line's choices; ``autoscale`` is ``MIN:MAX``, and with it
    ``warm_floor`` ``STEP_PERCENT:TTFT_SECONDS``; ``start_s`` None: a Neuron replica's start, the weights from the
    Hub (:func:`twin.replica_start`)."""
    cost = CostModel(instance, get_shape(model), engine.tensor_parallel_size)
    policy = None
    if autoscale is not None:
        low, _, high = autoscale.partition(":")
        if not (low.isdigit() and high.isdigit() and 0 < int(low) <= int(high)):
            raise ValueError(f"--autoscale takes MIN:MAX replicas, 0 < MIN <= MAX, got {autoscale!r}")
        policy = AutoscalingPolicy(
            min_replicas=int(low),
            max_replicas=int(high),
            prefill_backlog_seconds=prefill_backlog_s,
            warm_floor=None if warm_floor is None else parse_warm_floor(warm_floor),
        )
    elif prefill_backlog_s is not None or warm_floor is not None:
        raise ValueError("--prefill-backlog-seconds and --warm-floor are autoscaling triggers: give --autoscale too")
    spec = twin.FleetSpec.of(engine, cost, replicas, autoscaling=policy)
    spec = replace(spec, start_s=twin.replica_start(spec.engine, cost).total_s if start_s is None else start_s)
    if spec.num_kv_blocks * engine.block_size < engine.max_model_len:
        raise ValueError(f"{model} at TP {engine.tensor_parallel_size} leaves no room for one full sequence's KV")
    return spec, router_named(router, engine, seed)


def parse_warm_floor(text: str) -> WarmFloor:
    """``STEP_PERCENT:TTFT_SECONDS`` (``100:2``: a doubling absorbed, 2 s waited) as the twin's warm floor."""
    step, _, ttft = text.partition(":")
    try:
        percent, seconds = float(step), float(ttft)
    except ValueError:
        percent = seconds = 0.0
    if percent <= 0 or seconds <= 0:
        raise ValueError(f"--warm-floor takes STEP_PERCENT:TTFT_SECONDS, both above 0 (100:2), got {text!r}")
    return WarmFloor(step=percent / 100, ttft_s=seconds)


def candidates(
    model: str, instances: Sequence[InstanceType], workload: str, max_model_len: int, seqs: Sequence[int]
) -> Iterator[Candidate]:
    """Every configuration worth a capacity search."""
    traffic = workloads.TRAFFIC[workload]
    lengths = recommend.prompt_histogram(recommend_sample(traffic.workload, max_model_len))
    for instance in instances:
        for tp in tensor_parallel_sizes(model, instance, max_model_len):
            for max_num_seqs in seqs:
                base = EngineConfig.model_validate(
                    {"max_num_seqs": max_num_seqs, "max_model_len": max_model_len, "tensor_parallel_size": tp}
                )
                # A step holds at most max_model_len tokens, whatever max_num_batched_tokens says.
                step_tokens = base.effective_max_num_batched_tokens
                chunks = recommend.chunk_histogram(lengths, step_tokens, max_model_len)
                chosen = recommend.recommend(chunks, 4, step_tokens).recommended.buckets
                for label, buckets in (("default", None), ("recommended", chosen)):
                    for cap in (AUTO, None):
                        scheduler = base.scheduler.model_copy(update={"max_prefill_tokens_while_decoding": cap})
                        update: dict[str, Any] = {"scheduler": scheduler}
                        if buckets is not None:
                            update["num_batched_tokens_buckets"] = list(buckets)
                        engine = EngineConfig.model_validate({**base.model_dump(), **update})
                        yield Candidate(instance, tp, engine, label)


def tensor_parallel_sizes(model: str, instance: InstanceType, max_model_len: int) -> list[int]:
    """The :data:`TP_CHOICES` smallest tensor parallel sizes of ``instance`` whose replicas hold ``model``'s weights
    and :data:`MIN_FULL_SEQUENCES` full-length sequences: larger ones buy latency with cores."""
    fitting = []
    # Sizes that split the instance's cores evenly (an inf2.48xlarge's 24 hold a 70B at 12 or 24); odd ones above
    # 1 would split the models' even head counts unevenly.
    for tp in range(1, instance.cores + 1):
        if instance.cores % tp or (tp > 1 and tp % 2):
            continue
        cost = CostModel(instance, get_shape(model), tp)
        if cost.kv_cache_bytes(0.9) >= MIN_FULL_SEQUENCES * max_model_len * cost.kv_bytes_per_token():
            fitting.append(tp)
    return fitting[:TP_CHOICES]


def recommend_sample(workload: str, max_model_len: int) -> list[int]:
    """Prompt lengths of a tuning workload, as the recommender reads them."""
    from neuronfleet.engine.tuning.workloads import WORKLOADS

    return WORKLOADS[workload].sample(5000, seed=0, max_model_len=max_model_len)


def measure(
    candidate: Candidate,
    model: str,
    workload: str,
    rate: float,
    duration_s: float,
    seed: int,
    min_requests: int = MIN_REQUESTS,
) -> dict[str, Any]:
    """One replica of ``candidate`` behind the picker at ``rate``: the run's figures (its first tenth a warm-up).
    The run lasts ``duration_s``, or longer at a low rate, so that a p99 is over ``min_requests`` requests."""
    duration_s = max(duration_s, min_requests / rate)
    spec, router = fleet_of(candidate.engine, candidate.instance, model, 1, "picker", seed=seed)
    times = arrivals.poisson_times(rate, duration_s, seed)
    source = workloads.TRAFFIC[workload].requests(times, cap=candidate.engine.max_model_len, seed=seed)
    return twin.run(spec, source, router).summary(since=duration_s / 10)


def capacity(
    candidate: Candidate,
    model: str,
    workload: str,
    slo: SLO,
    *,
    duration_s: float = 60.0,
    seed: int = 0,
    steps: int = 5,
    min_requests: int = MIN_REQUESTS,
) -> tuple[float, dict[str, Any]]:
    """The highest rate (requests per second) one replica serves within ``slo``, by bisection; 0 if none."""
    low, high = 0.0, 1.0
    figures = measure(candidate, model, workload, high, duration_s, seed, min_requests)
    best: dict[str, Any] = figures if slo.met(figures) else {}
    # Double until the SLO breaks, then halve the gap.
    while slo.met(figures) and high < 1024:
        low, best = high, figures
        high *= 2
        figures = measure(candidate, model, workload, high, duration_s, seed, min_requests)
    for _ in range(steps):
        middle = (low + high) / 2
        figures = measure(candidate, model, workload, middle, duration_s, seed, min_requests)
        if slo.met(figures):
            low, best = middle, figures
        else:
            high = middle
    return low, best


def plan(
    model: str,
    instances: Sequence[InstanceType],
    workload: str,
    rate: float,
    slo: SLO,
    *,
    max_model_len: int = 8192,
    seqs: Sequence[int] = (16, 64),
    progress: Callable[[str], None] = lambda _: None,
    workers: int = 1,
) -> list[Plan]:
    """Every candidate's capacity and fleet for ``rate``, cheapest first: the fewest instances, then NeuronCores,
    then the lowest TTFT p99. Candidates are measured ``workers`` at a time, each in a process of its own."""
    found = list(candidates(model, instances, workload, max_model_len, seqs))
    measured = functools.partial(capacity, model=model, workload=workload, slo=slo)
    plans = []
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(measured, candidate): candidate for candidate in found}
        for done, future in enumerate(as_completed(futures), 1):
            candidate = futures[future]
            per_replica, figures = future.result()
            progress(f"{done}/{len(found)} measured: {candidate.describe()}")
            if per_replica <= 0:
                continue
            replicas = math.ceil(rate / per_replica)
            per_instance = candidate.instance.cores // candidate.tensor_parallel_size
            plans.append(Plan(candidate, per_replica, replicas, math.ceil(replicas / per_instance), figures))
    return sorted(plans, key=lambda p: (p.instances, p.cores, p.figures["ttft_p99_s"], p.candidate.describe()))


def manifest(chosen: Plan, model_uri: str, name: str) -> dict[str, Any]:
    """The winner as a ``NeuronInferenceService``."""
    engine = chosen.candidate.engine
    fields = {
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "max_model_len": engine.max_model_len,
        "num_batched_tokens_buckets": list(engine.effective_num_batched_tokens_buckets),
        "tensor_parallel_size": engine.tensor_parallel_size,
        "scheduler": {"max_prefill_tokens_while_decoding": engine.scheduler.max_prefill_tokens_while_decoding},
    }
    return {
        "apiVersion": "neuronfleet.io/v1alpha1",
        "kind": "NeuronInferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": model_uri},
            "instanceType": chosen.candidate.instance.name,
            "replicas": chosen.replicas,
            "routing": {"replicas": 1},
            "engine": fields,
        },
    }
