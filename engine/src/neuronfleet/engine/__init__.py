"""The neuronfleet serving engine: vLLM with the embedded Neuron scheduler.

What the engine shares with the operator (its configuration, buckets, artifact identity, hardware) is
``neuronfleet.contract``: pydantic only, no vLLM. The subpackages run in vLLM's engine core
(``scheduler``, ``sim``), in its API server (``serving``), offline (``offline``, ``tuning``), in the
CLI (``cli``) and around compiles (``artifacts``); ``docs/architecture.md`` draws the layers.
"""
