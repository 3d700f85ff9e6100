"""``neuronfleet-dev demo`` and ``neuronfleet-dev load``: the user's path end to end, and the load tool."""
