"""The Neuron scheduler inside vLLM's engine core, the vLLM internals it touches, and its metrics.

``neuronfleet.engine.scheduler.NeuronAsyncScheduler`` (and ``NeuronScheduler``) is the path users
give vLLM's ``--scheduler-cls``; the classes live in ``neuron.py``.
"""

from neuronfleet.engine.scheduler.neuron import (
    NeuronAsyncScheduler,
    NeuronScheduler,
    SchedulerState,
    read_neuron_config,
)

__all__ = ["NeuronAsyncScheduler", "NeuronScheduler", "SchedulerState", "read_neuron_config"]
