"""Prometheus metrics of the Neuron scheduler and the simulated device, beside vLLM's own.

The scheduler runs in vLLM's engine-core process, and ``/metrics`` is served by
the API server process. The serve command therefore runs prometheus-client in
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, as vLLM itself does with several
API servers): the metrics here are written by the engine core to shared files,
and vLLM's ``/metrics`` collects every process's files. Scheduler metrics are
updated by a step observer (``NeuronScheduler.step_observers``) after every
``schedule()``; device metrics by the simulated device after every step, or, with an executor that reports
none (a real Neuron device), from the scheduler's own timing of each step (``step_clock.py``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram

from neuronfleet.contract import metrics
from neuronfleet.contract.buckets import get_bucket_for_count
from neuronfleet.contract.faults import RuntimeStatus
from neuronfleet.engine.scheduler import vllm_compat
from neuronfleet.engine.scheduler.neuron import NeuronScheduler, SchedulerState
from neuronfleet.engine.scheduler.step_clock import StepClock

PREFIX = "neuronfleet:"
#: At most this many histogram bounds for prefill chunk lengths.
MAX_CHUNK_BOUNDS = 64
#: The finest step between chunk-length bounds, in tokens.
MIN_CHUNK_STEP = 16


def chunk_bounds(max_chunk: int) -> list[float]:
    """Histogram bounds for prefill chunk lengths: equal steps of at least 16 tokens, ending at ``max_chunk``."""
    step = max(MIN_CHUNK_STEP, MIN_CHUNK_STEP * math.ceil(max_chunk / MAX_CHUNK_BOUNDS / MIN_CHUNK_STEP))
    bounds = list(range(step, max_chunk, step))
    return [float(bound) for bound in [*bounds, max_chunk]]


class NeuronMetrics:
    """The ``neuronfleet:`` metric families, in one registry."""

    def __init__(self, registry: CollectorRegistry, max_chunk: int) -> None:
        self.padding_tokens = PromCounter(
            metrics.PADDING_TOKENS, "Prefill padding tokens computed, all buckets.", registry=registry
        )
        self.padding_tokens_by_bucket = PromCounter(
            f"{PREFIX}padding_tokens_by_bucket",
            "Prefill padding tokens computed, by prefill token bucket.",
            ["bucket"],
            registry=registry,
        )
        self.prefill_steps = PromCounter(
            f"{PREFIX}prefill_steps", "Prefill steps run, by prefill token bucket.", ["bucket"], registry=registry
        )
        self.decode_steps = PromCounter(
            f"{PREFIX}decode_steps", "Decode steps run, by decode batch bucket.", ["bucket"], registry=registry
        )
        self.decode_padding_seqs = PromCounter(
            f"{PREFIX}decode_padding_seqs",
            "Padding rows in decode batches, by decode batch bucket.",
            ["bucket"],
            registry=registry,
        )
        self.kv_deferrals = PromCounter(
            f"{PREFIX}kv_admission_deferrals",
            "Times a prefill was held back because running requests could fill the KV cache.",
            registry=registry,
        )
        self.state = PromGauge(
            f"{PREFIX}scheduler_state",
            "1 for the scheduler's current state, 0 for the others.",
            ["state"],
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.prefill_tokens_pending = PromGauge(
            metrics.PREFILL_TOKENS_PENDING,
            "Prompt tokens still to prefill over the waiting and running requests.",
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.prefill_chunk_tokens = PromHistogram(
            metrics.PREFILL_CHUNK_TOKENS,
            "Real tokens of each prefill chunk scheduled (before padding).",
            buckets=chunk_bounds(max_chunk),
            registry=registry,
        )
        self.device_seconds = PromCounter(
            metrics.DEVICE_BUSY_SECONDS,
            "Device time spent in steps, by step kind (simulated: virtual or slept; else as the scheduler timed "
            "each step from dispatch to return).",
            ["kind"],
            registry=registry,
        )
        self.prefill_rate = PromGauge(
            metrics.PREFILL_TOKENS_PER_SECOND,
            "Prompt tokens a second through this replica's fastest prefill graph, as its warm-up timed it.",
            registry=registry,
            multiprocess_mode="mostrecent",
        )
        self.device_faults = PromCounter(
            f"{PREFIX}device_faults",
            "Steps the Neuron runtime failed, stopping the engine, by runtime status; device_fault=true: replace it.",
            ["status", "code", "device_fault"],
            registry=registry,
        )


@dataclass
class _Seen:
    """The scheduler counters as of the last step observed."""

    padding: Counter[int] = field(default_factory=Counter)
    prefill: Counter[int] = field(default_factory=Counter)
    decode: Counter[int] = field(default_factory=Counter)
    kv_deferrals: int = 0


class SchedulerObserver:
    """Turns a scheduler's running counters into metric increments after each step."""

    def __init__(self, metrics: NeuronMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        #: What the steps are timed with.
        self.clock = clock
        self._seen: dict[int, _Seen] = {}
        #: By scheduler: its steps' device times.
        self._timing: dict[int, StepClock] = {}
        #: Set once the executor reports its device steps itself (the simulated device): the scheduler's own
        #: timing is then not counted.
        self.executor_times_steps = False
        self._lock = threading.Lock()

    def __call__(self, scheduler: NeuronScheduler, scheduler_output: vllm_compat.SchedulerOutput) -> None:
        """Observe one step of ``scheduler`` (a ``NeuronScheduler.step_observers`` entry)."""
        with self._lock:
            seen = self._seen.setdefault(id(scheduler), _Seen())
            self._count(scheduler, seen)
            self._observe_output(scheduler, scheduler_output)

    def returned(self, scheduler: NeuronScheduler, scheduler_output: vllm_compat.SchedulerOutput) -> None:
        """A step of ``scheduler`` came back (a ``NeuronScheduler.output_observers`` entry): count its device time,
        unless the executor counts its own."""
        with self._lock:
            timed = self._timing_of(scheduler).returned(id(scheduler_output))
            if timed is not None and not self.executor_times_steps:
                self.metrics.device_seconds.labels(kind=timed.kind).inc(timed.seconds)

    def _timing_of(self, scheduler: NeuronScheduler) -> StepClock:
        return self._timing.setdefault(id(scheduler), StepClock(self.clock))

    def _count(self, scheduler: NeuronScheduler, seen: _Seen) -> None:
        metrics = self.metrics
        for bucket, total in scheduler.padding_tokens_by_bucket.items():
            if added := total - seen.padding[bucket]:
                metrics.padding_tokens.inc(added)
                metrics.padding_tokens_by_bucket.labels(bucket=str(bucket)).inc(added)
        for bucket, total in scheduler.prefill_steps_by_bucket.items():
            if added := total - seen.prefill[bucket]:
                metrics.prefill_steps.labels(bucket=str(bucket)).inc(added)
        for bucket, total in scheduler.decode_steps_by_bucket.items():
            if added := total - seen.decode[bucket]:
                metrics.decode_steps.labels(bucket=str(bucket)).inc(added)
        if added := scheduler.num_kv_deferred_admissions - seen.kv_deferrals:
            metrics.kv_deferrals.inc(added)
        seen.padding = Counter(scheduler.padding_tokens_by_bucket)
        seen.prefill = Counter(scheduler.prefill_steps_by_bucket)
        seen.decode = Counter(scheduler.decode_steps_by_bucket)
        seen.kv_deferrals = scheduler.num_kv_deferred_admissions
        metrics.prefill_tokens_pending.set(scheduler.pending_prefill_tokens)
        for state in SchedulerState:
            metrics.state.labels(state=state.value).set(1 if scheduler.state is state else 0)

    def _observe_output(self, scheduler: NeuronScheduler, scheduler_output: vllm_compat.SchedulerOutput) -> None:
        scheduled = scheduler_output.num_scheduled_tokens
        if not scheduled:
            return
        prefills = [
            scheduled[req_id] for req_id in vllm_compat.scheduled_prefill_ids(scheduler_output, scheduler.prompt_len)
        ]
        for num_tokens in prefills:
            self.metrics.prefill_chunk_tokens.observe(num_tokens)
        self._timing_of(scheduler).dispatched(id(scheduler_output), "prefill" if prefills else "decode")
        if not prefills:
            bucket = get_bucket_for_count(len(scheduled), scheduler.num_seqs_buckets)
            if padding := bucket - len(scheduled):
                self.metrics.decode_padding_seqs.labels(bucket=str(bucket)).inc(padding)


_default: SchedulerObserver | None = None
_default_lock = threading.Lock()


def default_metrics(max_chunk: int) -> NeuronMetrics:
    """This process's metrics in the default registry, made on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SchedulerObserver(NeuronMetrics(REGISTRY, max_chunk))
        return _default.metrics


def observe_default(scheduler: NeuronScheduler, scheduler_output: vllm_compat.SchedulerOutput) -> None:
    """Step observer feeding the default registry; sized by the first scheduler it sees."""
    global _default
    if _default is None:
        default_metrics(scheduler.num_batched_tokens_buckets[-1])
    assert _default is not None
    _default(scheduler, scheduler_output)


def returned_default(scheduler: NeuronScheduler, scheduler_output: vllm_compat.SchedulerOutput) -> None:
    """Output observer feeding the default registry."""
    if _default is not None:
        _default.returned(scheduler, scheduler_output)


def record_device_step(kind: str, seconds: float, max_chunk: int) -> None:
    """Count a simulated device step's time in the default registry (the scheduler's timing then stands down)."""
    default_metrics(max_chunk).device_seconds.labels(kind=kind).inc(seconds)
    assert _default is not None
    _default.executor_times_steps = True


def record_device_fault(status: RuntimeStatus, max_chunk: int) -> None:
    """Count a step the Neuron runtime failed, in the default registry."""
    default_metrics(max_chunk).device_faults.labels(
        status=status.name, code=str(status.code), device_fault=str(status.device_fault).lower()
    ).inc()


def subscribe() -> None:
    """Export every Neuron scheduler in this process to the default registry (idempotent)."""
    if observe_default not in NeuronScheduler.step_observers:
        NeuronScheduler.step_observers.append(observe_default)
        NeuronScheduler.output_observers.append(returned_default)


def record_prefill_rate(tokens_per_s: float, max_chunk: int) -> None:
    """Publish this replica's best prefill rate, as its warm-up timed it, in the default registry (the scheduler's
    timing then stands down)."""
    default_metrics(max_chunk).prefill_rate.set(tokens_per_s)
    assert _default is not None
    _default.executor_times_steps = True


def record_start(phases: dict[str, float], weights_from: str, *, presharded: bool) -> None:
    """Publish the seconds this replica spent starting, by phase, in the default registry, with the path its
    weights took: where from (``hf``, ``s3``, ``pvc``, ``local`` for the node's disk) and in which form."""
    gauge = PromGauge(
        metrics.REPLICA_START_SECONDS,
        "Seconds this replica spent starting, by phase (fetch, load, shard, graphs, warmup), with where its weights "
        "came from (hf, s3, pvc, local: the node's disk) and whether pre-sharded (shards) or sharded on load "
        "(checkpoint).",
        ["phase", "weights_from", "weights"],
        multiprocess_mode="mostrecent",
    )
    form = "shards" if presharded else "checkpoint"
    for phase, seconds in phases.items():
        gauge.labels(phase=phase, weights_from=weights_from, weights=form).set(seconds)
