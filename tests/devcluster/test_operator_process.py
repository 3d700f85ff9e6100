"""OperatorProcess reads the operator from outside: what it looks for must be what the operator writes."""

from __future__ import annotations

from neuronfleet.devcluster.operator_process import RESYNC_DONE
from neuronfleet.operator import handlers


def test_the_resync_line_it_counts_is_the_one_the_operator_logs() -> None:
    assert RESYNC_DONE == handlers.RESYNC_DONE
