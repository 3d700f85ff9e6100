"""Images built on this machine: the Dockerfile's (with podman, into an OCI image layout) and the node's
pause and base (OCI archives)."""
