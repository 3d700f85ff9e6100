"""A real Kubernetes control plane on one machine, with KWOK playing fake Neuron nodes, for tests and demos."""

from neuronfleet.devcluster.cluster.local import ClusterError, LocalCluster, reap_orphans
from neuronfleet.devcluster.controlplane.fleet import DEFAULT_FLEET, InstanceShape, NodePool
from neuronfleet.devcluster.process.tools import KubeTools, ToolsMissingError
from neuronfleet.devcluster.process.waiting import WaitTimeoutError, wait_for

__all__ = [
    "DEFAULT_FLEET",
    "ClusterError",
    "InstanceShape",
    "KubeTools",
    "LocalCluster",
    "NodePool",
    "ToolsMissingError",
    "WaitTimeoutError",
    "reap_orphans",
    "wait_for",
]
