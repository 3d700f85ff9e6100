"""Compiled artifacts: the store and its manifest, and the real Neuron compile."""
