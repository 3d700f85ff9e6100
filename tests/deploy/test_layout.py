"""The checkout shadows nothing: each top-level folder keeps its package in a src layout, so a Python
started anywhere in the checkout imports the standard library's ``operator``, not ours."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("where", [".", "operator", "engine", "devcluster"])
def test_python_started_in_the_checkout_imports_the_standard_library(where: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    # typer imports the standard library's operator too: the line from the issue that used to fail.
    ran = subprocess.run(
        [sys.executable, "-c", "import operator, typer; print(operator.add(1, 2))"],
        cwd=ROOT / where,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "3"


def test_no_top_level_folder_is_a_python_package() -> None:
    packages = sorted(path.name for path in ROOT.iterdir() if (path / "__init__.py").exists())
    assert packages == []


def test_the_import_names_are_served_from_the_src_layouts() -> None:
    import neuronfleet.contract
    import neuronfleet.devcluster
    import neuronfleet.engine
    import neuronfleet.operator

    for module, folder, package in [
        (neuronfleet.contract, "engine", "contract"),
        (neuronfleet.engine, "engine", "engine"),
        (neuronfleet.operator, "operator", "operator"),
        (neuronfleet.devcluster, "devcluster", "devcluster"),
    ]:
        assert Path(module.__file__ or "").resolve().parent == ROOT / folder / "src" / "neuronfleet" / package
