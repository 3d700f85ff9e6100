"""What an image of the Dockerfile is made of, and the content keys over it.

The key hashes everything the image is made of: the Dockerfile, .dockerignore, pyproject.toml, uv.lock,
README.md, the package sources and the base image. Each image's environment is two layers (the Dockerfile's
header says why): the dependencies, installed from the lock alone, and the project. buildah's cache does not
hash what a ``RUN --mount`` reads, so each install is keyed by a digest of its inputs passed as a build
argument (:func:`build_digests`). The dependencies' digest reads only what a dependency install depends on
(:func:`dependency_view`): an edit to a linter's table in pyproject.toml reinstalls the project, not the
engine's 10 GB of dependencies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.images import node_images

Target = Literal["operator", "engine"]
TARGETS: tuple[Target, ...] = ("operator", "engine")

#: Files and folders the build context sends (what .dockerignore lets through), relative to the checkout.
INPUT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "uv.lock", "README.md", "devcluster/pyproject.toml")
INPUT_DIRS = ("engine", "operator")
#: What the Dockerfile's ``lock`` stage holds, the one input of each dependency install.
LOCK_FILES = ("pyproject.toml", "uv.lock", "devcluster/pyproject.toml")
#: What its ``sources`` stage adds, the input of each project install (beside the lock's files).
SOURCE_FILES = ("README.md",)

#: The build arguments that key the Dockerfile's two installs (its header says why they exist).
LOCK_DIGEST_ARG = "NEURONFLEET_LOCK_DIGEST"
SOURCES_DIGEST_ARG = "NEURONFLEET_SOURCES_DIGEST"


#: A parser directive (``# syntax=...``), the one kind of comment line a builder reads.
_DIRECTIVE = re.compile(r"^#\s*(syntax|escape|check)\s*=", re.IGNORECASE)


class ImageError(RigError):
    """An image could not be built or its inputs are missing."""


def checkout() -> Path:
    """The neuronfleet checkout this package is installed from (the Dockerfile lives there)."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "Dockerfile").is_file() and (parent / "uv.lock").is_file():
            return parent
    raise ImageError("Dockerfile not found: build images from a neuronfleet checkout (`make images`)")


def base_archive() -> Path:
    """The base image's OCI archive: ``NEURONFLEET_BASE_IMAGE``, or the one built here (Debian bookworm,
    Python 3.11, uid 1000; see ``node_images.base_image``)."""
    override = os.environ.get("NEURONFLEET_BASE_IMAGE")
    if override is None:
        return node_images.base_image()
    path = Path(override)
    if not path.is_file():
        raise ImageError(f"no base image at {path}: NEURONFLEET_BASE_IMAGE must name an OCI archive")
    return path


def input_files(root: Path) -> list[Path]:
    """Every file an image is built from, relative to ``root``, sorted (bytecode left out)."""
    found = [Path(name) for name in INPUT_FILES]
    for folder in INPUT_DIRS:
        found += [
            path.relative_to(root)
            for path in (root / folder).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
        ]
    return sorted(found)


def read_inputs(root: Path) -> dict[str, bytes]:
    """Every input's bytes by its name (:func:`input_files`), read once for the key and the digests."""
    return {str(path): (root / path).read_bytes() for path in input_files(root)}


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files_digest(files: Iterable[tuple[str, bytes]], prefix: bytes = b"") -> str:
    """sha256 over ``prefix`` and each file's name and bytes, in order."""
    digest = hashlib.sha256(prefix)
    for name, data in files:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def image_key(target: str, files: Iterable[tuple[str, bytes]], base_key: str) -> str:
    """A short content key over the target, the base image's key and each input's name and bytes."""
    return _files_digest(files, f"target={target}\nbase={base_key}\n".encode())[:16]


def checkout_key(target: str, root: Path, base_key: str) -> str:
    """:func:`image_key` over the checkout's inputs as they are on disk now."""
    return image_key(target, read_inputs(root).items(), base_key)


@dataclass(frozen=True)
class BuildDigests:
    """What each install of the Dockerfile reads, as the digests passed to it as build arguments."""

    #: The lock stage's files as a dependency install reads them (:func:`dependency_view`).
    lock: str
    #: The sources stage's files (README.md, engine/, operator/) and every byte of the lock's: the project
    #: installs.
    sources: str

    def build_args(self) -> list[str]:
        """``podman build`` arguments that pass the digests."""
        return [f"--build-arg={LOCK_DIGEST_ARG}={self.lock}", f"--build-arg={SOURCES_DIGEST_ARG}={self.sources}"]


def dependency_view(name: str, data: bytes) -> bytes:
    """What a dependency install (``uv sync --locked --no-install-project``) reads of a lock stage file.

    Of a pyproject.toml: every table but ``[tool.*]``, except ``[tool.uv]``, which uv reads. The linters'
    and setuptools' tables (package-dir) shape only the project's install, which the sources digest keys.
    Anything else, or a pyproject.toml that does not parse, counts byte for byte.
    """
    if Path(name).name != "pyproject.toml":
        return data
    try:
        project = tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return data
    tool = project.pop("tool", {})
    if "uv" in tool:
        project["tool"] = {"uv": tool["uv"]}
    return json.dumps(project, sort_keys=True).encode()


def _dependency_files(inputs: Mapping[str, bytes]) -> list[tuple[str, bytes]]:
    return [(name, dependency_view(name, inputs[name])) for name in LOCK_FILES]


def build_digests(inputs: Mapping[str, bytes]) -> BuildDigests:
    """The digests of the lock's files and of the sources among ``inputs`` (:func:`read_inputs`)."""
    # The project's install also reads every byte of the lock stage's files (package-dir, entry points).
    sources = [(name, inputs[name]) for name in (*LOCK_FILES, *SOURCE_FILES)]
    sources += [(name, data) for name, data in sorted(inputs.items()) if Path(name).parts[0] in INPUT_DIRS]
    return BuildDigests(_files_digest(_dependency_files(inputs)), _files_digest(sources))


def dependencies_key(target: str, inputs: Mapping[str, bytes], base_key: str) -> str:
    """What a target's dependencies' layer is built from: the lock, the base image and the Dockerfile.

    An image in the layout with the same key means the next build finds that layer in the cache (the free
    space it needs is small); an edit to any Dockerfile instruction counts as a change, to err on the side
    of space, and an edit to its comments does not.
    """
    return image_key(
        target, [*_dependency_files(inputs), ("Dockerfile", dockerfile_instructions(inputs["Dockerfile"]))], base_key
    )


def dockerfile_instructions(data: bytes) -> bytes:
    """A Dockerfile without its comment lines (parser directives kept): what a builder's layer cache sees."""
    lines = data.decode(errors="replace").splitlines()
    kept = [line for line in lines if not line.lstrip().startswith("#") or _DIRECTIVE.match(line)]
    return "\n".join(kept).encode()
