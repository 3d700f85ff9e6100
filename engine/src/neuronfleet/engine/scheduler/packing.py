"""Packed prefills: several waiting prompts in one prefill step, padded once.

The design runs one prefill per step (``max_prefills_per_batch = 1``): on chat
traffic each short prompt pays a whole step and its own padding while the next
waits. With ``max_prefills_per_step`` above 1 the scheduler admits, in FIFO order,
further waiting prompts into the same step, and the step is padded once, to the
bucket that holds the sum of its tokens. The rules a pack keeps:

- the head of the line is admitted as in the design (chunked if it is longer than
  the largest bucket); every further member is a whole prompt that fits the
  largest bucket beside what is already packed, so a step never exceeds it and
  only a lone head is ever chunked;
- a pack never runs in a larger bucket than its largest member would alone
  (``fits``): packing fills padding and merges steps; a packed step costs about what
  the design's step for that member costs (only the others' attention is added), so
  the decode stall it causes is one the design causes anyway;
- capacity and KV admission count the members already admitted this step
  (``NeuronScheduler.can_schedule``), so every member has KV for its whole bound.

The padding goes to the last member: each member's ``num_scheduled_tokens_padded``
is its actual count, the last one's also carries the pack's padding
(``pack_padding``), so the padded counts of a step add up to its bucket, as they do
for one prefill.

While requests decode, ``max_prefill_tokens_while_decoding`` narrows the buckets a
step may use (``buckets_while_decoding``): the pack, and the chunk of a long prompt,
stay within the largest of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from neuronfleet.contract.buckets import get_bucket_for_count


@dataclass
class Pack:
    """The prefills admitted into the step being scheduled."""

    #: Requests admitted.
    num_requests: int = 0
    #: Prompt tokens they have left (an upper bound: prefix-cache hits are found later).
    tokens: int = 0
    #: The largest bucket a member would run in alone.
    largest_member_bucket: int = 0
    #: KV blocks the members may grow to (``kv_admission: request_bound``).
    kv_blocks: int = 0

    def add(self, tokens: int, kv_blocks: int, buckets: Sequence[int]) -> None:
        """Count one more admitted prefill of ``tokens`` prompt tokens left."""
        chunk = min(tokens, buckets[-1])
        self.num_requests += 1
        self.tokens += chunk
        self.largest_member_bucket = max(self.largest_member_bucket, get_bucket_for_count(chunk, buckets))
        self.kv_blocks += kv_blocks


def fits(pack: Pack, tokens: int, buckets: Sequence[int]) -> bool:
    """Whether a whole prompt of ``tokens`` joins ``pack`` within the largest bucket and its largest member's."""
    if pack.num_requests == 0:
        return True
    total = pack.tokens + tokens
    if total > buckets[-1]:
        return False
    own = get_bucket_for_count(tokens, buckets)
    return get_bucket_for_count(total, buckets) <= max(pack.largest_member_bucket, own)


def buckets_while_decoding(buckets: Sequence[int], cap: int | None) -> list[int]:
    """The prefill buckets a step may use while requests decode (``max_prefill_tokens_while_decoding``).

    Those within ``cap``, at least the smallest; every bucket without a cap. The base
    scheduler's token budget becomes the last of them, so a longer prompt is chunked to it.
    """
    if cap is None:
        return list(buckets)
    return [bucket for bucket in buckets if bucket <= cap] or [buckets[0]]


def pack_padding(prefills: Sequence[str], num_tokens: Mapping[str, int], bucket: int) -> dict[str, int]:
    """Padded counts of a prefill step's requests: actual counts, the last one carrying the padding to ``bucket``.

    ``bucket`` holds the sum of their tokens. One prefill gets its bucket, as in the design;
    several add up to it.
    """
    padded = {req_id: num_tokens[req_id] for req_id in prefills}
    if prefills:
        padded[prefills[-1]] += bucket - sum(padded.values())
    return padded
