"""The one status writer every reconciler uses: status written only when it changed, then the events."""

from __future__ import annotations

from collections.abc import Sequence

from neuronfleet.operator import api
from neuronfleet.operator.cluster.kube import Kube, Resource
from neuronfleet.operator.metrics import OperatorMetrics
from neuronfleet.operator.policy.conditions import Event
from neuronfleet.operator.reconcilers.common import Emit, Obj


class StatusWriter:
    """Writes the status of services and artifacts, counts their phases and posts their events."""

    def __init__(self, kube: Kube, emit: Emit, metrics: OperatorMetrics) -> None:
        self.kube = kube
        self.emit = emit
        self.metrics = metrics

    def write(self, resource: Resource, body: Obj, status: api.K8sModel, events: Sequence[Event]) -> bool:
        """Write status if it changed (so the operator's own writes settle), then post the events.

        Returns whether the status changed.
        """
        new = status.model_dump(mode="json", exclude_none=True)
        old = body.get("status") or {}
        changed = new != old
        meta = body["metadata"]
        if changed:
            patch = merge_patch(old, new)
            self.kube.merge_patch(resource, meta["namespace"], meta["name"], {"status": patch}, subresource="status")
        self.metrics.status_written(resource.kind, meta["namespace"], meta["name"], old, new)
        for event in events:
            self.emit(body, event)
        return changed


def merge_patch(old: Obj, new: Obj) -> Obj:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``: a field gone at any depth is set to null,
    or the server would keep it (a canary's next step must not keep the last one's start)."""
    patch: Obj = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        patch[key] = merge_patch(before, value) if isinstance(value, dict) and isinstance(before, dict) else value
    return patch
