"""Reading a service's or artifact's status from its plain-dict body (what the API server returns)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Obj = dict[str, Any]


def phase_of(body: Obj | None) -> str | None:
    """A service's or artifact's ``status.phase``."""
    phase = ((body or {}).get("status") or {}).get("phase")
    return str(phase) if phase is not None else None


def observed(body: Obj | None) -> bool:
    """Whether the status is about the current spec."""
    metadata = (body or {}).get("metadata") or {}
    return bool(((body or {}).get("status") or {}).get("observedGeneration") == metadata.get("generation"))


def condition(body: Obj | None, type_: str) -> Obj:
    """One condition of the status (empty if absent)."""
    for c in ((body or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def ready_at(generation: int) -> Callable[[Obj], bool]:
    """A predicate: the service is Ready, its status about ``generation``, which is the current one."""
    return lambda body: phase_of(body) == "Ready" and observed(body) and body["metadata"]["generation"] == generation
