"""The images the Dockerfile builds, as OCI archives under the cache, rebuilt only when an input changes.

``build(target)`` runs ``podman build --target <target>`` on a local base image and commits the result
straight into ``~/.cache/neuronfleet/images/<key>/<target>.oci.tar`` (for ``ctr images import``). The key hashes
everything the image is made of: the Dockerfile, .dockerignore, pyproject.toml, uv.lock, README.md, the
package sources and the base image. An archive whose key exists is reused as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tarfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from neuronfleet.devcluster.images import node_images, runc_norlimits
from neuronfleet.devcluster.images.podman import DiskGuard, Podman, PodmanError, free_bytes

Target = Literal["operator", "engine"]
TARGETS: tuple[Target, ...] = ("operator", "engine")

#: Files and folders the build context sends (what .dockerignore lets through), relative to the checkout.
INPUT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "uv.lock", "README.md", "devcluster/pyproject.toml")
INPUT_DIRS = ("engine", "operator")

#: Free space a build must find before it starts, the guard's 15 GB included: the engine's environment
#: (about 10 GB) is held twice while buildah commits it (the container's copy and the layer's diff),
#: beside the compressed layer and the archive it goes into (about 4 GB each).
NEEDED_BYTES: dict[Target, int] = {"operator": 20 * 10**9, "engine": 40 * 10**9}

#: The uv download cache the builds reuse (mounted where the Dockerfile's UV_CACHE_DIR points): the one
#: `make setup` filled, so uv's own UV_CACHE_DIR wins over its default.
UV_CACHE = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv")
UV_CACHE_IN_BUILD = "/uv-cache"
#: The host's CA bundle, mounted read-only during the build only (never part of an image).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


class ImageError(RuntimeError):
    """An image could not be built or its inputs are missing."""


def cache_root() -> Path:
    """``$NEURONFLEET_CACHE/images`` (default ``~/.cache/neuronfleet/images``), beside the node's images."""
    return node_images.cache_dir()


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


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def image_key(target: str, files: Iterable[tuple[str, bytes]], base_key: str) -> str:
    """A short content key over the target, the base image's key and each input's name and bytes."""
    digest = hashlib.sha256(f"target={target}\nbase={base_key}\n".encode())
    for name, data in files:
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def checkout_key(target: str, root: Path, base_key: str) -> str:
    """:func:`image_key` over the checkout's inputs as they are on disk now."""
    return image_key(target, ((str(p), (root / p).read_bytes()) for p in input_files(root)), base_key)


@dataclass(frozen=True)
class BuiltImage:
    """An image as an OCI archive, and the name it carries."""

    target: Target
    key: str
    archive: Path

    @property
    def name(self) -> str:
        """The reference the archive holds, e.g. ``localhost/neuronfleet/engine:<key>``."""
        return f"localhost/neuronfleet/{self.target}:{self.key}"


def build_args(target: Target, root: Path, base_name: str, destination: str) -> list[str]:
    """``podman build`` arguments for ``target`` on ``base_name``, reusing the uv cache, into ``destination``."""
    args = [
        "build",
        "--pull=never",
        # Build containers share the host's network: the sandbox cannot give them their own.
        "--network=host",
        # One commit per stage: intermediate layers of 10 GB would each be written again.
        "--layers=false",
        # gzip layers: the archive is about half the environment's size.
        "--disable-compression=false",
        f"--build-arg=PYTHON_BASE={base_name}",
        f"--build-arg=UV_CACHE_DIR={UV_CACHE_IN_BUILD}",
        f"--volume={UV_CACHE}:{UV_CACHE_IN_BUILD}",
        f"--target={target}",
        f"--tag={destination}",
        f"--file={root / 'Dockerfile'}",
    ]
    if CA_BUNDLE.is_file():
        # Downloads go through a proxy with its own CA; the bundle is mounted for the build alone.
        args.append(f"--volume={CA_BUNDLE}:{CA_BUNDLE}:ro")
    return [*args, str(root)]


def _say(message: str) -> None:
    print(f"==> {message}", flush=True)


def build(
    target: Target,
    *,
    root: Path | None = None,
    base: Path | None = None,
    cache: Path | None = None,
    say: Callable[[str], None] = _say,
) -> BuiltImage:
    """The archive of ``target`` for the checkout as it is: reused when its key exists, else built."""
    root = root or checkout()
    base = base or base_archive()
    cache = cache or cache_root()
    key = checkout_key(target, root, file_digest(base))
    image = BuiltImage(target, key, cache / key / f"{target}.oci.tar")
    if not image.archive.is_file():
        # One build of a target at a time: a second waits, then finds the first one's archive.
        with exclusive(cache / f"build-{target}.lock"):
            if not image.archive.is_file():
                _build(image, root, base, cache, say)
                prune(cache, target, keep=key)
                return image
    say(f"{target} image {key} is up to date: {image.archive}")
    return image


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (created if missing)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _build(image: BuiltImage, root: Path, base: Path, cache: Path, say: Callable[[str], None]) -> None:
    target = image.target
    needed = NEEDED_BYTES[target]
    if free_bytes(cache) < needed:
        raise ImageError(
            f"building the {target} image needs {needed / 1e9:.0f} GB free under {cache}, "
            f"there are {free_bytes(cache) / 1e9:.1f} GB"
        )
    podman = Podman(cache / f"build-{target}", runc_norlimits.install(cache / "runc-norlimits"))
    started = time.monotonic()
    say(f"building the {target} image {image.key} (podman, store in {podman.root})")
    try:
        podman.reset()
        base_name = podman.load(base)
        partial = image.archive.with_name(f"{target}.partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        # Committed straight into the archive: the 10 GB layer is not stored a second time and then saved.
        destination = f"oci-archive:{partial}:{image.name}"
        podman.stream(build_args(target, root, base_name, destination), DiskGuard(cache))
        partial.rename(image.archive)
    except PodmanError as error:
        shutil.rmtree(image.archive.parent, ignore_errors=True)
        raise ImageError(str(error)) from error
    finally:
        podman.reset()
    size = image.archive.stat().st_size
    say(f"{target} image built in {time.monotonic() - started:.0f} s: {size / 1e6:.0f} MB at {image.archive}")


def prune(cache: Path, target: Target, keep: str) -> list[Path]:
    """Remove ``target``'s archives of other keys (only the newest build of each image is kept)."""
    removed = []
    for archive in cache.glob(f"*/{target}.oci.tar"):
        if archive.parent.name != keep:
            archive.unlink()
            removed.append(archive)
            if not any(archive.parent.iterdir()):
                archive.parent.rmdir()
    return removed


def archive_config(archive: Path) -> dict[str, Any]:
    """The image configuration (User, Env, Entrypoint, ...) an OCI archive holds, read without podman."""
    with tarfile.open(archive) as tar:

        def blob(name: str) -> dict[str, Any]:
            member = tar.extractfile(name)
            if member is None:
                raise ImageError(f"{archive} has no {name}")
            document: dict[str, Any] = json.load(member)
            return document

        def by_digest(digest: str) -> dict[str, Any]:
            return blob("blobs/" + digest.replace(":", "/", 1))

        (manifest,) = blob("index.json")["manifests"]
        config: dict[str, Any] = by_digest(by_digest(manifest["digest"])["config"]["digest"])
        return config
