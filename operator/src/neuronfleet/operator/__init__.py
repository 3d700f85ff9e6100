"""The neuronfleet Kubernetes operator."""

from importlib.metadata import version

__version__ = version("neuronfleet")
