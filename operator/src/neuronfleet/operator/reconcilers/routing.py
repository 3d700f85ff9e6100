"""The router of a service: its InferencePool, and with ``spec.routing`` the Endpoint Picker in front of it.

A canary behind the router adds its own pool and picker, and the router splits requests between the
revisions by the step's weight (:func:`neuronfleet.operator.policy.canary.revision_split`).
"""

from __future__ import annotations

from neuronfleet.operator import plan
from neuronfleet.operator.cluster.kube import BY_KIND, DEPLOYMENTS, INFERENCE_POOLS, Kube
from neuronfleet.operator.policy import canary
from neuronfleet.operator.policy.conditions import ConditionType, Reason
from neuronfleet.operator.policy.service_status import RoutingState
from neuronfleet.operator.reconcilers.common import ServicePass

#: The Routing condition's reasons while the operator runs a picker for the service.
_PICKER_REASONS = frozenset({Reason.PICKER_READY, Reason.PICKER_STARTING})


class Router:
    """Applies a service's InferencePool and its picker's objects, or deletes the picker's once unwanted."""

    def __init__(self, kube: Kube, images: plan.RouterImages) -> None:
        self.kube = kube
        self.images = images

    def reconcile(self, service: ServicePass) -> RoutingState:
        """Apply the pool (where the cluster serves the kind) and, with ``spec.routing``, the router; with a
        canary behind it (on trial beside the serving revision), a pool for each revision, and its split."""
        owner, namespace, spec, split = service.owner, service.namespace, service.spec, service.split
        stable_revision = service.deployment.artifact_hash if service.deployment is not None else None
        trial, previous = service.trial, service.previous
        if not self.kube.serves(INFERENCE_POOLS):
            return RoutingState(pool_served=False)
        behind = spec.routing is not None
        pool_revision = canary.stable_pool_revision(trial, stable_revision, behind)
        self.kube.apply(plan.inference_pool(owner, namespace, pool_revision))
        canary_pool = behind and spec.rollout.canary is not None
        self._canary_pool(owner, namespace, canary_pool)
        if spec.routing is None:
            if any(c.type == ConditionType.ROUTING and c.reason in _PICKER_REASONS for c in previous.conditions):
                self._delete_router(owner, namespace)
            return RoutingState(pool_served=True)
        ready = 0
        scoring = plan.scoring_of(spec, self.images)
        routed = plan.router_objects(owner, namespace, spec.routing, self.images, scoring, split, canary_pool)
        for obj in routed:
            applied = self.kube.apply(obj)
            if obj["kind"] == DEPLOYMENTS.kind:
                ready = int((applied.get("status") or {}).get("readyReplicas") or 0)
        return RoutingState(pool_served=True, ready=ready)

    def _canary_pool(self, owner: plan.Owner, namespace: str, wanted: bool) -> None:
        """The canary's pool while the service asks for canaries behind its router; gone once not."""
        if wanted:
            self.kube.apply(plan.canary_inference_pool(owner, namespace))
        elif self.kube.get(INFERENCE_POOLS, namespace, plan.canary_pool_name(owner.name)) is not None:
            self.kube.delete(INFERENCE_POOLS, namespace, plan.canary_pool_name(owner.name))

    def _delete_router(self, owner: plan.Owner, namespace: str) -> None:
        # What the plan applies for a router, the pods first; the pool stays (a Gateway may route through it).
        for obj in plan.router_removal(owner, namespace):
            self.kube.delete(BY_KIND[obj["kind"]], namespace, obj["metadata"]["name"])
