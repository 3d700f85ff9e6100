"""vLLM general plugin: what every vLLM process of a neuronfleet engine sets up.

Registered under vLLM's ``vllm.general_plugins`` entry point group, which vLLM
loads in the API server and in the engine core. It sends neuronfleet's log
records to vLLM's log handler (vLLM configures only its own loggers), keeps a
forked engine core's signals from the API server's event loop, and subscribes the
Prometheus metrics to the Neuron scheduler's steps. All are idempotent: vLLM
may load plugins more than once per process.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal


def route_logs() -> None:
    """Log ``neuronfleet.*`` records as vLLM's own: through vLLM's handlers, at vLLM's level.

    The ``neuronfleet`` logger hangs below vLLM's instead of copying its handlers: vLLM
    configures its logging only after it loads plugins, and again in the engine core, so
    copied handlers would be none (the API server) or those of an earlier configuration (an
    engine core forked from the API server, which loads no plugins again).
    """
    ours = logging.getLogger("neuronfleet")
    ours.parent = logging.getLogger("vllm")
    ours.setLevel(logging.NOTSET)
    ours.propagate = True


def forget_parent_wakeup_fd() -> None:
    """In a forked child: stop writing signals to the parent's event loop.

    The API server's event loop has Python write every signal's number to its socket
    (``signal.set_wakeup_fd``), and a forked child inherits that setting: each signal the
    engine core got would also wake the API server's loop as if it were its own. A spawned
    engine core starts without one; so does a forked one with this.
    """
    # Only the main thread may set it (in a forked child, the thread that forked is the main one).
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)


@functools.cache
def reset_forked_children() -> None:
    """Run :func:`forget_parent_wakeup_fd` in every child this process forks (the simulated device's engine core)."""
    os.register_at_fork(after_in_child=forget_parent_wakeup_fd)


def register() -> None:
    """vLLM's general plugin hook."""
    route_logs()
    reset_forked_children()
    # Imported here: vLLM loads plugins early, and the scheduler imports vLLM's internals.
    from neuronfleet.engine.scheduler import metrics

    metrics.subscribe()
