"""The checks `make lint` runs beside ruff and import-linter: each fails on what it guards against."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_function_over_the_limit_is_named(tmp_path: Path) -> None:
    function_length = tool("function_length")
    body = "\n".join(f"    x{i} = {i}" for i in range(function_length.MAX_LINES))
    (tmp_path / "long.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert function_length.long_functions(tmp_path) == [(f"{tmp_path / 'long.py'}:long", function_length.MAX_LINES + 1)]


def test_the_rig_is_within_the_budget_its_record_states(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rig_size = tool("rig_size")
    (tmp_path / "a.py").write_text("a = 1\nb = 2\n")
    record = tmp_path / "record.md"
    record.write_text("# A record\n\nBudget: 1 lines\n")
    assert rig_size.rig_lines((tmp_path,)) == 2
    assert rig_size.budget(record) == 1
    # The checkout's own rig and record: within budget, which `make lint` also checks.
    assert rig_size.rig_lines(tuple(ROOT / root for root in rig_size.RIG)) <= rig_size.budget(ROOT / rig_size.RECORD)
    record.write_text("# A record with no budget\n")
    with pytest.raises(SystemExit, match="no 'Budget: N lines' line"):
        rig_size.budget(record)
