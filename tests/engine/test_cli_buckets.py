"""`neuronfleet-engine buckets`, through the installed entry point."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

RunCli = Callable[..., subprocess.CompletedProcess[str]]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_design_invalid_prefill_example_prints_the_contract_message(run_cli: RunCli, tmp_path: Path) -> None:
    config = write(
        tmp_path, "engine.yaml", "max_num_batched_tokens: 8192\nnum_batched_tokens_buckets: [512, 1024, 2048]\n"
    )
    result = run_cli("neuronfleet-engine", "buckets", "validate", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "num_batched_tokens_buckets: Last bucket in num_batched_tokens_buckets must equal "
        "max_num_batched_tokens (8192), got 2048"
    )


def test_design_invalid_decode_example_from_flags(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "buckets", "validate", "--max-num-seqs", "8", "--num-seqs-buckets", "1,2,4")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "num_seqs_buckets: Last bucket in num_seqs_buckets must equal max_num_seqs (8), got 4"
    )


def test_every_error_is_printed(run_cli: RunCli, tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "engine.json",
        json.dumps({"max_num_seqs": 8, "num_batched_tokens_buckets": [512, 1024, 2048], "num_seqs_buckets": [1, 2, 4]}),
    )
    result = run_cli("neuronfleet-engine", "buckets", "validate", "-c", str(config))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 2


def test_design_valid_examples_print_effective_buckets(run_cli: RunCli, tmp_path: Path) -> None:
    config = write(
        tmp_path,
        "engine.yaml",
        "max_num_seqs: 8\nmax_num_batched_tokens: 8192\nmax_model_len: 131072\n"
        "num_batched_tokens_buckets: [512, 1024, 2048, 4096, 8192]\nnum_seqs_buckets: [1, 2, 4, 8]\n",
    )
    result = run_cli("neuronfleet-engine", "buckets", "validate", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "valid",
        "num_batched_tokens_buckets: [512, 1024, 2048, 4096, 8192]",
        "num_seqs_buckets: [1, 2, 4, 8]",
    ]


def test_show_chunks_and_pads_a_long_prompt(run_cli: RunCli) -> None:
    result = run_cli(
        "neuronfleet-engine",
        "buckets",
        "show",
        "--max-num-batched-tokens",
        "8192",
        "--max-model-len",
        "32768",
        "--length",
        "32000",
        "-o",
        "json",
    )
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["num_batched_tokens_buckets"] == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert shown["chunks"] == [
        {"tokens": 8192, "bucket": 8192, "padding": 0},
        {"tokens": 8192, "bucket": 8192, "padding": 0},
        {"tokens": 8192, "bucket": 8192, "padding": 0},
        {"tokens": 7424, "bucket": 8192, "padding": 768},
    ]


def test_show_table_reports_padding_share(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "buckets", "show", "--length", "200")
    assert result.returncode == 0, result.stderr
    assert "padding: 56 of 256 computed tokens (21.9%)" in result.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("max_num_seqs: 8: 9\n", "is not valid YAML or JSON at line 1"),
        ("- 1\n- 2\n", "must hold a mapping of engine settings, got list"),
        ("max_num_seqs: -3\n", "max_num_seqs: Input should be greater than or equal to 1"),
        ("max_num_seqs: eight\n", "max_num_seqs: Input should be a valid integer"),
        ("num_seqs_buckets: 8\nmax_num_seqs: 8\n", "num_seqs_buckets: num_seqs_buckets must be a list, got int"),
        ("max_num_seqz: 8\n", "max_num_seqz: unknown setting"),
    ],
)
def test_bad_input_gets_one_clear_line(run_cli: RunCli, tmp_path: Path, content: str, message: str) -> None:
    config = write(tmp_path, "engine.yaml", content)
    result = run_cli("neuronfleet-engine", "buckets", "validate", "--config", str(config))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_unreadable_file(run_cli: RunCli, tmp_path: Path) -> None:
    result = run_cli("neuronfleet-engine", "buckets", "validate", "--config", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: cannot read {tmp_path / 'missing.yaml'}: No such file or directory"


def test_bad_flag_list(run_cli: RunCli) -> None:
    result = run_cli("neuronfleet-engine", "buckets", "validate", "--num-seqs-buckets", "1,two")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --num-seqs-buckets must be comma-separated integers, got '1,two'"
