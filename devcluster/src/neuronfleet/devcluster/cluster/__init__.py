"""The local cluster: the control plane and, on request, the real node, as one thing to start, find and stop."""
