"""`neuronfleet-engine trace`, through the installed entry point."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def test_trace_prints_the_seeds_chunked_prefill(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "trace", "--scenario", "prompt-32000")
    assert result.returncode == 0, result.stderr
    prefill_lines = [line for line in result.stdout.splitlines() if "prefill req_0" in line]
    assert [line.split("prefill req_0: ")[1].split("  ")[0] for line in prefill_lines] == [
        "8192 tokens -> bucket 8192 (computed 0 -> 8192)",
        "8192 tokens -> bucket 8192 (computed 8192 -> 16384)",
        "8192 tokens -> bucket 8192 (computed 16384 -> 24576)",
        "7424 tokens -> bucket 8192 (computed 24576 -> 32000)",
    ]
    assert all("ACTIVE_PREFILL" in line for line in prefill_lines)
    assert "NeuronAsyncScheduler" in result.stdout


def test_trace_sync_prefix_cache(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "trace", "-s", "prefix-cache", "--no-async-scheduling")
    assert result.returncode == 0, result.stderr
    assert "prefill req_0: 4000 tokens -> bucket 4096 (computed 1000 -> 5000)" in result.stdout
    assert "NeuronScheduler;" in result.stdout


def test_trace_lists_scenarios(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "trace", "--list")
    assert result.returncode == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert names == ["prompt-200", "prompt-5000", "prompt-32000", "prefix-cache", "decode-hidden", "kv-deadlock"]


def test_unknown_scenario_is_one_clear_line(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "trace", "--scenario", "nope")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: unknown scenario 'nope'; choose one of: prompt-200,")
