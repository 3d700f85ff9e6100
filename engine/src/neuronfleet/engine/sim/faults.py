"""Faults injected into the simulated device at run time, shaped as the Neuron runtime reports them.

A test (or ``curl``) posts one to a simulated replica's ``/neuronfleet/sim/faults``; the API server
hands it to the engine core (vLLM's ``collective_rpc``), and the device takes it on its next step:

- ``error``: the step fails with a runtime status (an uncorrectable HBM error by default);
- ``timeout``: the step hangs for ``hang_s`` seconds of device time, then fails with ``NRT_TIMEOUT``;
- ``slow``: every step from now on takes ``factor`` times as long (a degraded device; nothing fails).
"""

from __future__ import annotations

import threading
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from neuronfleet.contract.faults import NeuronRuntimeError, RuntimeStatus, runtime_status

#: The path the simulated device's fault endpoint is served at (only with ``device: sim``).
FAULTS_PATH = "/neuronfleet/sim/faults"


class InjectedFault(BaseModel):
    """One fault for the simulated device to take on its next step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["error", "timeout", "slow"]
    status: str | int = Field(
        "NRT_EXEC_HW_ERR_HBM_UE", description="error: the runtime status the step fails with, by name or code."
    )
    hang_s: float = Field(5.0, gt=0, description="timeout: device seconds the step hangs before NRT_TIMEOUT.")
    factor: float = Field(3.0, ge=1, description="slow: how many times longer every step takes from now on.")

    @field_validator("status")
    @classmethod
    def _known_status(cls, value: str | int) -> str | int:
        runtime_status(value)
        return value


class FaultInjector:
    """The faults waiting for the device's next step, and the slowdown in force. Safe across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: InjectedFault | None = None
        self.slowdown = 1.0

    def inject(self, fault: InjectedFault) -> None:
        """Take ``fault`` on the next step (``slow`` at once, for every step after)."""
        with self._lock:
            if fault.kind == "slow":
                self.slowdown = fault.factor
            else:
                self._pending = fault

    def take(self) -> InjectedFault | None:
        """The fault the step about to run must fail with, if any (taken once)."""
        with self._lock:
            fault, self._pending = self._pending, None
        return fault


def step_failure(fault: InjectedFault, step: str) -> NeuronRuntimeError:
    """The runtime error ``fault`` makes of ``step`` (a description of what the step ran)."""
    status: RuntimeStatus = runtime_status("NRT_TIMEOUT" if fault.kind == "timeout" else fault.status)
    detail = f"{step} did not finish within {fault.hang_s:g} s" if fault.kind == "timeout" else f"{step} failed"
    return NeuronRuntimeError(status, f"{detail} (injected into the simulated device)")
