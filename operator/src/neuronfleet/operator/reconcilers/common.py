"""What every reconciler shares: the retry signal, the event sink and the last status written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from neuronfleet.operator import api
from neuronfleet.operator.status import Event

Obj = dict[str, Any]
M = TypeVar("M", bound=api.K8sModel)
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
