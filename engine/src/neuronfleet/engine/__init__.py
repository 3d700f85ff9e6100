"""The neuronfleet serving engine: vLLM with the embedded Neuron scheduler.

The modules at this level (``config``, ``buckets``, ``identity``, ``hardware``, ``sim_settings``) are
the contract the operator shares: pydantic only, no vLLM. The subpackages run in vLLM's engine core
(``scheduler``, ``sim``), in its API server (``serving``), offline (``offline``, ``tuning``), in the
CLI (``cli``) and around compiles (``artifacts``); ``docs/architecture.md`` draws the layers.
"""
