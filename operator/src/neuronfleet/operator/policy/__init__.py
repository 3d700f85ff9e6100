"""Pure decisions on what was observed: rollout, status, canaries, health and scaling; no I/O."""
