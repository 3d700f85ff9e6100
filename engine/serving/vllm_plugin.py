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
    """Log ``neuronfleet.*`` records through vLLM's handlers, at vLLM's level."""
    ours = logging.getLogger("neuronfleet")
    vllm_logger = logging.getLogger("vllm")
    if ours.handlers or not vllm_logger.handlers:
        return
    for handler in vllm_logger.handlers:
        ours.addHandler(handler)
    ours.setLevel(vllm_logger.level)
    ours.propagate = False


def register() -> None:
    """vLLM's general plugin hook."""
    route_logs()
    # Imported here: vLLM loads plugins early, and the scheduler imports vLLM's internals.
    from neuronfleet.engine.scheduler import metrics

    metrics.subscribe()
