"""The neuronfleet Kubernetes operator."""
