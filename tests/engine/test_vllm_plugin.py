"""The general plugin every vLLM process of the engine loads: logs, forked children, metrics."""

from __future__ import annotations

import logging
import os
import signal
import socket
from collections.abc import Iterator

import pytest

from neuronfleet.engine.serving.vllm_plugin import forget_parent_wakeup_fd, route_logs

pytestmark = pytest.mark.vllm_matrix


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def loggers() -> Iterator[tuple[logging.Logger, logging.Logger]]:
    """The ``vllm`` and ``neuronfleet`` loggers, put back as they were afterwards."""
    vllm_logger, ours = logging.getLogger("vllm"), logging.getLogger("neuronfleet")
    saved = [(log, log.handlers[:], log.level, log.propagate, log.parent) for log in (vllm_logger, ours)]
    yield vllm_logger, ours
    for log, handlers, level, propagate, parent in saved:
        log.handlers[:] = handlers
        log.setLevel(level)
        log.propagate = propagate
        log.parent = parent


def test_logs_go_through_the_handlers_vllm_configures_after_loading_plugins(
    loggers: tuple[logging.Logger, logging.Logger],
) -> None:
    vllm_logger, _ = loggers
    route_logs()
    # vLLM configures its logging once it has loaded the plugins, and again in the engine core.
    for level in (logging.INFO, logging.WARNING):
        collect = Collect()
        vllm_logger.handlers[:] = [collect]
        vllm_logger.setLevel(level)
        vllm_logger.propagate = False
        executor = logging.getLogger("neuronfleet.engine.sim.executor")
        executor.debug("hidden")
        executor.info("loaded")
        executor.warning("refused")
        assert collect.messages == (["loaded", "refused"] if level == logging.INFO else ["refused"])


def test_a_forked_child_no_longer_wakes_the_parent_event_loop_with_its_signals() -> None:
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    theirs.setblocking(False)
    previous = signal.set_wakeup_fd(ours.fileno())
    try:
        pid = os.fork()
        if pid == 0:
            forget_parent_wakeup_fd()
            signal.signal(signal.SIGUSR1, lambda *_: None)
            os.kill(os.getpid(), signal.SIGUSR1)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # Nothing reached the parent's wake-up socket.
        with pytest.raises(BlockingIOError):
            theirs.recv(1)
    finally:
        signal.set_wakeup_fd(previous)
        ours.close()
        theirs.close()
