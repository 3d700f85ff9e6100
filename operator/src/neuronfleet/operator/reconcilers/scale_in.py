"""Scale-in that takes the replicas whose loss costs least.

Before an autoscaled service's Deployment loses replicas, each of its serving pods is annotated with the
completions it holds as Prometheus last scraped them (``policy.scaling.deletion_costs``), so the ReplicaSet
controller removes, of the Ready pods, those holding fewest: less to drain, fewer requests waiting on a pod that
is going. A pod not Ready (one still loading) goes before any Ready one whatever its cost, and the HPA's
scale-down window outlasts a start, so a scale-in does not take a replica that is about to serve.

The annotations are written before the Deployment's replicas fall: the ReplicaSet controller reads pods from its
own watch, which in practice sees them before the replica count that reaches it through the Deployment
controller (two separate watches: not a guarantee). Ranking is best effort: without Prometheus's figures
(unreachable, or none yet) every pod is written cost 0, so the ReplicaSet falls back on its own order, and a pod
that cannot be annotated does not hold the scale-in back.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
import urllib.request

from neuronfleet.operator import api, plan
from neuronfleet.operator.cluster.kube import NOT_FOUND, PODS, ApiError, Kube
from neuronfleet.operator.policy import scaling
from neuronfleet.operator.policy.rollout import DeploymentView

log = logging.getLogger(__name__)

#: Seconds Prometheus has to answer; a scale-in waits no longer for its ranking.
QUERY_TIMEOUT_S = 2.0


def query_by_pod(address: str, query: str) -> dict[str, float]:
    """The value of each series of ``query`` at Prometheus ``address``, by its ``pod`` label."""
    url = f"{address.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(url, timeout=QUERY_TIMEOUT_S) as response:
        answer = json.load(response)
    result = answer["data"]["result"]
    return {series["metric"]["pod"]: float(series["value"][1]) for series in result if "pod" in series["metric"]}


class ScaleIn:
    """Ranks a service's serving pods for the ReplicaSet controller before its replicas fall."""

    def __init__(self, kube: Kube, prometheus: str | None) -> None:
        self.kube = kube
        #: The Prometheus the autoscaler's triggers query (``None``: autoscaling is not set up).
        self.prometheus = prometheus

    def rank(
        self, namespace: str, name: str, spec: api.NeuronInferenceServiceSpec, serving: DeploymentView | None
    ) -> None:
        """When the autoscaler asks for fewer replicas than ``serving`` runs, write each serving pod's deletion
        cost: the completions it holds."""
        scales_in = serving is not None and spec.desired_replicas < serving.replicas
        if self.prometheus is None or spec.autoscaling is None or not scales_in:
            return
        try:
            in_flight = query_by_pod(self.prometheus, scaling.in_flight_query(namespace, name))
        except (OSError, ValueError, KeyError) as error:
            # Costs of an earlier scale-in would rank this one: all 0 leaves the ReplicaSet's own order.
            log.warning("%s/%s: scale-in unranked, Prometheus gave no requests in flight: %s", namespace, name, error)
            in_flight = {}
        pods = self.kube.list(PODS, namespace, plan.serving_pod_selector(name))
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        for pod, cost in scaling.deletion_costs(live, in_flight).items():
            patch = {"metadata": {"annotations": {scaling.DELETION_COST_ANNOTATION: cost}}}
            try:
                self.kube.merge_patch(PODS, namespace, pod, patch)
            except ApiError as error:
                if error.status != NOT_FOUND:
                    log.warning("%s/%s: scale-in cost of pod %s not written: %s", namespace, name, pod, error)
