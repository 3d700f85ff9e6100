"""Neuron runtime statuses: which stop a replica, which mean its device failed, and the message it leaves."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from neuronfleet.contract.faults import (
    DEVICE_FAULT_PREFIX,
    RUNTIME_ERROR_PREFIX,
    NeuronRuntimeError,
    parse_termination_message,
    runtime_status,
    status_in_text,
    termination_message,
)
from neuronfleet.engine.sim.faults import InjectedFault


def test_hardware_errors_are_device_faults_and_a_timeout_is_not() -> None:
    assert {code for code in range(1200, 1207) if runtime_status(code).device_fault} == {
        1200,
        1201,
        1202,
        1203,
        1205,
        1206,
    }
    assert not runtime_status("NRT_EXEC_SW_NQ_OVERFLOW").device_fault
    assert not runtime_status("NRT_TIMEOUT").device_fault
    assert runtime_status("NRT_EXEC_HW_ERR_DMA_ABORT") == runtime_status(1203)


def test_a_status_that_does_not_stop_a_replica_is_refused_with_those_that_do() -> None:
    with pytest.raises(ValueError, match=r"'NRT_EXEC_BAD_INPUT' is not .* NRT_EXEC_HW_ERR_HBM_UE \(1201\)"):
        runtime_status("NRT_EXEC_BAD_INPUT")
    with pytest.raises(ValidationError, match="1002"):
        InjectedFault(kind="error", status=1002)


def test_the_termination_message_says_whether_to_replace_the_replica_and_reads_back() -> None:
    fault = NeuronRuntimeError(runtime_status(1201), "a decode step failed")
    message = termination_message(fault)
    assert message == (
        f"{DEVICE_FAULT_PREFIX}NRT_EXEC_HW_ERR_HBM_UE (1201): an uncorrectable HBM error; a decode step failed"
    )
    assert parse_termination_message(message) == runtime_status(1201)
    timeout = termination_message(NeuronRuntimeError(runtime_status("NRT_TIMEOUT"), "hung"))
    assert timeout.startswith(RUNTIME_ERROR_PREFIX)
    assert parse_termination_message(timeout) is None


def test_a_log_tail_naming_a_device_fault_reads_as_one_and_any_other_crash_does_not() -> None:
    tail = "ERROR 12-04 EngineCore encountered a fatal error.\nRuntimeError: nrt_execute failed, status=1202\n"
    assert parse_termination_message(tail) == runtime_status("NRT_EXEC_HW_ERR_NC_UE")
    assert status_in_text("execution failed: NRT_EXEC_HW_ERR_DMA_ABORT") == runtime_status(1203)
    assert parse_termination_message("Traceback ...\nKeyError: 'model'\n") is None
    # A status that does not stop a replica is not read as one, nor is a number that is no status.
    assert status_in_text("NRT_EXEC_BAD_INPUT then status=7") is None
