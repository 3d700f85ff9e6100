"""The real node: containerd, runc, a kubelet and kube-proxy in a network namespace, and the processes it runs."""
