"""The simulated Neuron compiler: a bucket's graph "compiles" in the time the cost model gives.

Each graph is written as a file, ``GRAPHS/<kind>-<size>.neff``, so a simulated
artifact has what a real one has to copy and check: one file per bucket. Its
bytes are deterministic (the same identity and bucket give the same file), and
its size grows with the bucket, as a NEFF's does.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

from neuronfleet.engine.artifacts.store import BucketEntry
from neuronfleet.engine.sim.cost_model import CostModel

#: Bytes of simulated graph per prefill token, or per decode sequence.
BYTES_PER_TOKEN = 128
BYTES_PER_SEQUENCE = 16 * 1024


def graph_name(entry: BucketEntry) -> str:
    """The graph file of a bucket, relative to the graphs' directory."""
    context = "" if entry.context is None else f"-context-{entry.context}"
    return f"{entry.kind}-{entry.size}{context}.neff"


def graph_bytes(seed: str, entry: BucketEntry) -> bytes:
    """The simulated graph of a bucket: a deterministic stream, sized by the bucket."""
    size = entry.size * (BYTES_PER_TOKEN if entry.kind == "prefill" else BYTES_PER_SEQUENCE)
    context = "" if entry.context is None else f"/{entry.context}"
    block = hashlib.sha256(f"{seed}/{entry.kind}/{entry.size}{context}".encode()).digest()
    return (block * (size // len(block) + 1))[:size]


def write_graph(graphs: Path, seed: str, entry: BucketEntry) -> None:
    """Write a bucket's graph atomically: a killed compile leaves no half-written graph."""
    graphs.mkdir(parents=True, exist_ok=True)
    target = graphs / graph_name(entry)
    temporary = graphs / f".{target.name}.tmp"
    temporary.write_bytes(graph_bytes(seed, entry))
    os.replace(temporary, target)


def simulated_compiler(cost: CostModel, *, sleep: bool, graphs: Path, seed: str) -> Callable[[BucketEntry], float]:
    """Compile one bucket on the simulated device: take (or, with ``sleep=False``, only count) its time.

    Each bucket's graph file is written in ``graphs``; ``seed``, the artifact's hash, makes its bytes.
    """

    def compile_bucket(entry: BucketEntry) -> float:
        seconds = cost.compile_seconds(entry.size)
        if sleep:
            time.sleep(seconds)
        write_graph(graphs, seed, entry)
        return seconds

    return compile_bucket
