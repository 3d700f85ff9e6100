"""runc without ``process.rlimits``: the OCI runtime containerd runs on the real node.

Sandbox refusal it answers: runc sets a container's rlimits with prlimit(2) from outside the container,
and this sandbox refuses it (``error setting rlimit type 7: operation not permitted``). containerd's
default spec always carries RLIMIT_NOFILE, so the rlimits are dropped from the bundle's ``config.json``
(``create``, ``run``) or from the process file of ``exec --process``, and the real runc runs with the
unchanged arguments; containers inherit the shim's limits instead.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RUNC = "/usr/sbin/runc"
#: runc's global flags that take a value (the subcommand is the first other word).
_GLOBAL_WITH_VALUE = frozenset({"--root", "--log", "--log-format", "--criu", "--rootless"})


def install(path: Path) -> Path:
    """Write an executable at ``path`` that runs this wrapper, for an OCI runtime setting (containerd's
    ``BinaryName``, podman's ``--runtime``). It runs in isolated mode (-I): quick, and nothing it prints at
    start-up (runc's stderr is the container's) can reach a container's output."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -I {Path(__file__)} "$@"\n')
    path.chmod(0o755)
    return path


def subcommand(args: Sequence[str]) -> str | None:
    """runc's subcommand in ``args`` (global flags and their values skipped)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _GLOBAL_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value of the first of ``names`` in ``args`` (``--flag value`` or ``--flag=value``)."""
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
    return None


def without_rlimits(process: dict[str, Any]) -> bool:
    """Drop ``rlimits`` from an OCI process object; whether there were any."""
    return process.pop("rlimits", None) is not None


def _rewrite(path: Path, *, nested: bool) -> None:
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # runc itself reports a missing or broken file
    if without_rlimits(spec.get("process", {}) if nested else spec):
        temporary = path.with_name(path.name + ".norlimits")
        temporary.write_text(json.dumps(spec))
        temporary.replace(path)


def main(args: Sequence[str] = tuple(sys.argv[1:])) -> None:
    """Strip rlimits from what ``args`` will run, then become runc."""
    command = subcommand(args)
    if command in ("create", "run"):
        bundle = flag_value(args, "--bundle", "-b") or os.getcwd()
        _rewrite(Path(bundle) / "config.json", nested=True)
    elif command == "exec":
        process = flag_value(args, "--process", "-p")
        if process:
            _rewrite(Path(process), nested=False)
    os.execv(RUNC, [RUNC, *args])


if __name__ == "__main__":
    main()
