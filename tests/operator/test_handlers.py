"""Which watch events of a service wake its reconcile: the handlers' one filter with a rule in it; and that kopf
keeps no diff base, which only a registry without change handlers may do."""

from __future__ import annotations

import concurrent.futures
from typing import Any, cast

import kopf
import kubernetes
import pytest

from neuronfleet.operator.cluster.cache import CachedKube, ObjectCache
from neuronfleet.operator.reconcilers import Manager
from neuronfleet.operator.runtime.handlers import NoChangeDetection, build_registry, spec_unobserved


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


def test_the_registry_has_no_change_handler_for_the_diff_base_it_does_not_keep() -> None:
    cache = ObjectCache()
    manager = Manager(CachedKube(kubernetes.client.ApiClient(), cache), lambda *_: None)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        registry = build_registry(manager, cache, ["default"], 300, executor)
    # A change handler (on.create, on.update, on.resume) would diff against NoChangeDetection's nothing.
    assert not registry._changing.get_all_handlers()
    assert registry._watching.get_all_handlers()
    # And that nothing is built from any body, however much it holds.
    body = kopf.Body(cast(kopf.RawBody, {"metadata": {"name": "llama"}, "spec": {"replicas": 2}}))
    assert NoChangeDetection().build(body=body) == {}
    assert NoChangeDetection().fetch(body=body) is None
