"""The service reconciler: observe a service and what it owns, decide, act, write its status.

A pass reads the service, claims the artifact its spec needs and reads its
Deployment (observe); decides the rollout on that (decide); applies the serving
objects, or only the replica count while the new artifact compiles (act); then,
on the Deployment as applied, decides what to release and what the status says,
and acts on that: the autoscaler's and the router's objects, the claims it lets go, the serving pods a
Neuron fault takes out of service (``neuronfleet.operator.policy.health``), the status.
"""

from __future__ import annotations

import functools

from pydantic import ValidationError

from neuronfleet.operator import api, plan
from neuronfleet.operator.cluster.kube import DEPLOYMENTS, PODS, SERVICES_NIS, Kube
from neuronfleet.operator.metrics import OperatorMetrics
from neuronfleet.operator.policy import canary, health, rollout, service_status
from neuronfleet.operator.policy.conditions import Event, Reason, now
from neuronfleet.operator.policy.scaling import ScalingState
from neuronfleet.operator.policy.service_status import RoutingState
from neuronfleet.operator.reconcilers.autoscaling import Autoscaler
from neuronfleet.operator.reconcilers.canary import Canaries, RoutesBy
from neuronfleet.operator.reconcilers.claims import ArtifactClaims
from neuronfleet.operator.reconcilers.common import ChildReconciler, Obj, RetryLater, ServicePass, previous_status
from neuronfleet.operator.reconcilers.devices import NeuronDevices
from neuronfleet.operator.reconcilers.locks import KeyedLocks
from neuronfleet.operator.reconcilers.node_health import NodeHealth
from neuronfleet.operator.reconcilers.routing import Router
from neuronfleet.operator.reconcilers.scale_in import ScaleIn
from neuronfleet.operator.reconcilers.status_writer import StatusWriter


def _deployment_view(body: Obj | None) -> rollout.DeploymentView | None:
    return rollout.DeploymentView.of(body, plan.CONFIG_VOLUME) if body is not None else None


#: How many artifacts a service served before keeps for a rollback, unless its spec says.
DEFAULT_ARTIFACT_HISTORY_LIMIT = 2


class ServiceReconciler:
    """Reconciles NeuronInferenceServices; safe to call from many threads."""

    def __init__(
        self,
        kube: Kube,
        status: StatusWriter,
        claims: ArtifactClaims,
        autoscaler: Autoscaler,
        router: Router,
        locks: KeyedLocks,
        metrics: OperatorMetrics,
        nodes: NodeHealth,
        *,
        artifact_history_limit: int = DEFAULT_ARTIFACT_HISTORY_LIMIT,
        devices: NeuronDevices | None = None,
        canaries: Canaries | None = None,
        scale_in: ScaleIn | None = None,
        start_time_scale: float = 1.0,
    ) -> None:
        self.kube = kube
        self.status = status
        self.claims = claims
        # The children beside the serving objects, each brought to the spec once the serving revision is decided.
        self.autoscaler: ChildReconciler[ScalingState | None] = autoscaler
        self.router: ChildReconciler[RoutingState] = router
        self.locks = locks
        self.metrics = metrics
        self.nodes = nodes
        #: For services whose spec.rollout sets none.
        self.artifact_history_limit = artifact_history_limit
        #: How Neuron replicas get devices, for services whose spec.placement says not.
        self.devices = devices or NeuronDevices("devicePlugin")
        #: The share of a Neuron replica's start that replicas on the simulated device spend.
        self.start_time_scale = start_time_scale
        self.canaries = canaries or Canaries(kube, start_time_scale=start_time_scale)
        self.scale_in = scale_in or ScaleIn(kube, None)

    def reconcile(self, namespace: str, name: str) -> None:
        """Bring one NeuronInferenceService's artifact, children and status to what its spec asks."""
        with self.locks.held(("service", namespace, name)), self.metrics.reconciling(SERVICES_NIS.kind, (RetryLater,)):
            body = self.kube.get(SERVICES_NIS, namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                self.metrics.forget(SERVICES_NIS.kind, namespace, name)
                return
            self._reconcile(body)

    def forget(self, service: Obj) -> None:
        """A deleted service's claims on artifacts, dropped now (the garbage collector would, later)."""
        meta = service["metadata"]
        with self.locks.held(("service", meta["namespace"], meta["name"])):
            # Under the lock: a reconcile that read it before the delete has written its phase by now.
            self.metrics.forget(SERVICES_NIS.kind, meta["namespace"], meta["name"])
            self.canaries.forget(meta["namespace"], meta["name"])
            # By owner uid only: a new service of the same name keeps its ConfigMaps (the GC takes the old ones).
            self.claims.release(service, frozenset(), frozenset(), deleted=True)

    def _reconcile(self, body: Obj) -> None:
        # Observe: the spec, the status last written, the artifact the spec needs, the Deployment.
        meta = body["metadata"]
        namespace, name, generation = meta["namespace"], meta["name"], int(meta.get("generation", 1))
        previous = previous_status(api.NeuronInferenceServiceStatus, body)
        try:
            spec = api.parse_service_spec(body.get("spec") or {})
        except ValidationError as error:
            reason = Reason.INVALID_BUCKETS if api.is_bucket_error(error) else Reason.INVALID_SPEC
            status, events = service_status.invalid_status(
                api.describe_errors(error), reason, generation, previous, now()
            )
            self.status.write(SERVICES_NIS, body, status, events)
            return
        owner = plan.Owner.of(body)
        artifact_body = self.claims.claim(body, plan.artifact(owner, namespace, spec))
        target = rollout.ArtifactView.of(artifact_body, spec.identity().hash())
        deployment = _deployment_view(self.kube.get(DEPLOYMENTS, namespace, name))

        # Decide the rollout (a canary of a Ready target holds the serving revision until promoted), act on it.
        serve = rollout.serve(target, deployment)
        devices = self.devices.allocation(spec)
        served = plan.ServedArtifact(target.name, target.hash, api.parse_artifact_spec(artifact_body["spec"]).compile)
        trial, applied, canary_events, split = self._canary(
            owner, namespace, spec, served, deployment, serve, previous, devices
        )
        if trial is not None and trial.phase != "Promoted":
            serve = rollout.Serve.KEEP
        self.scale_in.rank(namespace, name, spec, deployment)
        if serve is rollout.Serve.TARGET:
            serving = plan.serving_plan(owner, namespace, spec, served, devices, start_time_scale=self.start_time_scale)
            deployment = self._apply(serving)
            applied |= serving.pod_inputs
        elif serve is rollout.Serve.KEEP and deployment is not None and deployment.replicas != spec.desired_replicas:
            # The serving revision's template stays as it is until the new artifact is Ready.
            patch = {"spec": {"replicas": spec.desired_replicas}}
            deployment = _deployment_view(self.kube.merge_patch(DEPLOYMENTS, namespace, name, patch))

        # Decide what to keep on the Deployment as applied (it may have finished rolling out since the read:
        # the status must not say Ready without naming the current revision), then act on it.
        history_limit = spec.rollout.artifact_history_limit
        decision = rollout.decide(
            target,
            deployment,
            previous.current_revision,
            previous.previous_revisions,
            history_limit=self.artifact_history_limit if history_limit is None else history_limit,
        )
        service = ServicePass(owner, namespace, spec, previous, deployment, trial, split)
        scaling_state = self.autoscaler.reconcile(service)
        routing_state = self.router.reconcile(service)
        if decision.keep is not None:
            self.claims.release(
                body, decision.keep, applied | decision.keep_pod_inputs, claim_templates=devices == "dra"
            )
        # Its serving pods and those quarantined from it.
        pods = self.kube.list(PODS, namespace, plan.serving_pod_selector(name)) if deployment is not None else []
        unschedulable = service_status.unschedulable_messages(pods)
        healing = None
        heal_events: list[Event] = []
        if deployment is not None:
            # A canary's pods serve beside the stable ones: counted with them, they must be wanted with them too.
            desired = spec.desired_replicas + canary.replicas_in_play(trial)
            healing = health.assess(name, pods, self.nodes.faults(), desired, unplaceable=bool(unschedulable))
            heal_events = self._heal(owner, namespace, healing)
        given = service_status.ServiceStatusInput(
            name=name,
            generation=generation,
            spec=spec,
            target=target,
            deployment=deployment,
            unschedulable=unschedulable,
            decision=decision,
            autoscaling_state=scaling_state,
            routing_state=routing_state,
            health=healing,
            canary=trial,
        )
        status, events = service_status.service_status(given, previous, now())
        self.status.write(SERVICES_NIS, body, status, [*heal_events, *canary_events, *events])

    def _canary(
        self,
        owner: plan.Owner,
        namespace: str,
        spec: api.NeuronInferenceServiceSpec,
        served: plan.ServedArtifact,
        deployment: rollout.DeploymentView | None,
        serve: rollout.Serve,
        previous: api.NeuronInferenceServiceStatus,
        devices: api.DeviceAllocation,
    ) -> tuple[api.CanaryStatus | None, frozenset[str], list[Event], plan.RevisionSplit | None]:
        """The target's canary, one step on, when a Ready target would replace another serving revision and the
        spec asks for a canary; else the last canary of the target (if any) as it ended. With it, the objects
        the canary's pods read, its events, and the split for the router."""
        on_trial = (
            serve is rollout.Serve.TARGET
            and spec.rollout.canary is not None
            and deployment is not None
            and deployment.artifact_hash not in (None, served.hash)
            and spec.desired_replicas > 0
            and (
                previous.canary is None
                or previous.canary.revision != served.hash
                or previous.canary.phase != "Promoted"
            )
        )
        routes_by = self._router_routes_by(namespace, owner.name, spec)
        if on_trial and deployment is not None:
            return self.canaries.reconcile(
                owner, namespace, spec, served, deployment, previous.canary, devices, routes_by
            )
        last = previous.canary
        # Only a service that asks for canaries, ran one, or has a router that may still send one requests, can
        # have a canary's replicas to let go.
        if spec.rollout.canary is not None or last is not None or spec.routing is not None:
            self.canaries.settle(namespace, owner.name, routes_by(None))
        # How the target's canary ended stays in the status while the spec still asks for canaries.
        ended = last if spec.rollout.canary is not None and last is not None and last.revision == served.hash else None
        return ended, frozenset(), [], None

    def _router_routes_by(
        self,
        namespace: str,
        name: str,
        spec: api.NeuronInferenceServiceSpec,
    ) -> RoutesBy:
        """Whether the service's router pods route by a split, read once: always, for a service without a router
        (the Service splits a canary's requests by replica count)."""
        if spec.routing is None:
            return lambda split: True
        return functools.partial(
            rollout.router_routes_by, self.kube.get(DEPLOYMENTS, namespace, plan.router_name(name))
        )

    def _heal(self, owner: plan.Owner, namespace: str, healing: health.HealthPlan) -> list[Event]:
        """Quarantine the faulty serving pods, delete the quarantined ones no longer needed; the events to post."""
        events = []
        for pod in healing.quarantine:
            patch = health.quarantine_patch(pod.fault, owner.reference())
            self.kube.merge_patch(PODS, namespace, pod.name, patch)
            self.metrics.quarantined.labels(str(pod.fault.kind)).inc()
            events.append(
                Event("Warning", Reason.REPLICA_QUARANTINED, f"{pod.describe()}; out of service, a replacement starts")
            )
        for name in healing.release:
            if self.kube.delete(PODS, namespace, name):
                events.append(Event("Normal", Reason.QUARANTINE_RELEASED, f"quarantined pod {name} deleted"))
        return events

    def _apply(self, serving: plan.ServingPlan) -> rollout.DeploymentView:
        """Apply the serving objects, the config before the pods that mount it; the Deployment as applied."""
        self.kube.apply(serving.configmap)
        if serving.claim_template is not None:
            self.kube.apply(serving.claim_template)
        deployment = rollout.DeploymentView.of(self.kube.apply(serving.deployment), plan.CONFIG_VOLUME)
        self.kube.apply(serving.service)
        self.kube.apply(serving.disruption_budget)
        return deployment
