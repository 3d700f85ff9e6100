"""The real Neuron compile: vLLM started once with the vLLM Neuron plugin's CPU compile mode.

The vLLM Neuron plugin compiles one graph (NEFF) per bucket while the engine
starts. With ``VLLM_NEURON_CPU_COMPILE=1`` it compiles without a Neuron device
and without executing, for the target in ``NEURON_PLATFORM_TARGET_OVERRIDE``,
and ``NEURON_LIBTORCH_REMOTE_CACHE`` makes it write the NEFFs to a shared
directory: here ``STORE/HASH/neff``, which ``serve --device neuron`` points the
plugin at again (with ``VLLM_NEURON_DISABLE_WARMUP_COMPILE=1``: a graph missing
there stops the server instead of compiling). The command is, for an engine
configuration rendered as in ``serve``::

    VLLM_NEURON_CPU_COMPILE=1 NEURON_PLATFORM_TARGET_OVERRIDE=trn2 \\
    NEURON_LIBTORCH_REMOTE_CACHE=STORE/HASH/neff \\
    python -m neuronfleet.engine.artifacts.neuron_compile MODEL --max-num-seqs ... --additional-config ...

This path needs the Neuron SDK and the plugin; it is not exercised by the test
suite (no Neuron SDK on CI machines).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.engine.artifacts.store import GRAPHS_DIR, BucketEntry, artifact_dir


def compile_command(model: str, engine: EngineConfig, target: str, neff_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The argv and extra environment of one Neuron compile of every bucket."""
    argv = [sys.executable, "-m", "neuronfleet.engine.artifacts.neuron_compile", model, *engine.vllm_serve_args()]
    env = {
        "VLLM_NEURON_CPU_COMPILE": "1",
        "NEURON_PLATFORM_TARGET_OVERRIDE": target,
        "NEURON_LIBTORCH_REMOTE_CACHE": str(neff_dir),
        # A compile must compile: an inherited "cache miss is fatal" (serving's setting) would stop it.
        "VLLM_NEURON_DISABLE_WARMUP_COMPILE": "0",
        "VLLM_NO_USAGE_STATS": "1",
    }
    return argv, env


def neuron_compile_bucket(
    engine: EngineConfig, identity: CompileIdentity, store: str
) -> Callable[[BucketEntry], float]:
    """A per-bucket compile step for the manifest: the first call compiles every graph at once.

    The plugin builds all graphs in one engine start-up, so each bucket is
    recorded with an equal share of the total time.
    """
    neff_dir = artifact_dir(store, identity.hash()) / GRAPHS_DIR
    neff_dir.mkdir(parents=True, exist_ok=True)
    argv, env = compile_command(identity.model.uri.removeprefix("hf://"), engine, identity.target, neff_dir)
    share: list[float] = []

    def compile_bucket(entry: BucketEntry) -> float:
        if not share:
            start = time.monotonic()
            subprocess.run(argv, env={**os.environ, **env}, check=True, stdin=subprocess.DEVNULL)
            share.append((time.monotonic() - start) / engine.compiled_graph_count)
        return share[0]

    return compile_bucket


def main(argv: Sequence[str] | None = None) -> None:
    """Start vLLM's engine once from ``vllm serve``-style arguments, so the plugin compiles, then stop."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.llm_engine import LLMEngine

    parser = FlexibleArgumentParser(description=__doc__)  # type: ignore[no-untyped-call]
    parser.add_argument("model")  # type: ignore[no-untyped-call]
    parser = EngineArgs.add_cli_args(parser)
    args = parser.parse_args(None if argv is None else list(argv))
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    del engine


if __name__ == "__main__":
    main()
