"""A built image loaded into a private podman store, and commands run inside it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from neuronfleet.devcluster.images import runc_norlimits
from neuronfleet.devcluster.images.dockerfile import BuiltImage
from neuronfleet.devcluster.images.podman import Podman


@dataclass(frozen=True)
class RunnableImage:
    """A built image loaded into a private podman store."""

    image: BuiltImage
    podman: Podman
    name: str

    def run(self, *args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess[str]:
        """``podman run --rm`` of the image as it is configured (its user), output captured."""
        chosen = [f"--entrypoint={entrypoint}"] if entrypoint else []
        return subprocess.run(
            self.podman.argv("run", "--rm", "--network=host", *chosen, self.name, *args),
            capture_output=True,
            text=True,
            timeout=300,
            env=self.podman.env(),
            check=False,
        )

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        """Run ``code`` with the image's Python (the environment's, first on its PATH)."""
        return self.run("-c", code, entrypoint="python")


def loaded(image: BuiltImage, store: Path) -> Iterator[RunnableImage]:
    """The image loaded into a store at ``store``, emptied again afterwards."""
    podman = Podman(store, runc_norlimits.install(store.parent / "runc-norlimits"))
    try:
        yield RunnableImage(image, podman, podman.load(image.archive))
    finally:
        podman.reset()
