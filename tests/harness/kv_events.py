"""Reading an engine's KV cache events (``serve --kv-events-port``) as a prefix-cache-aware router would."""

from __future__ import annotations

import msgspec
import zmq
from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher


def replayed(endpoint: str) -> list[KVEventBatch]:
    """Every batch the publisher still buffers, from its replay socket (no subscriber has to be early)."""
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    try:
        socket.connect(endpoint)
        socket.send_multipart((b"", (0).to_bytes(8, "big")))
        batches: list[KVEventBatch] = []
        while True:
            assert socket.poll(10_000), "the replay socket did not answer"
            _, _topic, seq, payload = socket.recv_multipart()
            if seq == ZmqEventPublisher.END_SEQ:
                return batches
            batches.append(decoder.decode(payload))
    finally:
        context.destroy(linger=0)
