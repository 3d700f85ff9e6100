"""``vllm_compat.scheduled_prefill_ids``: which scheduled requests of a step are prefills, on vLLM's own output type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

from neuronfleet.engine.scheduler import vllm_compat

pytestmark = pytest.mark.vllm_matrix

PROMPT_LEN = 100


@dataclass(frozen=True)
class Scheduled:
    """One scheduled request: new this step or cached, its computed tokens before the step, tokens scheduled."""

    req_id: str
    computed: int
    tokens: int
    new: bool = False
    resumed: bool = False


def scheduler_output(*requests: Scheduled) -> SchedulerOutput:
    """vLLM's ``SchedulerOutput`` for ``requests``, in that schedule order."""
    output = SchedulerOutput.make_empty()
    cached = [request for request in requests if not request.new]
    # vLLM 0.34 sends a resumed request as a new one (prefill_token_ids required); 0.29 lists it in the cached part.
    new_fields: dict[str, Any] = {"prefill_token_ids": [7] * PROMPT_LEN} if vllm_compat.RESUMED_AS_NEW else {}
    output.scheduled_new_reqs = [
        NewRequestData(
            req_id=request.req_id,
            prompt_token_ids=[7] * PROMPT_LEN,
            mm_features=[],
            sampling_params=None,
            pooling_params=None,
            block_ids=([],),
            num_computed_tokens=request.computed,
            lora_request=None,
            **new_fields,
        )
        for request in requests
        if request.new or (request.resumed and vllm_compat.RESUMED_AS_NEW)
    ]
    cached = [request for request in cached if request.req_id not in {r.req_id for r in output.scheduled_new_reqs}]
    resumed: dict[str, Any] = (
        {}
        if vllm_compat.RESUMED_AS_NEW
        else {
            "resumed_req_ids": {request.req_id for request in cached if request.resumed},
            "all_token_ids": {},
        }
    )
    output.scheduled_cached_reqs = CachedRequestData(
        req_ids=[request.req_id for request in cached],
        new_token_ids=[[] for _ in cached],
        new_block_ids=[None for _ in cached],
        num_computed_tokens=[request.computed for request in cached],
        num_output_tokens=[max(0, request.computed - PROMPT_LEN) for request in cached],
        **resumed,
    )
    output.num_scheduled_tokens = {request.req_id: request.tokens for request in requests}
    output.total_num_scheduled_tokens = sum(output.num_scheduled_tokens.values())
    return output


def prefills(*requests: Scheduled) -> list[str]:
    return vllm_compat.scheduled_prefill_ids(scheduler_output(*requests), lambda req_id: PROMPT_LEN)


def test_an_empty_step_has_no_prefills() -> None:
    assert prefills() == []


@pytest.mark.parametrize(
    ("request_", "is_prefill"),
    [
        (Scheduled("first-chunk", computed=0, tokens=64, new=True), True),
        (Scheduled("prefix-cache-hit", computed=96, tokens=4, new=True), True),
        (Scheduled("middle-chunk", computed=32, tokens=32), True),
        # The chunk that completes the prompt (and samples the first token) is still a prefill.
        (Scheduled("last-chunk", computed=64, tokens=36), True),
        (Scheduled("decode", computed=PROMPT_LEN, tokens=1), False),
        (Scheduled("later-decode", computed=PROMPT_LEN + 20, tokens=1), False),
        # Preempted, its computed tokens were reset: it prefills again.
        (Scheduled("resumed", computed=0, tokens=64, resumed=True), True),
    ],
    ids=lambda value: value.req_id if isinstance(value, Scheduled) else None,
)
def test_a_request_is_a_prefill_while_its_prompt_was_unfinished_when_the_step_began(
    request_: Scheduled, is_prefill: bool
) -> None:
    assert prefills(request_) == ([request_.req_id] if is_prefill else [])


def test_prefills_come_in_schedule_order_among_decodes() -> None:
    step = (
        Scheduled("decode-a", computed=PROMPT_LEN, tokens=1),
        Scheduled("chunk-b", computed=32, tokens=16),
        Scheduled("new-c", computed=0, tokens=16, new=True),
        Scheduled("decode-d", computed=PROMPT_LEN + 3, tokens=1),
    )
    # New requests come first in vLLM's output lists; the order is that of num_scheduled_tokens.
    assert prefills(*step) == ["chunk-b", "new-c"]


def test_the_prompt_length_comes_from_the_caller() -> None:
    output = scheduler_output(Scheduled("a", computed=50, tokens=1), Scheduled("b", computed=50, tokens=1))
    assert vllm_compat.scheduled_prefill_ids(output, {"a": 51, "b": 50}.__getitem__) == ["a"]


def test_a_scheduled_request_without_a_prompt_length_is_an_error() -> None:
    output = scheduler_output(Scheduled("known", computed=0, tokens=8, new=True), Scheduled("unknown", 0, 8))
    with pytest.raises(KeyError, match="unknown"):
        vllm_compat.scheduled_prefill_ids(output, {"known": PROMPT_LEN}.__getitem__)
