"""`neuronfleet-engine trace`: its traces in this process, its listing and errors through the installed entry
point."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from typer.testing import CliRunner

from neuronfleet.engine.cli.main import app

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def trace(*args: str) -> str:
    """``neuronfleet-engine trace`` in this process: vLLM is imported once for the suite, not per run (the
    console script itself is run by the tests below that need no vLLM)."""
    result = CliRunner().invoke(app, ["trace", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_trace_prints_the_seeds_chunked_prefill() -> None:
    output = trace("--scenario", "prompt-32000")
    prefill_lines = [line for line in output.splitlines() if "prefill req_0" in line]
    assert [line.split("prefill req_0: ")[1].split("  ")[0] for line in prefill_lines] == [
        "8192 tokens -> bucket 8192 (computed 0 -> 8192)",
        "8192 tokens -> bucket 8192 (computed 8192 -> 16384)",
        "8192 tokens -> bucket 8192 (computed 16384 -> 24576)",
        "7424 tokens -> bucket 8192 (computed 24576 -> 32000)",
    ]
    assert all("ACTIVE_PREFILL" in line for line in prefill_lines)
    assert "NeuronAsyncScheduler" in output


def test_trace_sync_prefix_cache() -> None:
    output = trace("-s", "prefix-cache", "--no-async-scheduling")
    assert "prefill req_0: 4000 tokens -> bucket 4096 (computed 1000 -> 5000)" in output
    assert "NeuronScheduler;" in output


def test_trace_lists_scenarios(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "trace", "--list")
    assert result.returncode == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert names == ["prompt-200", "prompt-5000", "prompt-32000", "prefix-cache", "decode-hidden", "kv-deadlock"]


def test_unknown_scenario_is_one_clear_line(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "trace", "--scenario", "nope")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: unknown scenario 'nope'; choose one of: prompt-200,")
