"""What every reconciler shares: the retry signal, the event sink and the last status written."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import ValidationError

from neuronfleet.operator import api, plan
from neuronfleet.operator.policy.conditions import Event
from neuronfleet.operator.policy.rollout import DeploymentView

Obj = dict[str, Any]
M = TypeVar("M", bound=api.K8sModel)
State_co = TypeVar("State_co", covariant=True)
#: Posts an event about an object (``kubectl describe``).
Emit = Callable[[Obj, Event], None]


class RetryLater(Exception):
    """The cluster is mid-change (e.g. an object is being deleted); try again."""


def previous_status(model: type[M], body: Obj) -> M:
    """The status last written, or an empty one if it is missing or unreadable."""
    try:
        return model.model_validate(body.get("status") or {})
    except ValidationError:
        return model.model_validate({})


@dataclass(frozen=True)
class ServicePass:
    """One reconcile of a service, as each of its children sees it once the serving revision is decided."""

    owner: plan.Owner
    namespace: str
    spec: api.NeuronInferenceServiceSpec
    #: The status the last pass wrote: what the children's conditions said then.
    previous: api.NeuronInferenceServiceStatus
    #: The serving Deployment as applied this pass; ``None`` while no revision serves.
    deployment: DeploymentView | None
    #: The canary on trial (or as it ended), and the split its router takes.
    trial: api.CanaryStatus | None = None
    split: plan.RevisionSplit | None = None


class ChildReconciler(Protocol[State_co]):
    """A part of a service beside its serving objects (its ScaledObject, its router): each pass applies what the
    service's spec asks of it, or deletes what it no longer does, and says what became of it for the status."""

    def reconcile(self, service: ServicePass) -> State_co:
        """Bring this part of ``service`` to its spec; what became of it."""
        ...
