"""`neuronfleet-engine buckets recommend`, through the installed entry point."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuronfleet.contract.config import EngineConfig
from neuronfleet.engine.tuning.recommend import chunk_histogram, optimal_buckets, padding_waste, prompt_histogram
from neuronfleet.engine.tuning.workloads import WORKLOADS

RunCli = Callable[..., subprocess.CompletedProcess[str]]

PROMPT_METRICS = """\
# HELP vllm:request_prompt_tokens Number of prefill tokens processed.
# TYPE vllm:request_prompt_tokens histogram
vllm:request_prompt_tokens_bucket{engine="0",le="200.0",model_name="m"} 30.0
vllm:request_prompt_tokens_bucket{engine="0",le="500.0",model_name="m"} 50.0
vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="m"} 55.0
vllm:request_prompt_tokens_bucket{engine="0",le="+Inf",model_name="m"} 56.0
vllm:request_prompt_tokens_count{engine="0",model_name="m"} 56.0
vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 17000.0
"""


def recommend(run_cli: RunCli, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("neuronfleet-engine", "buckets", "recommend", *args)


def recommend_json(run_cli: RunCli, *args: str) -> Any:
    result = recommend(run_cli, *args, "-o", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_lengths_file_gets_the_optimal_buckets_and_a_pasteable_line(run_cli: RunCli, tmp_path: Path) -> None:
    lengths = [300] * 50 + [1000] * 10 + [5000] * 2
    path = write(tmp_path, "lengths.txt", "\n".join(map(str, lengths)) + "\n")
    result = recommend(
        run_cli, "--lengths", str(path), "--count", "3", "--max-num-batched-tokens", "8192", "--max-model-len", "8192"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"source: 62 prompts from {path}"
    assert lines[1] == "prefill: 62 chunks, 35000 tokens; effective max_num_batched_tokens 8192, granularity 128"
    assert "│ recommended              │     3 │ [384, 1024, 8192]" in result.stdout
    assert "│ default (powers of two)  │     7 │ [128, 256, 512, 1024, 2048, 4096, 8192]" in result.stdout
    # The last line pastes into an engine configuration that the engine accepts.
    pasted = yaml.safe_load(lines[-1])
    assert pasted == {"num_batched_tokens_buckets": [384, 1024, 8192]}
    EngineConfig.model_validate({"max_num_batched_tokens": 8192, **pasted})


def test_json_list_file_and_json_output(run_cli: RunCli, tmp_path: Path) -> None:
    lengths = [100, 100, 250, 20_000]
    path = write(tmp_path, "lengths.json", json.dumps(lengths))
    document = recommend_json(
        run_cli, "--lengths", str(path), "-k", "2", "--max-num-batched-tokens", "8192", "--max-model-len", "32768"
    )
    chunks = chunk_histogram(prompt_histogram(lengths), 8192, 32768)  # 100, 100, 250, 8192, 8192, 3616
    assert document["effective_max_num_batched_tokens"] == 8192
    assert (document["chunks"], document["tokens"]) == (6, sum(lengths))
    assert document["recommended"] == {
        "count": 2,
        "buckets": [256, 8192],
        "padding_waste": round(padding_waste(chunks, [256, 8192]), 6),
    }
    assert document["default"]["count"] == 7
    assert document["optimal_at_default_count"]["buckets"] == optimal_buckets(chunks, 7, 8192)
    assert document["optimal_at_default_count"]["padding_waste"] <= document["default"]["padding_waste"]
    assert document["yaml"] == "num_batched_tokens_buckets: [256, 8192]"
    assert document["notes"] == []


def test_fewer_useful_sizes_than_asked_is_noted(run_cli: RunCli, tmp_path: Path) -> None:
    path = write(tmp_path, "lengths.txt", "300\n300\n\n1000\n")
    result = recommend(run_cli, "--lengths", str(path), "--count", "6")
    assert result.returncode == 0, result.stderr
    assert (
        "note: asked for 6 buckets, but only 3 sizes can matter for this distribution at granularity 128; "
        "all of them are recommended"
    ) in result.stdout
    assert result.stdout.splitlines()[-1] == "num_batched_tokens_buckets: [384, 1024, 8192]"


def test_named_distribution_uses_its_own_limits(run_cli: RunCli) -> None:
    document = recommend_json(run_cli, "--distribution", "summarization", "--count", "7", "--samples", "2000")
    workload = WORKLOADS["summarization"]
    prompts = prompt_histogram(workload.sample(2000, seed=0))
    chunks = chunk_histogram(prompts, workload.max_num_batched_tokens, workload.max_model_len)
    assert document["source"] == "2000 prompts of workload summarization (seed 0)"
    assert document["chunks"] == sum(chunks.values())
    assert document["recommended"]["buckets"] == optimal_buckets(chunks, 7, 8192)
    # Summarization chunks are long: the tailored set wastes much less than the powers of two.
    assert document["recommended"]["padding_waste"] < 0.6 * document["default"]["padding_waste"]


def test_config_file_sets_the_limits_and_its_buckets_are_compared(run_cli: RunCli, tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "engine.yaml",
        "max_num_batched_tokens: 4096\nmax_model_len: 8192\nnum_batched_tokens_buckets: [1024, 4096]\n",
    )
    result = recommend(run_cli, "--distribution", "chat", "-k", "4", "--samples", "500", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "effective max_num_batched_tokens 4096" in result.stdout
    assert "│ configured               │     2 │ [1024, 4096]" in result.stdout
    assert result.stdout.splitlines()[-1].endswith(", 4096]")


def test_metrics_file_with_vllm_prompt_histogram(run_cli: RunCli, tmp_path: Path) -> None:
    path = write(tmp_path, "metrics.txt", PROMPT_METRICS)
    document = recommend_json(run_cli, "--metrics", str(path), "-k", "3")
    assert document["source"] == (f"56 prompts from vllm:request_prompt_tokens at {path} (at histogram bucket bounds)")
    # 30 at 200, 20 at 500, 5 at 1000, 1 past the last bound at max_model_len (8192): the five
    # at 1000 would pad to 8192 without a 1024 bucket, which costs more than 30 padding to 512.
    assert document["recommended"]["buckets"] == [512, 1024, 8192]
    assert document["tokens"] == 30 * 200 + 20 * 500 + 5 * 1000 + 8192


@pytest.fixture
def metrics_server() -> Iterator[str]:
    """A loopback HTTP server answering /metrics the way a running engine does."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = PROMPT_METRICS.encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass  # keep test output clean

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_metrics_from_a_running_engine_over_http(run_cli: RunCli, metrics_server: str) -> None:
    document = recommend_json(run_cli, "--metrics", f"{metrics_server}/metrics", "-k", "3")
    assert document["recommended"]["buckets"] == [512, 1024, 8192]
    missing = recommend(run_cli, "--metrics", f"{metrics_server}/nothing", "-k", "3")
    assert missing.returncode == 2
    assert missing.stderr == f"error: cannot fetch {metrics_server}/nothing: HTTP 404 Not Found\n"


@pytest.mark.parametrize(
    ("args", "files", "message"),
    [
        ((), {}, "give exactly one of --lengths, --distribution, --metrics"),
        (("--distribution", "chat", "--lengths", "{tmp}/ok.txt", "-k", "2"), {"ok.txt": "5\n"}, "give exactly one of"),
        (("--distribution", "chat"), {}, "--count is required: how many prefill buckets to compile"),
        (
            ("--distribution", "chat", "-k", "0"),
            {},
            "Invalid value for '--count' / '-k': Input should be greater than or equal to 1",
        ),
        (
            ("--distribution", "chat", "-k", "2", "--granularity", "0"),
            {},
            "Invalid value for '--granularity': Input should be greater than or equal to 1",
        ),
        (
            ("--distribution", "chat", "-k", "2", "--samples", "0"),
            {},
            "Invalid value for '--samples': Input should be greater than or equal to 1",
        ),
        (
            ("--distribution", "poetry", "-k", "2"),
            {},
            "unknown --distribution 'poetry'; known: chat, summarization, code",
        ),
        (
            ("--distribution", "chat", "-k", "2", "-o", "yaml"),
            {},
            "Invalid value for '--output' / '-o': Value error, 'yaml' is not one of 'table', 'json'.",
        ),
        (
            ("--lengths", "{tmp}/bad.txt", "-k", "2"),
            {"bad.txt": "100\n2x0\n"},
            "{tmp}/bad.txt line 2: expected an integer prompt length, got '2x0'",
        ),
        (
            ("--lengths", "{tmp}/bad.json", "-k", "2"),
            {"bad.json": "[100, true]"},
            "{tmp}/bad.json[1]: expected an integer prompt length, got True",
        ),
        (("--lengths", "{tmp}/bad.json", "-k", "2"), {"bad.json": "[100,"}, "{tmp}/bad.json is not a valid JSON list"),
        (
            ("--lengths", "{tmp}/empty.txt", "-k", "2"),
            {"empty.txt": "\n"},
            "the distribution is empty: no prompt lengths to recommend buckets for",
        ),
        (("--lengths", "{tmp}/zero.txt", "-k", "2"), {"zero.txt": "0\n"}, "prompt length must be positive, got 0"),
        (
            ("--lengths", "{tmp}/long.txt", "-k", "2", "--max-model-len", "4096"),
            {"long.txt": "5000\n"},
            "prompt length 5000 exceeds max_model_len (4096)",
        ),
        (("--lengths", "{tmp}/absent.txt", "-k", "2"), {}, "cannot read {tmp}/absent.txt: No such file or directory"),
        (
            ("--metrics", "{tmp}/metrics.txt", "-k", "2"),
            {"metrics.txt": "# TYPE up gauge\nup 1\n"},
            "no neuronfleet:prefill_chunk_tokens or vllm:request_prompt_tokens histogram in the metrics",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    run_cli: RunCli, tmp_path: Path, args: tuple[str, ...], files: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        write(tmp_path, name, text)
    result = recommend(run_cli, *(arg.replace("{tmp}", str(tmp_path)) for arg in args))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: " + message.replace("{tmp}", str(tmp_path)))


def test_invalid_limits_are_reported_like_validate(run_cli: RunCli) -> None:
    result = recommend(run_cli, "--distribution", "chat", "-k", "2", "--max-model-len", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == "max_model_len: Input should be greater than or equal to 1"
