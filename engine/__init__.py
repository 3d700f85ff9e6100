"""The neuronfleet serving engine: vLLM with the embedded Neuron scheduler."""
