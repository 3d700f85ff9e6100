"""tools/stages.sh, which ends every ``make test``: each stage's wall time, their sum, and the run's own wall."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

STAGES = Path(__file__).resolve().parents[2] / "tools" / "stages.sh"


def stages(record: Path, *args: str) -> str:
    done = subprocess.run(
        [str(STAGES), *args],
        env={**os.environ, "NEURONFLEET_STAGES": str(record)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_the_table_gives_each_stage_their_sum_and_the_wall_since_the_reset(tmp_path: Path) -> None:
    record = tmp_path / "stages.tsv"
    stages(record, "reset")
    # Two stages side by side, as make -j runs the tools: their sum is twice the wall.
    left = subprocess.Popen(
        [str(STAGES), "run", "left", "-", "sleep", "2"], env={**os.environ, "NEURONFLEET_STAGES": str(record)}
    )
    stages(record, "run", "right", "cached in", "bash", "-c", "sleep 2; echo cached in")
    assert left.wait(timeout=60) == 0
    rows = {line[:28].strip(): line[28:].split() for line in stages(record, "table").splitlines() if line.strip()}
    assert rows["left"] == ["0:02", "-"]
    assert rows["right"] == ["0:02", "cache"]
    assert rows["sum of the stages"][0] == "0:04"
    assert rows["wall, start to end"] in (["0:02"], ["0:03"])
