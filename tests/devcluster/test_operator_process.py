"""devcluster reads the operator from outside: the names it looks for must be the ones the operator writes."""

from __future__ import annotations

from neuronfleet.devcluster.addons.operator_process import RESYNCS_TOTAL
from neuronfleet.devcluster.demo import run
from neuronfleet.operator import api, metrics


def test_the_resync_counter_it_reads_is_the_one_the_operator_exports() -> None:
    assert f"{metrics.RESYNCS}_total" == RESYNCS_TOTAL


def test_the_demo_names_the_kinds_the_operator_serves() -> None:
    assert {api.SERVICE_KIND.kind, api.ARTIFACT_KIND.kind} == run.STORY_KINDS
