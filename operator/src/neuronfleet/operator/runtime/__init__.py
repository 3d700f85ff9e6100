"""How the operator runs: kopf's handlers, the queue that drives the reconcilers, and their retries."""
