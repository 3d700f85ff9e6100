"""Everything neuronfleet knows about vLLM's internals, for vLLM 0.33.

The scheduler works by rearranging the base scheduler's queues and limits around
its ``schedule()`` call; the server drains before vLLM's own shutdown begins. The
names involved change between vLLM releases; they are all here, so an upgrade is
reviewed in one file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

__all__ = [
    "AsyncScheduler",
    "Request",
    "Scheduler",
    "SchedulerOutput",
    "SchedulingPolicy",
    "cap_admissions",
    "drain_before_shutdown",
    "hidden_limit_attributes",
    "max_full_length_requests",
    "padded_counts",
    "peek_waiting",
    "pre_increment_computed_tokens",
    "requeue_waiting",
    "scheduled_prefill_ids",
    "set_padded_counts",
    "take_all_waiting",
    "usable_kv_blocks",
    "waiting_count",
]

#: Limits the base scheduler checks against ``len(running)``: lowered by the number
#: of hidden decodes while they are hidden. 0.33 split admission
#: (``max_num_active_reqs``) from the runner slot count (``max_num_running_reqs``).
hidden_limit_attributes = ("max_num_running_reqs", "max_num_active_reqs")


def take_all_waiting(scheduler: Scheduler) -> list[Request]:
    """Empty every waiting queue the base scheduler admits from, in its order.

    0.33 drains ``kv_holding_waiting`` (requests that already hold KV blocks)
    before ``waiting``; both must be held back, or a request could be admitted
    without passing the Neuron admission checks.
    """
    taken: list[Request] = []
    for queue in (scheduler.kv_holding_waiting, scheduler.waiting):
        while queue:
            taken.append(queue.pop_request())
    return taken


def requeue_waiting(scheduler: Scheduler, request: Request) -> None:
    """Put a held-back request at the tail of the queue the base scheduler keeps it in."""
    if scheduler._holds_kv_blocks(request):
        scheduler.kv_holding_waiting.add_request(request)
    else:
        scheduler.waiting.add_request(request)


def peek_waiting(scheduler: Scheduler) -> Request | None:
    """The request the base scheduler would try to admit first, if any."""
    for queue in (scheduler.kv_holding_waiting, scheduler.waiting):
        if queue:
            request: Request = queue.peek_request()
            return request
    return None


def cap_admissions(scheduler: Scheduler, num_admissions: int) -> None:
    """Let the base scheduler admit at most ``num_admissions`` waiting requests this step.

    Its admission loop stops once the running requests (and paused streaming
    sessions, which hold slots) reach ``max_num_active_reqs``, before looking at
    the next waiting request: a cap costs nothing per waiting request.
    """
    in_use = len(scheduler.running) + scheduler.num_waiting_for_streaming_input
    scheduler.max_num_active_reqs = min(scheduler.max_num_active_reqs, in_use + num_admissions)


def waiting_count(scheduler: Scheduler) -> int:
    """Requests the base scheduler would consider admitting this step."""
    return len(scheduler.waiting) + len(scheduler.kv_holding_waiting)


def pre_increment_computed_tokens(output: SchedulerOutput) -> dict[str, int]:
    """``num_computed_tokens`` of each scheduled request as it was before this step.

    The base scheduler has already advanced the request objects when
    ``schedule()`` returns; the output still carries the values the step started from.
    """
    computed: dict[str, int] = {new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs}
    cached = output.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
    return computed


def scheduled_prefill_ids(output: SchedulerOutput, prompt_len: Callable[[str], int]) -> list[str]:
    """The scheduled requests that had prompt tokens left to compute when the step began, in schedule order.

    A chunk that reaches the end of the prompt is still a prefill; a request resumed after preemption
    (its computed tokens reset to 0) is one again. ``prompt_len`` gives a scheduled request's prompt
    length; every scheduled request must have one.
    """
    computed = pre_increment_computed_tokens(output)
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


def drain_before_shutdown(engine_client: Any, drain: Callable[[float], float]) -> None:
    """Make the API server's shutdown call ``drain(timeout)`` first, and leave vLLM the time it returns.

    On SIGTERM ``serve_http`` calls ``engine_client.shutdown(timeout=shutdown_timeout)`` on a worker
    thread, and ``AsyncLLM.shutdown`` closes the renderer's thread pool before it tells the engine core
    to drain: a request arriving in between fails with 500. The process manager's timeout is vLLM's
    drain deadline, so vLLM gets what ``drain`` left of it.
    """
    shutdown = engine_client.shutdown

    def drain_then_shutdown(timeout: float | None = None) -> None:
        left = drain(timeout or 0.0)
        shutdown(timeout=None if timeout is None else left)

    engine_client.shutdown = drain_then_shutdown
