"""Lint: no function in the shipped packages is longer than MAX_LINES (its decorators left out).

A function that long does several things: split it into named parts. An exception is named in
EXCEPTIONS with the reason it stays whole.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 80
ROOTS = ("operator/src", "engine/src", "devcluster/src")
#: ``path:function`` -> why it stays longer than MAX_LINES.
EXCEPTIONS: dict[str, str] = {}


def long_functions(root: Path) -> list[tuple[str, int]]:
    """Every function under ``root`` longer than MAX_LINES and not excepted, as (``path:function``, lines)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                where = f"{path}:{node.name}"
                if lines > MAX_LINES and where not in EXCEPTIONS:
                    found.append((where, lines))
    return found


def main() -> int:
    """Print each function over the limit; exit 1 if there is any."""
    found = [hit for root in ROOTS for hit in long_functions(Path(root))]
    for where, lines in found:
        print(f"{where}: {lines} lines (at most {MAX_LINES}): split it into named parts", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
