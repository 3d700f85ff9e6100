"""The Neuron faults the cluster's nodes carry now, as their watch delivers them; safe from many threads."""

from __future__ import annotations

import threading

from neuronfleet.operator.policy import health
from neuronfleet.operator.reconcilers.common import Obj


class NodeHealth:
    """Each faulty node's fault (:func:`neuronfleet.operator.policy.health.node_fault`), by node name."""

    def __init__(self) -> None:
        self._faults: dict[str, health.Fault] = {}
        self._lock = threading.Lock()

    def observe(self, node: Obj) -> bool:
        """Take in a node as watched; whether its fault changed (appeared, cleared or another)."""
        return self._set(node["metadata"]["name"], health.node_fault(node))

    def forget(self, name: str) -> bool:
        """A deleted node; whether it was faulty."""
        return self._set(name, None)

    def faults(self) -> dict[str, health.Fault]:
        """The faulty nodes now."""
        with self._lock:
            return dict(self._faults)

    def _set(self, name: str, fault: health.Fault | None) -> bool:
        with self._lock:
            before = self._faults.pop(name, None)
            if fault is not None:
                self._faults[name] = fault
            return before != fault
