"""A service's canary: its Deployment, and the engines' metrics its analysis reads.

Observe the canary Deployment and every serving pod's ``/metrics`` (the stable revision's and the canary's,
each at its pod IP); decide with :mod:`neuronfleet.operator.policy.canary`; act: apply the canary's replicas, or
delete them once it was aborted or its revision serves from the service's own Deployment.

Behind a router, the canary's replicas take its step's share only once every router pod routes by the
step's split, so a step's pause starts then; and they go only once no router pod sends them anything.

What the stable pods had counted when the canary began is held here, in memory: an operator that restarts
(or a new leader) starts the stable side's count again, while the canary's pods, all new, count from their
start either way.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable

from neuronfleet.contract.names import HTTP_PORT, LABEL_ARTIFACT, LABEL_QUARANTINED, LABEL_TRACK, TRACK_CANARY
from neuronfleet.operator import api, plan
from neuronfleet.operator.cluster.kube import DEPLOYMENTS, PODS, Kube
from neuronfleet.operator.policy import canary, health, rollout
from neuronfleet.operator.policy.conditions import Event, now
from neuronfleet.operator.reconcilers.common import Obj

log = logging.getLogger(__name__)

#: Seconds a serving pod has to answer ``/metrics``; one that does not is left out of this analysis.
SCRAPE_TIMEOUT_S = 2.0

#: Reads a pod's ``/metrics`` text at an address (host:port); raises ``OSError`` when it cannot.
Scrape = Callable[[str], str]
#: Whether every router pod routes by a split (``None``: with no canary); always, for a service without a router.
RoutesBy = Callable[[plan.RevisionSplit | None], bool]


def scrape_http(address: str) -> str:
    """``/metrics`` of the engine at ``address``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=SCRAPE_TIMEOUT_S) as response:
        text: str = response.read().decode()
    return text


class Canaries:
    """Runs the canaries of services with ``spec.rollout.canary``; the caller holds the service's lock."""

    def __init__(self, kube: Kube, scrape: Scrape = scrape_http, *, start_time_scale: float = 1.0) -> None:
        self.kube = kube
        self.scrape = scrape
        #: The share of a Neuron replica's start that simulated replicas spend (the operator's setting).
        self.start_time_scale = start_time_scale
        #: By (namespace, service, revision on trial): each stable pod's figures when the canary began.
        self._stable_start: dict[tuple[str, str, str], dict[str, canary.Figures]] = {}

    def reconcile(
        self,
        owner: plan.Owner,
        namespace: str,
        spec: api.NeuronInferenceServiceSpec,
        served: plan.ServedArtifact,
        stable: rollout.DeploymentView,
        previous: api.CanaryStatus | None,
        devices: api.DeviceAllocation,
        routes_by: RoutesBy,
    ) -> tuple[api.CanaryStatus, frozenset[str], list[Event], plan.RevisionSplit | None]:
        """The canary of ``served`` beside the ``stable`` revision, one step on: its state, the objects its pods
        read (to keep), the events of its decisions, and the split for its router (with ``spec.routing``)."""
        trial = spec.rollout.canary
        assert trial is not None
        state = previous if previous is not None and previous.revision == served.hash else None
        if state is None:
            state = canary.start(trial, served.hash, spec.desired_replicas)
        key = (namespace, owner.name, served.hash)
        if state.phase != "Progressing":
            unrouted = routes_by(None)
            self.settle(namespace, owner.name, unrouted)
            return state, self._inputs_kept(owner, namespace, spec, served, devices, unrouted), [], None
        # Observe: the canary's Deployment, and the figures of both revisions' ready pods.
        body = self.kube.get(DEPLOYMENTS, namespace, plan.canary_name(owner.name))
        view = rollout.DeploymentView.of(body, plan.CONFIG_VOLUME) if body is not None else None
        # Its Ready replicas once rolled out to this revision (none before): a step wants them all.
        replicas_ready = view.ready if view is not None and view.artifact_hash == served.hash and view.rolled_out else 0
        routed = spec.routing is not None
        ready = replicas_ready >= state.canary_replicas and routes_by(
            canary.revision_split(stable.artifact_hash, state.weight, routed)
        )
        analysis = self._analyse(namespace, owner.name, trial.analysis, served.hash, stable.artifact_hash, key)
        # Decide.
        given = canary.CanaryInput(trial, state, spec.desired_replicas, ready, analysis, now())
        state, events = canary.advance(given)
        # Act.
        if state.phase == "Aborted":
            self._stable_start.pop(key, None)
            # Behind a router, its replicas go once the router sends them nothing (its next passes).
            unrouted = routes_by(None)
            if unrouted:
                self.remove(namespace, owner.name)
            return state, self._inputs_kept(owner, namespace, spec, served, devices, unrouted), events, None
        planned = plan.canary_plan(
            owner, namespace, spec, served, state.canary_replicas, devices, start_time_scale=self.start_time_scale
        )
        self.kube.apply(planned.configmap)
        if planned.claim_template is not None:
            self.kube.apply(planned.claim_template)
        self.kube.apply(planned.deployment)
        # The routers move to a step's weight only once its replicas are all Ready (as observed before this pass).
        weight = canary.routed_weight(trial, state, replicas_ready >= state.canary_replicas)
        return state, planned.pod_inputs, events, canary.revision_split(stable.artifact_hash, weight, routed)

    @staticmethod
    def _inputs_kept(
        owner: plan.Owner,
        namespace: str,
        spec: api.NeuronInferenceServiceSpec,
        served: plan.ServedArtifact,
        devices: api.DeviceAllocation,
        removed: bool,
    ) -> frozenset[str]:
        """What the canary's pods read, while they are kept for the routers to let go of them; nothing once removed."""
        return frozenset() if removed else plan.canary_plan(owner, namespace, spec, served, 0, devices).pod_inputs

    def remove(self, namespace: str, service: str) -> None:
        """Delete the canary's replicas (they drain as any serving pod does)."""
        self.kube.delete(DEPLOYMENTS, namespace, plan.canary_name(service))

    def settle(self, namespace: str, service: str, unrouted: bool = True) -> None:
        """With no canary in play (promoted, aborted, or no longer asked for): its replicas go, if any run and
        no router sends them requests (``unrouted``), and so do the stable figures held for it (the same
        revision tried again later counts afresh). A promoted canary's go as the service's Deployment starts
        rolling its revision out, so a fleet sized for the canary and one surge replica holds the rollout too."""
        self.forget(namespace, service)
        if unrouted and self.kube.get(DEPLOYMENTS, namespace, plan.canary_name(service)) is not None:
            self.remove(namespace, service)

    def _analyse(
        self,
        namespace: str,
        service: str,
        limits: api.CanaryAnalysis,
        revision: str,
        stable_revision: str | None,
        key: tuple[str, str, str],
    ) -> canary.Analysis | None:
        pods = self.kube.list(PODS, namespace, plan.serving_pod_selector(service))
        serving = [
            p for p in pods if health.is_ready(p) and LABEL_QUARANTINED not in (p["metadata"].get("labels") or {})
        ]
        ours = [p for p in serving if (p["metadata"].get("labels") or {}).get(LABEL_TRACK) == TRACK_CANARY]
        theirs = [
            p
            for p in serving
            if LABEL_TRACK not in (labels := p["metadata"].get("labels") or {})
            and labels.get(LABEL_ARTIFACT) == stable_revision
        ]
        if not ours:
            return None
        canary_now, stable_now = self._figures(ours), self._figures(theirs)
        start = self._stable_start.setdefault(key, stable_now)
        return canary.analyse(limits, canary.since({}, canary_now), canary.since(start, stable_now))

    def _figures(self, pods: list[Obj]) -> dict[str, canary.Figures]:
        found = {}
        for pod in pods:
            address = (pod.get("status") or {}).get("podIP")
            if not address:
                continue
            try:
                found[pod["metadata"]["name"]] = canary.parse_figures(self.scrape(f"{address}:{HTTP_PORT}"))
            except (OSError, ValueError) as error:
                log.info("no metrics from pod %s this pass: %s", pod["metadata"]["name"], error)
        return found

    def forget(self, namespace: str, service: str) -> None:
        """Drop what is held for a service's canaries."""
        for key in [k for k in self._stable_start if k[:2] == (namespace, service)]:
            del self._stable_start[key]
