"""What the operator, the engine and the dev harness share: the engine's configuration and bucket rules,
the compiled-artifact identity, the hardware catalogue, the simulated device's settings, LoRA slots,
Neuron runtime faults, DRA's names, the engine's command lines, and the names every side looks for.

It needs pydantic at most (``names``, ``invocation`` and ``faults``: the standard library alone) and
imports nothing else of neuronfleet, so the operator image carries no vLLM and the engine no kopf.
"""
