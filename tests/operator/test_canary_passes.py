"""The drive's passes over progressing canaries: each such service reconciled every interval, none other."""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import cast

import pytest

from neuronfleet.operator.metrics import OperatorMetrics
from neuronfleet.operator.reconcilers import Manager
from neuronfleet.operator.runtime import drive


class Reconciled:
    """Stands in for the manager: records the services it is asked to reconcile."""

    def __init__(self) -> None:
        self.services: list[tuple[str, str]] = []
        self.metrics = OperatorMetrics()

    def reconcile_service(self, namespace: str, name: str) -> None:
        self.services.append((namespace, name))


def test_a_service_whose_canary_progresses_is_reconciled_every_interval_and_not_once_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drive, "CANARY_INTERVAL_S", 0.01)

    async def scenario() -> tuple[list[tuple[str, str]], int]:
        reconciled = Reconciled()
        progressing = [("serving", "llama")]
        asked = 0

        def canaries() -> list[tuple[str, str]]:
            nonlocal asked
            asked += 1
            return list(progressing)

        driven = drive.Drive(cast(Manager, reconciled), None, resync_seconds=3600)
        with concurrent.futures.ThreadPoolExecutor(2) as executor:
            driven.start(executor, canaries)
            while len(reconciled.services) < 3:
                await asyncio.sleep(0.001)
            # Its canary ended: three more passes find nothing to do.
            progressing.clear()
            ended_at, passes = len(reconciled.services), asked
            while asked < passes + 3:
                await asyncio.sleep(0.001)
            driven.stop()
        return reconciled.services, ended_at

    services, ended_at = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert set(services) == {("serving", "llama")}
    # At most the pass running as the canary ended adds one.
    assert len(services) <= ended_at + 1
