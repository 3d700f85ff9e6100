"""Everything neuronfleet knows about vLLM's internals, for vLLM 0.29 and 0.34.

The scheduler works by rearranging the base scheduler's queues and limits around
its ``schedule()`` call; the server drains before vLLM's own shutdown begins. The
names involved change between vLLM releases; they are all here, so an upgrade is
reviewed in one file, and every branch on the version is here, each saying which
upstream change made it necessary. ``vllm_range`` says which releases are supported;
importing this module on any other raises an ``ImportError`` whose one-line message names them.

What differs between 0.29 and 0.34, as far as neuronfleet reaches:

- The waiting queues (``KV_HOLDING_QUEUE``): 0.29 has ``skipped_waiting`` before
  ``waiting``, 0.34 ``kv_holding_waiting`` before ``waiting``. The functions on waiting
  requests below branch on it.
- The admission limit (``ACTIVE_REQS_LIMIT``): 0.29 admits against
  ``max_num_running_reqs``, 0.34 against ``max_num_active_reqs``
  (``hidden_limit_attributes``, ``cap_admissions``).
- What a model runner hands back and is handed (``RESUMED_AS_NEW``): 0.34's ``ModelRunnerOutput``
  has no ``req_id_to_index`` (``runner_output``), and a request resumed after preemption comes back as
  a new request, so ``CachedRequestData`` has no ``resumed_req_ids`` (``resumed_req_ids``).
- The KV cache's share of device memory: 0.34 leaves ``gpu_memory_utilization`` unset and resolves
  it (``gpu_memory_utilization``).
- Two scheduler features 0.34 adds that reorder or bypass admission from inside the base scheduler,
  KV loads started from a queue of their own (``max_num_inflight_kv_loads``) and cache-aware
  reordering of the waiting queue (``cache_aware_admission_window``): refused
  (``unsupported_admission``).
- A LoRA adapter's configuration as vLLM reads it: 0.34's ``PEFTHelper`` adds per-module ranks
  (``rank_pattern``), which 0.29's lacks (``adapter_rank``).
- Two calls the engine core makes on the simulated worker (``sim/executor.py``): 0.29
  calls ``set_kv_cache_layout(layout)`` without 0.34's context-parallel interleave size,
  and asks ``supports_draft_weight_updates()`` at start-up. The worker answers both forms,
  so nothing branches.

The same in both (read from the two wheels, and run by the scheduler suites on each):
``schedule(throttle_prefills)``, ``_update_after_schedule`` (neither class overrides it), the step's
token budget ``max_num_scheduled_tokens`` (read at the start of ``schedule()``, asserted at its end),
the ``SchedulerOutput`` fields read here, ``Request(...)``, ``RequestQueue``,
``get_max_concurrency_for_kv_cache_config``, the ``AsyncLLM.shutdown(timeout)`` that
``drain_before_shutdown`` wraps and the ``output_handler`` task it stops first, vLLM calling that
shutdown twice (on a worker thread on SIGTERM, then on the event loop), the plugin entry points and
the executor interface; and what the simulated device's start-up relies on (``sim/platform.py``, ``serving/serve.py``):
``Platform.pre_register_and_update`` (called before the model configuration),
``ModelRegistry.register_model`` with a class and ``ModelRegistry.models[arch].load_model_cls()``,
and ``vllm serve`` keeping a ``VLLM_WORKER_MULTIPROC_METHOD`` that is already set.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import itertools
import threading
from collections.abc import Callable, Mapping
from typing import Any

import vllm

from neuronfleet.engine.scheduler.vllm_range import supported_series

# Before the internals below: on another release they may be missing or mean something else.
VLLM_SERIES = supported_series(vllm.__version__)

from vllm.config import CacheConfig, SchedulerConfig
from vllm.lora.peft_helper import PEFTHelper
from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue, SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request

#: Since vLLM 0.33, waiting requests that hold KV blocks have their own queue, ``kv_holding_waiting``,
#: drained before ``waiting`` (upstream PR #57841, "Avoid Deadlocks in Skipped Waiting under KV
#: Pressure", which replaced 0.29's ``skipped_waiting`` queue by it and the ``deferred_waiting`` set).
KV_HOLDING_QUEUE = VLLM_SERIES == "0.34"
#: Since vLLM 0.33, admission into ``running`` is capped by ``max_num_active_reqs``, apart from the
#: runner's slot count ``max_num_running_reqs`` (upstream PR #56758, "Add --max-num-active-seqs to cap
#: RUNNING admission"); 0.29 admits against ``max_num_running_reqs``.
ACTIVE_REQS_LIMIT = VLLM_SERIES == "0.34"
#: vLLM 0.34 sends a request resumed after preemption as a new request (``prefill_token_ids`` holds its
#: prompt and outputs), so ``CachedRequestData`` lost ``resumed_req_ids`` and ``all_token_ids``, and
#: ``ModelRunnerOutput`` its ``req_id_to_index``: the runner's output follows ``req_ids``' order.
RESUMED_AS_NEW = VLLM_SERIES == "0.34"

__all__ = [
    "ACTIVE_REQS_LIMIT",
    "KV_HOLDING_QUEUE",
    "RESUMED_AS_NEW",
    "STEP_TOKEN_BUDGET",
    "VLLM_SERIES",
    "AsyncScheduler",
    "Request",
    "Scheduler",
    "SchedulerOutput",
    "SchedulingPolicy",
    "cap_admissions",
    "drain_before_shutdown",
    "gpu_memory_utilization",
    "hidden_limit_attributes",
    "max_full_length_requests",
    "padded_counts",
    "pre_increment_computed_tokens",
    "requeue_waiting",
    "resumed_req_ids",
    "runner_output",
    "scheduled_prefill_ids",
    "set_padded_counts",
    "take_all_waiting",
    "unsupported_admission",
    "usable_kv_blocks",
    "waiting_count",
    "waiting_head",
    "waiting_requests",
]

#: Limits the base scheduler checks against ``len(running)``: lowered by the number
#: of hidden decodes while they are hidden (see ``ACTIVE_REQS_LIMIT``).
hidden_limit_attributes: tuple[str, ...] = (
    ("max_num_running_reqs", "max_num_active_reqs") if ACTIVE_REQS_LIMIT else ("max_num_running_reqs",)
)
#: The base scheduler's token budget per step (the same name in 0.29 and 0.34): lowered for a
#: step, it chunks a prefill to the lower budget and asserts the step stays within it.
STEP_TOKEN_BUDGET = "max_num_scheduled_tokens"
#: The limit the base scheduler's admission loop stops at.
_ADMISSION_LIMIT = "max_num_active_reqs" if ACTIVE_REQS_LIMIT else "max_num_running_reqs"


def _on_0_29(value: object) -> Any:
    """``value`` typed for names only 0.29 has: mypy checks against 0.34's annotations."""
    return value


def _waiting_queues(scheduler: Scheduler) -> tuple[RequestQueue, RequestQueue]:
    """The base scheduler's waiting queues, in the order it admits from them under fcfs.

    0.34 drains ``kv_holding_waiting`` (requests that already hold KV blocks) before
    ``waiting``; 0.29 drains ``skipped_waiting`` (requests it passed over, or enqueued
    in a blocked status) before ``waiting`` (``_select_waiting_queue_for_scheduling``).
    """
    if KV_HOLDING_QUEUE:
        return scheduler.kv_holding_waiting, scheduler.waiting
    return _on_0_29(scheduler).skipped_waiting, scheduler.waiting


def take_all_waiting(scheduler: Scheduler) -> list[Request]:
    """Empty every waiting queue the base scheduler admits from, in its order.

    Every one must be held back, or a request could be admitted without passing
    the Neuron admission checks.
    """
    taken: list[Request] = []
    for queue in _waiting_queues(scheduler):
        while queue:
            taken.append(queue.pop_request())
    return taken


def requeue_waiting(scheduler: Scheduler, request: Request) -> None:
    """Put a held-back request at the tail of the queue the base scheduler keeps it in."""
    if KV_HOLDING_QUEUE:
        # 0.34's own _enqueue_waiting_request would also mark a blocked request deferred
        # again; the request is requeued, not newly deferred.
        queue = scheduler.kv_holding_waiting if scheduler._holds_kv_blocks(request) else scheduler.waiting
        queue.add_request(request)
    else:
        # 0.29: blocked statuses (grammar, remote KV, streaming) go to skipped_waiting.
        _on_0_29(scheduler)._enqueue_waiting_request(request)


def waiting_head(scheduler: Scheduler, count: int) -> list[Request]:
    """The first ``count`` requests the base scheduler would try to admit, in its order (queues unchanged)."""
    return list(itertools.islice(itertools.chain(*_waiting_queues(scheduler)), count))


def cap_admissions(scheduler: Scheduler, num_admissions: int) -> None:
    """Let the base scheduler admit at most ``num_admissions`` waiting requests this step.

    Its admission loop stops once the running requests (and paused streaming
    sessions, which hold slots) reach the admission limit, before looking at the
    next waiting request: a cap costs nothing per waiting request. On 0.29 that
    limit is ``max_num_running_reqs``, which the base scheduler also asserts after
    the step; the cap keeps it true, since running grows by at most the admissions.
    """
    in_use = len(scheduler.running) + scheduler.num_waiting_for_streaming_input
    setattr(scheduler, _ADMISSION_LIMIT, min(getattr(scheduler, _ADMISSION_LIMIT), in_use + num_admissions))


def waiting_requests(scheduler: Scheduler) -> list[Request]:
    """Every waiting request, in admission order (for checks and tests; the queues are unchanged)."""
    return [request for queue in _waiting_queues(scheduler) for request in queue]


def waiting_count(scheduler: Scheduler) -> int:
    """Requests the base scheduler would consider admitting this step."""
    return sum(len(queue) for queue in _waiting_queues(scheduler))


def pre_increment_computed_tokens(output: SchedulerOutput) -> dict[str, int]:
    """``num_computed_tokens`` of each scheduled request as it was before this step.

    The base scheduler has already advanced the request objects when
    ``schedule()`` returns; the output still carries the values the step started from.
    """
    computed: dict[str, int] = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return computed


def scheduled_prefill_ids(
    output: SchedulerOutput, prompt_len: Callable[[str], int], computed: Mapping[str, int] | None = None
) -> list[str]:
    """The scheduled requests that had prompt tokens left to compute when the step began, in schedule order.

    A chunk that reaches the end of the prompt is still a prefill; a request resumed after preemption
    (its computed tokens reset to 0) is one again. ``prompt_len`` gives a scheduled request's prompt
    length; every scheduled request must have one. ``computed``: :func:`pre_increment_computed_tokens` of
    ``output``, when the caller has it already.
    """
    computed = pre_increment_computed_tokens(output) if computed is None else computed
    return [req_id for req_id in output.num_scheduled_tokens if computed[req_id] < prompt_len(req_id)]


def usable_kv_blocks(scheduler: Scheduler) -> int | None:
    """KV blocks requests can hold: all but the null block 0 the block pool reserves.

    ``None`` for models with several KV cache groups (hybrid attention): they draw
    blocks per group from one pool, which a per-request token bound does not capture.
    """
    if len(scheduler.kv_cache_config.kv_cache_groups) > 1:
        return None
    return int(scheduler.kv_cache_config.num_blocks) - 1


def max_full_length_requests(scheduler: Scheduler) -> int:
    """How many requests fit the KV cache together if each grows to ``max_model_len``.

    vLLM's ``get_max_concurrency_for_kv_cache_config`` counts every block, but the
    block pool reserves block 0 as the null block: counted as usable, a cache sized
    to an exact multiple admits one request too many, which then preempts.
    """
    kv_cache_config = scheduler.kv_cache_config
    usable = dataclasses.replace(kv_cache_config, num_blocks=kv_cache_config.num_blocks - 1)
    if kv_cache_config.kv_cache_groups:
        return int(get_max_concurrency_for_kv_cache_config(scheduler.vllm_config, usable))
    return int(usable.num_blocks * scheduler.block_size // scheduler.max_model_len)


def set_padded_counts(output: SchedulerOutput, padded: dict[str, int]) -> None:
    """Attach ``num_scheduled_tokens_padded`` to a vLLM ``SchedulerOutput``.

    vLLM's dataclass has no such field; the Neuron model runner reads it as an
    attribute, as the reference scheduler sets it.
    """
    output.num_scheduled_tokens_padded = padded  # type: ignore[attr-defined]  # see docstring


def padded_counts(output: Any) -> dict[str, int]:
    """The padded token counts a Neuron scheduler attached to ``output``."""
    padded: dict[str, int] = output.num_scheduled_tokens_padded
    return padded


def drain_before_shutdown(engine_client: Any, drain: Callable[[float], float], idle: Callable[[], bool]) -> None:
    """Make the API server's shutdown call ``drain(timeout)`` first, and leave vLLM the time it returns.

    On SIGTERM ``serve_http`` calls ``engine_client.shutdown(timeout=shutdown_timeout)`` on a worker
    thread, and ``AsyncLLM.shutdown`` closes the renderer's thread pool before it tells the engine core
    to drain: a request arriving in between fails with 500. The process manager's timeout is vLLM's
    drain deadline, so vLLM gets what ``drain`` left of it.

    When the drain leaves nothing in flight (``idle()``), the output handler is stopped before vLLM's
    shutdown: ``AsyncLLM.shutdown`` cancels it only after the engine core client's cleanup, which turns
    the cancelled output socket task into an ``EngineDeadError`` that the handler, still reading, logs
    at ERROR with a traceback ("AsyncLLM output_handler failed.") on a clean stop.

    The drain runs once, off the event loop: vLLM calls ``shutdown`` again on the event loop when its
    engine client's context exits (after the server stopped), where a drain would block the loop.
    """
    shutdown = engine_client.shutdown
    drained = threading.Event()

    def drain_then_shutdown(timeout: float | None = None) -> None:
        if drained.is_set() or _on_event_loop():
            shutdown(timeout=timeout)
            return
        drained.set()
        left = drain(timeout or 0.0)
        if idle():
            _stop_output_handler(engine_client)
        shutdown(timeout=None if timeout is None else left)

    engine_client.shutdown = drain_then_shutdown


#: Seconds to wait for the output handler to stop; past it, vLLM's shutdown runs anyway.
_HANDLER_STOP_TIMEOUT_S = 5.0


def _on_event_loop() -> bool:
    """Whether this thread is running an asyncio event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _stop_output_handler(engine_client: Any) -> None:
    """Cancel ``AsyncLLM``'s output handler task (started on its first request) and wait for it to end."""
    handler: asyncio.Task[None] | None = getattr(engine_client, "output_handler", None)
    if handler is None or handler.done():
        return

    async def cancel() -> None:
        handler.cancel()
        await asyncio.wait([handler])

    stopped = asyncio.run_coroutine_threadsafe(cancel(), handler.get_loop())
    with contextlib.suppress(concurrent.futures.TimeoutError):
        stopped.result(_HANDLER_STOP_TIMEOUT_S)


def runner_output(req_ids: list[str], sampled_token_ids: list[list[int]]) -> ModelRunnerOutput:
    """A model runner's output for ``req_ids``, one list of sampled tokens each (``RESUMED_AS_NEW``)."""
    if RESUMED_AS_NEW:
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled_token_ids)
    index = {req_id: position for position, req_id in enumerate(req_ids)}
    output: ModelRunnerOutput = _on_0_29(ModelRunnerOutput)(
        req_ids=req_ids, req_id_to_index=index, sampled_token_ids=sampled_token_ids
    )
    return output


def resumed_req_ids(cached: CachedRequestData) -> set[str]:
    """Requests of a step's cached part resumed after preemption: none on 0.34, which sends them as new."""
    return set() if RESUMED_AS_NEW else set(_on_0_29(cached).resumed_req_ids)


def gpu_memory_utilization(cache_config: CacheConfig) -> float:
    """The share of device memory the KV cache may fill: 0.34 resolves an unset one to its default."""
    if RESUMED_AS_NEW:
        return float(cache_config.resolved_gpu_memory_utilization)
    return float(_on_0_29(cache_config).gpu_memory_utilization)


def unsupported_admission(scheduler_config: SchedulerConfig) -> list[str]:
    """The base scheduler's admission features the Neuron scheduler cannot keep FIFO and within its checks."""
    found = []
    if getattr(scheduler_config, "max_num_inflight_kv_loads", None):
        found.append("max_num_inflight_kv_loads (KV loads started past the admission checks)")
    if getattr(scheduler_config, "cache_aware_admission_window", 0):
        found.append("cache_aware_admission_window (the waiting queue reordered inside the base scheduler)")
    return found


def adapter_rank(helper: PEFTHelper) -> int:
    """A LoRA adapter's largest rank: its ``r``, or a larger per-module one (0.34's ``rank_pattern``)."""
    ranks: dict[str, int] = getattr(helper, "rank_pattern", None) or {}
    return max([int(helper.r), *ranks.values()])
