"""One line per scheduler step, for people reading what the scheduler decided."""

from __future__ import annotations

from collections.abc import Sequence

from neuronfleet.contract.buckets import get_bucket_for_count
from neuronfleet.engine.offline.driver import StepRecord


def format_step(record: StepRecord, num_seqs_buckets: Sequence[int]) -> str:
    """``step state | what ran, actual -> padded | hidden decodes, queues``."""
    head = f"step {record.index:3d}  {record.state.name:<14}"
    tail = f"hidden decodes {record.num_hidden_decodes}  waiting {record.num_waiting}  running {record.num_running}"
    if not record.scheduled:
        work = "nothing scheduled"
    elif record.is_prefill and len(record.scheduled) > 1:
        # Packed prefills: one bucket for their sum.
        ids = ",".join(item.req_id for item in record.scheduled)
        tokens = "+".join(str(item.num_tokens) for item in record.scheduled)
        bucket = sum(item.num_tokens_padded for item in record.scheduled)
        work = f"prefill {ids}: {tokens} tokens -> bucket {bucket} (packed)"
    elif record.is_prefill:
        (item,) = record.scheduled
        end = item.computed_before + item.num_tokens
        work = (
            f"prefill {item.req_id}: {item.num_tokens} tokens -> bucket {item.num_tokens_padded}"
            f" (computed {item.computed_before} -> {end})"
        )
    else:
        batch = len(record.scheduled)
        ids = ",".join(item.req_id for item in record.scheduled)
        work = f"decode {ids}: {batch} seqs -> batch {get_bucket_for_count(batch, num_seqs_buckets)}"
    return f"{head}  {work:<66}  {tail}"
