"""Every series one process writes and another reads is named in ``contract/metrics.py`` and nowhere else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from neuronfleet.contract import metrics

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("engine/src", "operator/src", "devcluster/src")
#: A Prometheus series of vLLM's or ours, as a string in code.
SERIES_NAME = re.compile(r"\b(?:vllm|neuronfleet):[a-z_]+")


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of a module, its classes and functions (prose may name a series)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def strays(path: Path, root: Path = ROOT) -> list[str]:
    """The series names a file spells in its code."""
    tree = ast.parse(path.read_text(), str(path))
    prose = docstrings(tree)
    return [
        f"{path.relative_to(root)}:{node.lineno}: {match}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
        for match in SERIES_NAME.findall(node.value)
    ]


def test_no_series_name_is_spelled_outside_the_contract() -> None:
    contract = Path(metrics.__file__).resolve()
    files = [path for root in SHIPPED for path in sorted((ROOT / root).rglob("*.py")) if path.resolve() != contract]
    assert len(files) > 100, "the shipped code was not found"
    found = [stray for path in files for stray in strays(path)]
    assert not found, "spell these through neuronfleet.contract.metrics:\n" + "\n".join(found)


def test_the_stray_check_sees_a_name_in_code_but_not_in_prose(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Reads vllm:num_requests_waiting."""\n'
        'WAITING = "vllm:num_requests_waiting"\n'
        'LABEL = f"{WAITING} per replica"\n'
    )
    assert strays(sample, tmp_path) == ["sample.py:2: vllm:num_requests_waiting"]


def test_every_series_is_catalogued_once_with_a_reader() -> None:
    names = {value for value in vars(metrics).values() if isinstance(value, str) and SERIES_NAME.fullmatch(value)}
    catalogued = [series.name for series in metrics.SERIES]
    assert sorted(catalogued) == sorted(names)
    assert all(series.readers for series in metrics.SERIES)
    assert set(metrics.PICKER_METRICS) <= names
