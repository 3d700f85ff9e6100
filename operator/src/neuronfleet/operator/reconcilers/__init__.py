"""Level-triggered reconciliation, one reconciler per kind: the only I/O besides kopf.

Each reconciler starts from what is in the cluster now, not from the event that
woke it, so any trigger (a spec change, a child's event, a restart, the periodic
resync) converges to the same state, and running one twice does nothing the
second time: children are server-side applied or created under deterministic
names, and status is written only when it changed. Each pass observes, decides
(the pure ``neuronfleet.operator.policy``), then acts. In the operator they observe through
``neuronfleet.operator.cluster.cache.CachedKube``: what the watches delivered, no GET or LIST.

- ``service``: a NeuronInferenceService's artifact, serving objects, faulty serving pods and status.
- ``artifact``: a NeuronCompiledArtifact's ConfigMap, compile Job and status.
- ``claims``: a service's claims on artifacts and its engine ConfigMaps, and their release.
- ``autoscaling``: a service's starting scale and KEDA ScaledObject; ``routing``: its InferencePool and, with
  spec.routing, its Endpoint Picker and Envoy. Both are children of a service (``common.ChildReconciler``).
- ``canary``: a service's canary run, beside its serving revision.
- ``node_health``: the Neuron faults the nodes carry, as their watch delivers them.
- ``status_writer``: the one status writer; ``locks``: one reconcile per object at a time.
- ``manager``: what the handlers drive: the reconcilers, wired, and the resync.
"""

from neuronfleet.operator.reconcilers.common import RetryLater
from neuronfleet.operator.reconcilers.locks import KeyedLocks
from neuronfleet.operator.reconcilers.manager import Manager

__all__ = ["KeyedLocks", "Manager", "RetryLater"]
