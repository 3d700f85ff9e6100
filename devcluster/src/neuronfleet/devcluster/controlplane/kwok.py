"""How KWOK plays the kubelet on the fake nodes: its stages and the annotations that steer them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: ``"true"`` makes a pod's containers exit 1: pods with restartPolicy Never end Failed, others crash-loop.
FAIL_ANNOTATION = "neuronfleet.io/kwok-fail"
#: The termination message of a pod annotated to fail (its container's last words): its state's with restartPolicy
#: Never, its last state's when it crash-loops.
FAIL_MESSAGE_ANNOTATION = "neuronfleet.io/kwok-fail-message"
#: Go duration (``"2s"``) before a pod annotated to fail does so (default 500 ms).
FAIL_AFTER_ANNOTATION = "neuronfleet.io/kwok-fail-after"
#: Go duration before a Job's pod succeeds once Ready (default 1 s).
COMPLETE_AFTER_ANNOTATION = "neuronfleet.io/kwok-complete-after"
#: Go duration between a pod starting and turning Ready, like a readiness probe passing (default 0).
READY_AFTER_ANNOTATION = "neuronfleet.io/kwok-ready-after"


def write_config(path: Path) -> Path:
    """Write the package's stages (``stages.yaml``) as a KWOK ``--config`` file."""
    path.write_text(resources.files(__package__).joinpath("stages.yaml").read_text())
    return path
