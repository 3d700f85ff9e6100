"""How every benchmark prints its figures: one aligned table under a title, the same in each."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table

#: Wide enough that no table wraps in a CI log.
WIDTH = 200


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """``rows`` under ``columns``: the first column (what was measured) left-aligned, the figures right."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=WIDTH, highlight=False).print(table)
