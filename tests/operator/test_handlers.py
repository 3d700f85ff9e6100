"""Which watch events of a service wake its reconcile: the handlers' one filter with a rule in it."""

from __future__ import annotations

from typing import Any, cast

import kopf
import pytest

from neuronfleet.operator.runtime.handlers import spec_unobserved


def service(generation: int, observed: int | None) -> kopf.Body:
    status: dict[str, Any] = {} if observed is None else {"observedGeneration": observed}
    return kopf.Body(cast(kopf.RawBody, {"metadata": {"name": "llama", "generation": generation}, "status": status}))


@pytest.mark.parametrize(
    ("event", "generation", "observed", "wakes"),
    [
        # The first listing (a start, a new leader) resumes every service, handled or not.
        (None, 3, 3, True),
        ("ADDED", 1, None, True),
        # A spec change bumps the generation past what the status observed.
        ("MODIFIED", 4, 3, True),
        # The operator's own status write (or a label's change): nothing new to act on.
        ("MODIFIED", 4, 4, False),
        ("DELETED", 4, 3, False),
    ],
)
def test_a_service_wakes_its_reconcile_on_a_generation_its_status_has_not_observed(
    event: str | None, generation: int, observed: int | None, wakes: bool
) -> None:
    assert spec_unobserved(body=service(generation, observed), type=event) is wakes
