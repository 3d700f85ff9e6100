"""Shipping: the Dockerfile, the Helm chart under RBAC, Argo CD, examples, kubectl, the demo."""
