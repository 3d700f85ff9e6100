"""Neuron health, pure: which serving pods a Neuron fault takes out of service, when they may go, and
what the service's ``Degraded`` condition says.

The signals:

- a device fault the engine reported: a serving container's termination message (its current or its last
  state) names a Neuron runtime status that marks the device suspect (``neuronfleet.contract.faults``);
- a fault the node carries: the Neuron node problem detector's ``NeuronHealth=True`` (reasons such as
  ``NeuronHasError_DMA_ERROR``), the EKS node monitoring agent's ``AcceleratedHardwareReady=False``.

The reaction: a faulty serving pod is quarantined, relabeled out of its Deployment, Service and
InferencePool in one write, so the ReplicaSet surges its replacement while it stays: at once for a device
fault (its engine has stopped), one Ready pod at a time for a node's fault (its engines still serve). The
template's anti-affinity keeps replacements off a quarantined pod's node: strictly for a node fault, by
preference for a device fault (one device of many; healing in place beats staying short). A quarantined pod goes once
the fleet is whole again, or once its replacement cannot be placed while it holds its devices; a pod whose
node still carries a fault stays, holding new replicas off that node until the condition clears.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from neuronfleet.contract.faults import DEVICE_FAULT_PREFIX, parse_termination_message, status_in_text
from neuronfleet.contract.names import ANNOTATION_FAULT, LABEL_QUARANTINED, LABEL_SERVICE
from neuronfleet.operator import api
from neuronfleet.operator.policy.conditions import ConditionType, Reason, condition

Obj = dict[str, Any]

#: Node conditions that report a Neuron fault, with the status that means "faulty".
NODE_FAULT_CONDITIONS = {"NeuronHealth": "True", "AcceleratedHardwareReady": "False"}
#: How many quarantined pods a condition's message names.
NAMED_IN_MESSAGE = 3


class FaultKind(StrEnum):
    """Where a fault was seen: the quarantine label's value."""

    DEVICE = "device"
    NODE = "node"


@dataclass(frozen=True)
class Fault:
    """A Neuron fault: where it was seen, its reason (a runtime status or a condition's reason) and detail."""

    kind: FaultKind
    reason: str
    message: str

    def describe(self) -> str:
        """``reason: message`` (the message alone when it starts with the reason), as the quarantined pod's
        annotation and the condition tell it."""
        if not self.message:
            return self.reason
        return self.message if self.message.startswith(self.reason) else f"{self.reason}: {self.message}"


def node_fault(node: Obj) -> Fault | None:
    """The Neuron fault a node's conditions report, or None."""
    for c in node.get("status", {}).get("conditions") or []:
        if NODE_FAULT_CONDITIONS.get(c.get("type")) == c.get("status"):
            reason = c.get("reason") or c["type"]
            return Fault(FaultKind.NODE, reason, (c.get("message") or "").strip())
    return None


def device_fault(pod: Obj) -> Fault | None:
    """The device fault a pod's containers reported as they stopped (now or at their last stop), or None."""
    for container in pod.get("status", {}).get("containerStatuses") or []:
        for state in (container.get("state"), container.get("lastState")):
            message = (((state or {}).get("terminated") or {}).get("message") or "").strip()
            status = parse_termination_message(message)
            if status is not None:
                # The engine's own line, or the log tail's last line naming the status.
                lines = message.splitlines()
                line = next((text for text in reversed(lines) if status_in_text(text) == status), lines[-1])
                return Fault(FaultKind.DEVICE, status.name, line.strip().removeprefix(DEVICE_FAULT_PREFIX))
    return None


@dataclass(frozen=True)
class QuarantinedPod:
    """A serving pod out of service for a fault."""

    name: str
    node: str | None
    fault: Fault

    def describe(self) -> str:
        """``pod P on node N: reason: message``."""
        return f"pod {self.name} on node {self.node or '(none)'}: {self.fault.describe()}"

    @classmethod
    def of(cls, pod: Obj) -> QuarantinedPod:
        """A pod the operator quarantined, from its label and annotation."""
        meta = pod["metadata"]
        reason, _, message = (meta.get("annotations") or {}).get(ANNOTATION_FAULT, "").partition(": ")
        kind = FaultKind(meta["labels"][LABEL_QUARANTINED])
        return cls(meta["name"], pod.get("spec", {}).get("nodeName"), Fault(kind, reason or kind, message))


def quarantine_patch(fault: Fault, owner_reference: Obj) -> Obj:
    """The merge patch that quarantines a pod: out of its service's selectors, owned by the service now."""
    return {
        "metadata": {
            "labels": {LABEL_SERVICE: None, LABEL_QUARANTINED: str(fault.kind)},
            "annotations": {ANNOTATION_FAULT: fault.describe()},
            # Its ReplicaSet lets go of it; the service's garbage collection still takes it.
            "ownerReferences": [owner_reference],
        }
    }


@dataclass(frozen=True)
class HealthPlan:
    """What to do about a service's faulty pods, and what its ``Degraded`` condition says."""

    #: Serving pods to quarantine now.
    quarantine: tuple[QuarantinedPod, ...]
    #: Quarantined pods to delete now.
    release: tuple[str, ...]
    #: Quarantined pods that stay, the new ones included.
    kept: tuple[QuarantinedPod, ...]
    #: Ready serving pods (the quarantined ones not counted), and how many the service asks for.
    ready: int
    desired: int

    @property
    def whole(self) -> bool:
        """The fleet has its ready replicas back."""
        return self.ready >= self.desired


def _deleting(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def is_ready(pod: Obj) -> bool:
    """Whether a pod's Ready condition is True."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions") or []
    )


def assess(
    service: str,
    pods: Iterable[Obj],
    node_faults: Mapping[str, Fault],
    desired_replicas: int,
    *,
    unplaceable: bool,
) -> HealthPlan:
    """Quarantine the faulty serving pods of ``service`` among ``pods`` (its serving and quarantined pods); release
    the quarantined ones no longer needed.

    ``unplaceable``: a serving pod cannot be scheduled, so a quarantined pod's devices may be what it needs.
    """
    live = [pod for pod in pods if not _deleting(pod)]
    serving = [pod for pod in live if pod["metadata"].get("labels", {}).get(LABEL_SERVICE) == service]
    # A device fault stopped its engine: out at once. A node's fault leaves its engines serving: a Ready one goes
    # only while the fleet is whole, one a pass, so a detector that flags every node cannot empty the Service.
    devices = {pod["metadata"]["name"]: fault for pod in serving if (fault := device_fault(pod)) is not None}
    ready = sum(1 for pod in serving if pod["metadata"]["name"] not in devices and is_ready(pod))
    quarantine: list[QuarantinedPod] = []
    for pod in serving:
        name, node = pod["metadata"]["name"], pod.get("spec", {}).get("nodeName")
        fault = devices.get(name) or (node_faults.get(node) if node else None)
        if fault is None:
            continue
        if fault.kind == FaultKind.NODE and is_ready(pod):
            if ready < desired_replicas or any(q.fault.kind == FaultKind.NODE for q in quarantine):
                continue
            ready -= 1
        quarantine.append(QuarantinedPod(name, node, fault))
    whole = ready >= desired_replicas
    release, kept = [], list(quarantine)
    for pod in live:
        if LABEL_QUARANTINED not in pod["metadata"].get("labels", {}):
            continue
        held = QuarantinedPod.of(pod)
        if (whole or unplaceable) and (held.node is None or held.node not in node_faults):
            release.append(held.name)
        else:
            kept.append(held)
    return HealthPlan(tuple(quarantine), tuple(sorted(release)), tuple(kept), ready, desired_replicas)


def _named(pods: Sequence[QuarantinedPod]) -> str:
    named = "; ".join(p.describe() for p in pods[:NAMED_IN_MESSAGE])
    more = len(pods) - NAMED_IN_MESSAGE
    return f"{named}; and {more} more" if more > 0 else named


def degraded_condition(plan: HealthPlan, generation: int, at: datetime.datetime) -> api.Condition:
    """``Degraded``: True while quarantined pods leave the fleet short; False once it is whole, naming the faulty
    nodes it still avoids."""
    kept = sorted(plan.kept, key=lambda p: (p.fault.kind != FaultKind.DEVICE, p.name))
    if kept and not plan.whole:
        reason = Reason.NEURON_DEVICE_FAULT if kept[0].fault.kind == FaultKind.DEVICE else Reason.NEURON_NODE_FAULT
        short = f"{plan.ready}/{plan.desired} replicas ready"
        message = f"{_named(kept)}; out of service, a replacement is starting ({short})"
        return condition(ConditionType.DEGRADED, True, reason, message, generation, at)
    avoided = [p for p in kept if p.fault.kind == FaultKind.NODE]
    if avoided:
        message = f"{_named(avoided)}; replaced, and new replicas avoid the node until its condition clears"
        return condition(ConditionType.DEGRADED, False, Reason.FAULTY_NODE_AVOIDED, message, generation, at)
    message = "no serving pod is out of service for a Neuron fault"
    return condition(ConditionType.DEGRADED, False, Reason.HEALTHY, message, generation, at)
