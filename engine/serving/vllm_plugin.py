"""vLLM general plugin: what every vLLM process of a neuronfleet engine sets up.

Registered under vLLM's ``vllm.general_plugins`` entry point group, which vLLM
loads in the API server and in the engine core. It sends neuronfleet's log
records to vLLM's log handler (vLLM configures only its own loggers), and
subscribes the Prometheus metrics to the Neuron scheduler's steps. Both are
idempotent: vLLM may load plugins more than once per process.
"""

from __future__ import annotations

import logging


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


def register() -> None:
    """vLLM's general plugin hook."""
    route_logs()
    # Imported here: vLLM loads plugins early, and the scheduler imports vLLM's internals.
    from neuronfleet.engine.scheduler import metrics

    metrics.subscribe()
