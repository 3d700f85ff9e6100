"""The autoscaler's objects of a service: its starting scale and its KEDA ScaledObject."""

from __future__ import annotations

import logging

from neuronfleet.contract.start_time import predict_model_start
from neuronfleet.operator.cluster.kube import FORBIDDEN, NOT_FOUND, SCALED_OBJECTS, SERVICES_NIS, ApiError, Kube
from neuronfleet.operator.policy import scaling
from neuronfleet.operator.policy.conditions import ConditionType
from neuronfleet.operator.reconcilers.common import ServicePass

log = logging.getLogger(__name__)


class Autoscaler:
    """Applies or deletes a service's ScaledObject, and says what became of ``spec.autoscaling``."""

    def __init__(self, kube: Kube, prometheus: str | None) -> None:
        self.kube = kube
        #: The Prometheus URL KEDA's triggers query (``None``: autoscaling is not set up).
        self.prometheus = prometheus

    def reconcile(self, service: ServicePass) -> scaling.ScalingState | None:
        """Start the service at minReplicas (if spec.replicas is unset) and apply its ScaledObject (paused while
        no revision serves); or delete a ScaledObject it no longer wants."""
        owner, namespace, spec, previous = service.owner, service.namespace, service.spec, service.previous
        serving = service.deployment is not None
        if spec.autoscaling is None:
            # The condition says a ScaledObject may exist; without it there is nothing to ask the API server.
            if any(c.type == ConditionType.AUTOSCALING for c in previous.conditions):
                try:
                    self.kube.delete(SCALED_OBJECTS, namespace, owner.name)
                except ApiError as error:
                    if error.status != FORBIDDEN:
                        raise
                    # The condition goes with this pass, so nothing asks again: say what is left behind.
                    log.warning(
                        "%s/%s: may not delete its ScaledObject (chart without autoscaling.enabled); delete it by hand",
                        namespace,
                        owner.name,
                    )
            return None
        if self.prometheus is None:
            return scaling.ScalingState(
                problem=(
                    "the operator has no Prometheus address: install the chart with autoscaling.enabled=true "
                    "and autoscaling.prometheus.address"
                )
            )
        predicted = predict_model_start(spec.model.uri)
        desired = scaling.scaled_object(
            owner,
            namespace,
            spec.autoscaling,
            self.prometheus,
            paused=not serving,
            start_s=predicted.total_s if predicted else 0.0,
        )
        may_not = scaling.ScalingState(
            problem=(
                "the operator may not scale services or manage ScaledObjects: "
                "install the chart with autoscaling.enabled=true"
            )
        )
        if spec.replicas is None:
            # The scale subresource cannot be read without spec.replicas, and KEDA reads it first: the
            # service starts at minReplicas, written where a scaler writes.
            scale = {"spec": {"replicas": spec.desired_replicas}}
            try:
                self.kube.merge_patch(SERVICES_NIS, namespace, owner.name, scale, subresource="scale")
            except ApiError as error:
                if error.status == FORBIDDEN:
                    return may_not
                raise
        try:
            self.kube.apply(desired)
        except ApiError as error:
            # Here, unlike from the scale patch (a deleted service), a 404 means the kind is unknown.
            if error.status == NOT_FOUND:
                return scaling.ScalingState(problem="KEDA is not installed: the cluster serves no keda.sh ScaledObject")
            if error.status == FORBIDDEN:
                return may_not
            raise
        return scaling.ScalingState(paused=not serving)
