"""What ships: the wheel the images install holds no test code (pytest plugins, test helpers) and no dev
harness (``neuronfleet-devcluster`` is a distribution of its own)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Everything the build reads (pyproject.toml's package-dir and readme).
SOURCES = ("pyproject.toml", "README.md", "engine", "operator")
TEST_MODULES = frozenset({"conftest.py", "testing.py", "pytest_plugin.py"})


def build_wheel(directory: Path, sources: Path = ROOT, names: tuple[str, ...] = SOURCES) -> Path:
    """The wheel of the project in ``sources``, built from a copy (the checkout's build/ stays untouched)."""
    source = directory / "source"
    source.mkdir()
    for name in names:
        if (sources / name).is_dir():
            shutil.copytree(sources / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "build"))
        else:
            shutil.copy2(sources / name, source / name)
    out = directory / "dist"
    built = subprocess.run(
        [sys.executable, "-c", "import sys, setuptools.build_meta as b; print(b.build_wheel(sys.argv[1]))", str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return out / built.stdout.strip().splitlines()[-1]


def imports(source: str) -> set[str]:
    """The top-level names of every module a Python source imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_wheel_holds_no_test_code(tmp_path: Path) -> None:
    with zipfile.ZipFile(build_wheel(tmp_path)) as wheel:
        modules = {name: wheel.read(name).decode() for name in wheel.namelist() if name.endswith(".py")}
    # A real build of every package the images install; the dev harness is not one of them.
    assert not [name for name in modules if name.startswith("neuronfleet/devcluster/")]
    assert "neuronfleet/operator/main.py" in modules
    assert "neuronfleet/engine/cli/main.py" in modules
    assert "neuronfleet/contract/config.py" in modules
    named_as_tests = [
        name for name in modules if Path(name).name in TEST_MODULES or Path(name).name.startswith("test_")
    ]
    assert named_as_tests == []
    assert [name for name, source in modules.items() if imports(source) & {"pytest", "_pytest"}] == []


def test_the_dev_harness_wheel_holds_its_package_data_and_command(tmp_path: Path) -> None:
    harness = ROOT / "devcluster"
    names = tuple(p.name for p in harness.iterdir() if p.name not in {"build", "__pycache__"})
    with zipfile.ZipFile(build_wheel(tmp_path, harness, names)) as wheel:
        files = set(wheel.namelist())
        (entry_points,) = [wheel.read(n).decode() for n in files if n.endswith(".dist-info/entry_points.txt")]
    # The real node compiles pause.c, and KWOK reads stages.yaml, from the installed package.
    assert {"neuronfleet/devcluster/images/pause.c", "neuronfleet/devcluster/controlplane/stages.yaml"} <= files
    assert "neuronfleet/devcluster/cli.py" in files
    assert "neuronfleet-dev = neuronfleet.devcluster.cli:app" in entry_points
    shipped = ("neuronfleet/contract/", "neuronfleet/engine/", "neuronfleet/operator/")
    assert not [name for name in files if name.startswith(shipped)]
