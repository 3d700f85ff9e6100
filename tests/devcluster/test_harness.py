"""The test harness lives under tests/, and what every test loads leaves the operator's kopf out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Loads conftest files as pytest does (by path), then the plugins they name; prints the kopf modules loaded.
LOAD = """
import importlib, importlib.util, sys
sys.path.insert(0, "tests")
for path in sys.argv[1:]:
    if path.endswith(".py"):
        spec = importlib.util.spec_from_file_location(path.replace("/", "."), path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for plugin in getattr(module, "pytest_plugins", []):
            importlib.import_module(plugin)
    else:
        importlib.import_module(path)
print(sorted(name for name in sys.modules if name.partition(".")[0] == "kopf"))
"""


def kopf_modules_loaded(*load: str) -> str:
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD, *load], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert loaded.returncode == 0, loaded.stderr
    return loaded.stdout.strip()


def test_the_engine_tests_plugins_do_not_import_kopf() -> None:
    assert kopf_modules_loaded("tests/conftest.py", "harness.engine_server") == "[]"


def test_the_check_sees_kopf_when_it_is_imported() -> None:
    # The operator's handlers import kopf: the check above would see it.
    assert kopf_modules_loaded("tests/conftest.py", "neuronfleet.operator.runtime.handlers") != "[]"
