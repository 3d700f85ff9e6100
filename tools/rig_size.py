"""Lint: the rig stays within the size its decision record allows.

The rig (the dev harness's package and the tests' harness) is what the project pays for proving its
promises on real parts. Its budget is written in ``docs/decisions/0001-a-rig-of-our-own.md`` as
``Budget: N lines``; outgrowing it fails until the record is amended with the new size and why.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

RECORD = Path("docs/decisions/0001-a-rig-of-our-own.md")
RIG = (Path("devcluster/src"), Path("tests/harness"))
BUDGET = re.compile(r"^Budget: ([\d,]+) lines", re.MULTILINE)


def rig_lines(roots: tuple[Path, ...] = RIG) -> int:
    """The lines of every Python file under ``roots``."""
    return sum(len(path.read_text().splitlines()) for root in roots for path in root.rglob("*.py"))


def budget(record: Path = RECORD) -> int:
    """The budget the decision record states."""
    found = BUDGET.search(record.read_text())
    if found is None:
        raise SystemExit(f"{record}: no 'Budget: N lines' line")
    return int(found.group(1).replace(",", ""))


def main() -> int:
    """Exit 1 when the rig is over its budget."""
    size, allowed = rig_lines(), budget()
    if size > allowed:
        print(
            f"the rig is {size:,} lines, over the {allowed:,} that {RECORD} allows: make it smaller, or amend "
            "the record with the new size and what it buys",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
