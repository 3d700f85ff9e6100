"""Damage to a compiled artifact that only its SHA-256 reveals."""

from __future__ import annotations

from pathlib import Path


def flip_bytes(path: Path) -> None:
    """Invert a few bytes in the middle of ``path`` in place: its size stays, its content does not."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4] = bytes(byte ^ 0xFF for byte in data[middle : middle + 4])
    path.write_bytes(data)
    assert len(data) == path.stat().st_size
