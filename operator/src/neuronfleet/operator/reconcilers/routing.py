"""The router of a service: its InferencePool, and with ``spec.routing`` the Endpoint Picker in front of it."""

from __future__ import annotations

from neuronfleet.operator import api, plan
from neuronfleet.operator.decide import RoutingState
from neuronfleet.operator.kube import (
    CONFIGMAPS,
    DEPLOYMENTS,
    INFERENCE_POOLS,
    PDBS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    SERVICES,
    Kube,
)
from neuronfleet.operator.status import ConditionType, Reason

#: The Routing condition's reasons while the operator runs a picker for the service.
_PICKER_REASONS = frozenset({Reason.PICKER_READY, Reason.PICKER_STARTING})


class Router:
    """Applies a service's InferencePool and its picker's objects, or deletes the picker's once unwanted."""

    def __init__(self, kube: Kube, images: plan.RouterImages) -> None:
        self.kube = kube
        self.images = images

    def reconcile(
        self,
        owner: plan.Owner,
        namespace: str,
        spec: api.NeuronInferenceServiceSpec,
        previous: api.NeuronInferenceServiceStatus,
    ) -> RoutingState:
        """Apply the pool (where the cluster serves the kind) and, with ``spec.routing``, the router."""
        if not self.kube.serves(INFERENCE_POOLS):
            return RoutingState(pool_served=False)
        self.kube.apply(plan.inference_pool(owner, namespace))
        if spec.routing is None:
            if any(c.type == ConditionType.ROUTING and c.reason in _PICKER_REASONS for c in previous.conditions):
                self._delete_router(owner.name, namespace)
            return RoutingState(pool_served=True)
        ready = 0
        scoring = plan.PickerScoring.of(spec, self.images)
        routed = plan.router_objects(owner, namespace, spec.routing, self.images, scoring)
        for obj in routed:
            applied = self.kube.apply(obj)
            if obj["kind"] == DEPLOYMENTS.kind:
                ready = int((applied.get("status") or {}).get("readyReplicas") or 0)
        return RoutingState(pool_served=True, ready=ready)

    def _delete_router(self, service: str, namespace: str) -> None:
        # The pods first, then what they used; the pool stays (a Gateway may route through it).
        router, picker = plan.router_name(service), plan.picker_name(service)
        for resource, name in (
            (DEPLOYMENTS, router),
            (PDBS, router),
            (SERVICES, router),
            (SERVICES, picker),
            (CONFIGMAPS, router),
            (ROLE_BINDINGS, picker),
            (ROLES, picker),
            (SERVICE_ACCOUNTS, picker),
        ):
            self.kube.delete(resource, namespace, name)
