"""Images built on this machine as OCI archives: the Dockerfile's (with podman) and the node's pause and base."""
