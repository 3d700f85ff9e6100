"""Neuron runtime faults: which runtime status codes mean the device failed, and how a replica says so.

The Neuron runtime (``nrt_status.h``, aws-neuron-sdk) answers every execution with a status. Some
mean the device itself failed (an uncorrectable HBM or NeuronCore error, an aborted DMA): the step's
results are invalid, the runtime must be reinitialised, and the same device may fail again. Others
mean the step failed for a reason that a restart on the same device clears (a hung execution that
timed out, a queue overflow). The engine stops on both, as vLLM does when a step raises; what differs
is what the fleet should do next, so a stopping replica writes one line saying which, in the file
Kubernetes reads as its container's termination message. The operator reads that line back
(:func:`parse_termination_message`). This module depends on the standard library alone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: Where a container writes the message Kubernetes keeps after it stops (``terminationMessagePath``).
TERMINATION_LOG = "/dev/termination-log"
#: Set, the engine writes its termination message there instead (tests, or a custom path).
TERMINATION_LOG_ENV = "NEURONFLEET_TERMINATION_LOG"


@dataclass(frozen=True)
class RuntimeStatus:
    """One Neuron runtime status code, and what it means for the replica that got it."""

    code: int
    name: str
    #: The device is suspect: the replica should be replaced on another node, not restarted in place.
    device_fault: bool
    meaning: str


#: The statuses that stop a replica (``nrt_status.h``). Input errors (``NRT_EXEC_BAD_INPUT``) and busy
#: or full queues are the caller's to handle and never reach here.
RUNTIME_STATUSES = {
    status.code: status
    for status in (
        RuntimeStatus(5, "NRT_TIMEOUT", False, "an execution timed out: the NeuronCore may be hung"),
        RuntimeStatus(6, "NRT_HW_ERROR", True, "a hardware error"),
        RuntimeStatus(101, "NRT_EXEC_UNIT_UNRECOVERABLE", True, "an execution unit cannot recover"),
        RuntimeStatus(1200, "NRT_EXEC_HW_ERR_COLLECTIVES", True, "a hardware error in collective communication"),
        RuntimeStatus(1201, "NRT_EXEC_HW_ERR_HBM_UE", True, "an uncorrectable HBM error"),
        RuntimeStatus(1202, "NRT_EXEC_HW_ERR_NC_UE", True, "an uncorrectable NeuronCore (SRAM) error"),
        RuntimeStatus(1203, "NRT_EXEC_HW_ERR_DMA_ABORT", True, "a DMA engine aborted"),
        RuntimeStatus(1204, "NRT_EXEC_SW_NQ_OVERFLOW", False, "a notification queue overflowed: results incomplete"),
        RuntimeStatus(1205, "NRT_EXEC_HW_ERR_REPAIRABLE_HBM_UE", True, "an HBM error the node's repair can fix"),
        RuntimeStatus(1206, "NRT_NETWORK_PROXY_FAILURE", True, "the network proxy for collectives failed"),
    )
}
_BY_NAME = {status.name: status for status in RUNTIME_STATUSES.values()}

#: How a termination message starts: a device fault, or a runtime error a restart in place clears.
DEVICE_FAULT_PREFIX = "neuron device fault: "
RUNTIME_ERROR_PREFIX = "neuron runtime error: "
_STATUS_IN_TEXT = re.compile(r"\b(NRT_[A-Z_]+)\b|\bstatus[ =:]+(\d{1,4})\b")


class NeuronRuntimeError(RuntimeError):
    """A step the Neuron runtime failed with ``status``: the engine stops."""

    def __init__(self, status: RuntimeStatus, detail: str) -> None:
        super().__init__(f"{status.name} ({status.code}): {status.meaning}; {detail}")
        self.status = status
        self.detail = detail


def runtime_status(name_or_code: str | int) -> RuntimeStatus:
    """The status named (``NRT_EXEC_HW_ERR_HBM_UE``) or numbered (1201); ValueError for any other."""
    status = RUNTIME_STATUSES.get(name_or_code) if isinstance(name_or_code, int) else _BY_NAME.get(name_or_code)
    if status is None:
        known = ", ".join(f"{s.name} ({s.code})" for s in RUNTIME_STATUSES.values())
        raise ValueError(f"{name_or_code!r} is not a Neuron runtime status that stops a replica; known: {known}")
    return status


def status_in_text(text: str) -> RuntimeStatus | None:
    """The first stopping status a log line or error names, by name or as ``status 1201``; None if none."""
    for match in _STATUS_IN_TEXT.finditer(text):
        name, code = match.groups()
        status = _BY_NAME.get(name) if name else RUNTIME_STATUSES.get(int(code))
        if status is not None:
            return status
    return None


def termination_message(error: NeuronRuntimeError) -> str:
    """The one line a replica stopped by ``error`` leaves for Kubernetes and the operator."""
    prefix = DEVICE_FAULT_PREFIX if error.status.device_fault else RUNTIME_ERROR_PREFIX
    return f"{prefix}{error}"


def parse_termination_message(message: str) -> RuntimeStatus | None:
    """The device fault a container's termination message reports, or None for anything else.

    Reads the engine's own line, and a log tail (Kubernetes' ``FallbackToLogsOnError``) naming a
    device fault status, as a Neuron host's runtime logs it.
    """
    if message.startswith(RUNTIME_ERROR_PREFIX):
        return None
    status = status_in_text(message)
    return status if status is not None and status.device_fault else None


def termination_log() -> Path | None:
    """Where this process writes its termination message: the environment's path, else Kubernetes' if present."""
    configured = os.environ.get(TERMINATION_LOG_ENV)
    if configured:
        return Path(configured)
    default = Path(TERMINATION_LOG)
    return default if default.is_file() else None


def write_termination_message(error: NeuronRuntimeError) -> str:
    """Leave ``error``'s termination message where Kubernetes reads it (when there is such a place); return it."""
    message = termination_message(error)
    path = termination_log()
    if path is not None:
        path.write_text(message + "\n")
    return message


def read_termination_message() -> str | None:
    """The termination message this container wrote, if any (the API server reads what the engine core left)."""
    path = termination_log()
    if path is None or not path.is_file():
        return None
    return path.read_text().strip() or None
