"""NeuronInferenceServices in a test namespace: create, patch, read and wait, failing with their status.

Waiting is delegated to a ``wait_for(observe, until, *, timeout, what, show)`` callable (the
``wait_for`` fixture), so every wait is bounded and reports what it saw last.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from neuronfleet.contract.names import LABEL_SERVICE
from neuronfleet.devcluster.addons.metrics import Samples
from neuronfleet.devcluster.controlplane.status import observed, phase_of, ready_at
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator.api import API_VERSION
from neuronfleet.operator.cluster.kube import ARTIFACTS, PODS, SERVICES_NIS, Kube

Obj = dict[str, Any]


def summary(body: Obj) -> Obj:
    """The telling part of a service, for failure messages."""
    status = body.get("status") or {}
    return {
        "generation": body["metadata"].get("generation"),
        "observed": status.get("observedGeneration"),
        "phase": status.get("phase"),
        "conditions": [(c["type"], c["status"], c["reason"], c.get("message")) for c in status.get("conditions", [])],
        "replicas": (status.get("replicas"), status.get("readyReplicas"), status.get("updatedReplicas")),
        "revisions": (status.get("currentRevision"), status.get("targetRevision")),
    }


def serving_pods(kube: Kube, namespace: str, name: str) -> list[Obj]:
    """A service's serving pods (in its selectors), those being deleted left out."""
    pods = kube.list(PODS, namespace, f"{LABEL_SERVICE}={name}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def is_ready(pod: Obj) -> bool:
    """Whether a pod is Ready."""
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def sample(samples: Samples, name: str, **labels: str) -> float:
    """One sample of the operator's metrics; 0 when absent."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Services:
    """NeuronInferenceServices in one namespace: create, patch, read and wait."""

    def __init__(self, kube: Kube, namespace: str, wait_for: WaitFor) -> None:
        self.kube = kube
        self.namespace = namespace
        self.wait_for = wait_for

    def create(self, name: str, spec: Obj) -> Obj:
        """Create a service."""
        return self.kube.create(
            {
                "apiVersion": API_VERSION,
                "kind": SERVICES_NIS.kind,
                "metadata": {"name": name, "namespace": self.namespace},
                "spec": spec,
            }
        )

    def get(self, name: str) -> Obj:
        """Read a service that must exist."""
        body = self.kube.get(SERVICES_NIS, self.namespace, name)
        if body is None:
            raise LookupError(f"service {self.namespace}/{name} does not exist")
        return body

    def patch_spec(self, name: str, spec: Obj) -> Obj:
        """Merge-patch a service's spec."""
        return self.kube.merge_patch(SERVICES_NIS, self.namespace, name, {"spec": spec})

    def artifacts(self) -> list[Obj]:
        """The namespace's compiled artifacts."""
        return self.kube.list(ARTIFACTS, self.namespace)

    def wait(self, name: str, until: Callable[[Obj], bool], what: str, timeout: float = 60) -> Obj:
        """Poll the service until ``until`` holds."""
        return self.wait_for(lambda: self.get(name), until, timeout=timeout, what=f"{name}: {what}", show=summary)

    def wait_phase(self, name: str, phase: str, timeout: float = 60) -> Obj:
        """Wait for a phase, reached for the current spec."""
        return self.wait(name, lambda b: phase_of(b) == phase and observed(b), f"phase {phase}", timeout)

    def wait_ready(self, name: str, generation: int = 1, timeout: float = 60) -> Obj:
        """Wait until the service is Ready at ``generation``."""
        return self.wait(name, ready_at(generation), f"Ready at generation {generation}", timeout)
