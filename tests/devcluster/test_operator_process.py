"""OperatorProcess reads the operator from outside: what it looks for must be what the operator writes."""

from __future__ import annotations

from neuronfleet.devcluster.operator_process import RESYNCS_TOTAL
from neuronfleet.operator import metrics


def test_the_resync_counter_it_reads_is_the_one_the_operator_exports() -> None:
    assert f"{metrics.RESYNCS}_total" == RESYNCS_TOTAL
