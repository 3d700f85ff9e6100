"""The simulated Neuron device: vLLM's platform and executor, the device, its cost model and model shapes."""
