"""A built image in the builds' podman store (where its build left it), and commands run inside it."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from neuronfleet.devcluster.images.dockerfile import BuiltImage, stored
from neuronfleet.devcluster.images.podman import Podman


@dataclass(frozen=True)
class RunnableImage:
    """A built image and podman on the store that holds it."""

    image: BuiltImage
    podman: Podman

    @property
    def name(self) -> str:
        return self.image.name

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


def runnable(image: BuiltImage) -> RunnableImage:
    """``image`` ready to run from the build store (copied in from its layout only if the store lost it)."""
    return RunnableImage(image, stored(image))
