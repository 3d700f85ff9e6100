"""What uv.lock says an install holds: the packages an extra pulls in, with their locked versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.markers import Marker

ROOT = Path(__file__).resolve().parents[2]


def load_lock() -> dict[str, Any]:
    """The checkout's uv.lock, parsed."""
    return tomllib.loads((ROOT / "uv.lock").read_text())


def normalize(name: str) -> str:
    """A distribution name as uv.lock writes it (PEP 503: lower case, runs of ``-_.`` as one ``-``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(lock: dict[str, Any], root: str, extras: set[str], *, here: bool = False) -> set[str]:
    """Every package ``root[extras]`` pulls in, per uv.lock.

    Markers are ignored (a superset, for every platform) unless ``here``: then only what an install
    on this interpreter and platform gets.
    """
    packages = {p["name"]: p for p in lock["package"]}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(root, frozenset(extras))]
    while todo:
        name, wanted = todo.pop()
        package = packages[name]
        deps = list(package.get("dependencies", []))
        for extra in wanted:
            deps += package.get("optional-dependencies", {}).get(extra, [])
        for dep in deps:
            if here and "marker" in dep and not Marker(dep["marker"]).evaluate({"extra": ""}):
                continue
            key = (dep["name"], frozenset(dep.get("extra", [])))
            if key not in seen:
                seen.add(key)
                todo.append(key)
    return {name for name, _ in seen}


def locked_versions(lock: dict[str, Any]) -> dict[str, set[str]]:
    """Each locked package's versions (uv locks a few at two versions, one per Python or platform fork)."""
    versions: dict[str, set[str]] = {}
    for package in lock["package"]:
        versions.setdefault(package["name"], set()).add(package["version"])
    return versions
