"""Programs as managed processes, waiting for conditions, the cluster state file and the pinned binaries."""
