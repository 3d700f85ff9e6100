"""The images the Dockerfile builds, in one OCI image layout under the cache, rebuilt only when an input changes.

``build(target)`` runs ``podman build --layers --target <target>`` on a local base image into podman's store
``~/.cache/neuronfleet/images/store``, then saves the image, its layers as plain tars, into the OCI image
layout directory ``~/.cache/neuronfleet/images/layout``, named ``localhost/neuronfleet/<target>:<key>`` there
and in the store (``index.json``: ``io.containerd.image.name`` and ``org.opencontainers.image.ref.name``).
Both persist across builds: the store is buildah's layer cache, and the layout writes only the blobs it lacks.

Each image's environment is two layers (the Dockerfile's header says why): the dependencies, installed from
the lock alone, and the project. A source change rebuilds only the project's small layer; the dependencies'
layer comes from the layer cache with the same digest, so neither the layout nor an importer that holds it
writes it again. buildah's cache does not hash what a ``RUN --mount`` reads, so each install is keyed by a
digest of its inputs passed as a build argument (:func:`build_digests`). The dependencies' digest reads only
what a dependency install depends on (:func:`dependency_view`): an edit to a linter's table in pyproject.toml
reinstalls the project, not the engine's 10 GB of dependencies.

The key hashes everything the image is made of: the Dockerfile, .dockerignore, pyproject.toml, uv.lock,
README.md, the package sources and the base image. An image whose key is in the layout is reused as it is;
each target keeps only its newest image, in the layout and in the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
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
#: What the Dockerfile's ``lock`` stage holds, the one input of each dependency install.
LOCK_FILES = ("pyproject.toml", "uv.lock", "devcluster/pyproject.toml")
#: What its ``sources`` stage adds, the input of each project install (beside the lock's files).
SOURCE_FILES = ("README.md",)

#: The build arguments that key the Dockerfile's two installs (its header says why they exist).
LOCK_DIGEST_ARG = "NEURONFLEET_LOCK_DIGEST"
SOURCES_DIGEST_ARG = "NEURONFLEET_SOURCES_DIGEST"

#: Under the image cache: podman's store (the layer cache) and the OCI image layout the images go into.
STORE_DIR = "store"
LAYOUT_DIR = "layout"

#: Free space a build must find before it starts, the guard's 15 GB included. Installing the dependencies
#: peaks while buildah commits that step to the store: the build container's copy of the environment,
#: the store's new layer, and a gzip copy of it each for buildah and the store (for the engine: 9.9 GB
#: twice and 4.6 GB twice, about 29 GB). The store and the layout then keep one plain copy each.
NEEDED_BYTES: dict[Target, int] = {"operator": 16 * 10**9, "engine": 45 * 10**9}
#: The same when the layout's image of that target was built from the same lock, base image and
#: Dockerfile: the dependencies' layer comes from the cache, and only the project's small layer is new.
NEEDED_BYTES_CACHED = 16 * 10**9

#: The helper stages a target's next build reuses from the store: kept by a tag of their own, since no
#: kept image descends from them (``uv`` copies from ``uv-install``; the engine mounts ``uv``; the operator
#: copies from ``operator-deps``, which is built on ``uv``). Rebuilt, ``uv-install`` would install uv anew,
#: and what is built on it would miss the cache. The stages made from the sources are rebuilt anyway.
KEPT_STAGES: dict[Target, tuple[str, ...]] = {
    "operator": ("uv-install", "operator-deps"),
    "engine": ("uv-install", "uv"),
}

#: The temporary directories buildah (a layer being committed) and the store (a blob being stored) make.
_TEMPORARY_PREFIXES = ("buildah", "storage", "container_images_")
#: containerd names an imported image after the first of these annotations of its ``index.json`` entry.
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
#: The key of what the image's dependencies' layer was built from (:func:`dependencies_key`).
DEPENDENCIES_ANNOTATION = "io.neuronfleet.dependencies-key"
REPOSITORY = "localhost/neuronfleet"
#: The media types of documents that name other blobs (an image's manifest, an index of manifests).
_MANIFEST_TYPES = frozenset(
    {
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)

#: The uv download cache the builds reuse (mounted where the Dockerfile's UV_CACHE_DIR points): the one
#: `make setup` filled, so uv's own UV_CACHE_DIR wins over its default.
UV_CACHE = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv")
UV_CACHE_IN_BUILD = "/uv-cache"
#: The host's CA bundle, mounted read-only during the build only (never part of an image).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


#: A parser directive (``# syntax=...``), the one kind of comment line a builder reads.
_DIRECTIVE = re.compile(r"^#\s*(syntax|escape|check)\s*=", re.IGNORECASE)


class ImageError(RuntimeError):
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


@dataclass(frozen=True)
class BuiltImage:
    """An image in an OCI image layout directory, and the name it has there (and in the build store)."""

    target: Target
    key: str
    #: The OCI image layout directory that holds the image (beside the other target's).
    source: Path

    @property
    def name(self) -> str:
        """The image's name in the layout and the store, e.g. ``localhost/neuronfleet/engine:<key>``."""
        return image_name(self.target, self.key)


def image_name(target: str, key: str) -> str:
    """``localhost/neuronfleet/<target>:<key>``."""
    return f"{REPOSITORY}/{target}:{key}"


def build_args(target: str, root: Path, base_name: str, destination: str, digests: BuildDigests) -> list[str]:
    """``podman build`` arguments for ``target`` on ``base_name``, reusing the uv cache, into ``destination``."""
    args = [
        "build",
        "--pull=never",
        # Build containers share the host's network: the sandbox cannot give them their own.
        "--network=host",
        # Each step committed to the store and looked up there: unchanged steps are reused as they are.
        "--layers=true",
        # No build container left behind when a step fails.
        "--force-rm",
        # gzip while a step is committed: buildah and the store each hold a copy of the step's layer while
        # it is committed to the store, less than half the engine's 10 GB install this way. (The layout gets
        # plain tars: `podman save --uncompressed`.)
        "--disable-compression=false",
        f"--build-arg=PYTHON_BASE={base_name}",
        f"--build-arg=UV_CACHE_DIR={UV_CACHE_IN_BUILD}",
        *digests.build_args(),
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
    """``target`` for the checkout as it is, in the layout: reused when its key is there, else built."""
    root = root or checkout()
    base = base or base_archive()
    cache = cache or node_images.cache_dir()
    inputs = read_inputs(root)
    base_key = file_digest(base)
    image = BuiltImage(target, image_key(target, inputs.items(), base_key), cache / LAYOUT_DIR)
    if not holds(image.source, image.name):
        # One build at a time (the targets share the store and the layout): a second waits, then finds the image.
        with exclusive(cache / "build.lock"):
            if not holds(image.source, image.name):
                _build(image, Recipe(root, base, base_key, inputs), cache, say)
                return image
    say(f"{target} image {image.key} is up to date: {image.name} in {image.source}")
    return image


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (created if missing)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_store(cache: Path) -> Podman:
    """podman on the builds' store under ``cache``, with the rlimits-stripping runtime."""
    runtime = cache / "runc-norlimits"
    # Written beside, then renamed over: a podman running the wrapper never reads half of it.
    runc_norlimits.install(cache / f".runc-norlimits-{os.getpid()}").replace(runtime)
    return Podman(cache / STORE_DIR, runtime)


def stored(image: BuiltImage) -> Podman:
    """The build store's podman, with ``image`` in it: a build leaves it there; a store emptied since gets
    it from the layout again (the engine's 10 GB: minutes)."""
    cache = image.source.parent
    podman = build_store(cache)
    if not podman.exists(image.name):
        with exclusive(cache / "build.lock"):
            if not podman.exists(image.name):
                _pull_from_layout(podman, image)
    return podman


def _pull_from_layout(podman: Podman, image: BuiltImage) -> None:
    # podman 4.3 names an image pulled from `oci:<dir>:<ref>` after <dir>, which must then make a valid
    # reference (`.cache` does not): it reads the layout through a link with a plain name.
    link = Path(tempfile.gettempdir()) / f"nf-layout-{os.getpid()}"
    link.unlink(missing_ok=True)
    link.symlink_to(image.source)
    try:
        pulled = podman.run("pull", "--quiet", f"oci:{link}:{image.name}", timeout=3600).strip()
        podman.run("tag", pulled, image.name)
        podman.run("untag", pulled, f"localhost{link}")
    except PodmanError as error:
        raise ImageError(f"{image.name} from {image.source} into the build store: {error}") from error
    finally:
        link.unlink()


@dataclass(frozen=True)
class Recipe:
    """What a build is made of: the checkout, the base image and the inputs read from the checkout."""

    root: Path
    base: Path
    base_key: str
    inputs: Mapping[str, bytes]


def _build(image: BuiltImage, recipe: Recipe, cache: Path, say: Callable[[str], None]) -> None:
    target, layout = image.target, image.source
    dependencies = dependencies_key(target, recipe.inputs, recipe.base_key)
    cached = dependencies in layout_annotations(layout, DEPENDENCIES_ANNOTATION)
    needed = NEEDED_BYTES_CACHED if cached else NEEDED_BYTES[target]
    podman = build_store(cache)
    if free_bytes(cache) < needed:
        # The target's older images are about to be replaced: let their room go to the build first.
        _make_room(podman, layout, image, recipe.base_key, say)
    if free_bytes(cache) < needed:
        raise ImageError(
            f"building the {target} image needs {needed / 1e9:.0f} GB free under {cache}, "
            f"there are {free_bytes(cache) / 1e9:.1f} GB"
        )
    started = time.monotonic()
    layers = "its dependencies' layer from the cache" if cached else "its dependencies installed"
    say(f"building the {target} image {image.key}, {layers} (podman, store in {podman.root}, into {layout})")
    blobs_before = set(_blobs(layout))
    digests = build_digests(recipe.inputs)
    try:
        _clean_up_stopped_builds(podman)
        base_name = _base_in_store(podman, recipe.base, recipe.base_key)

        def args(stage: str, destination: str) -> list[str]:
            return build_args(stage, recipe.root, base_name, destination, digests)

        podman.stream(args(target, image.name), DiskGuard(cache))
        built_s = time.monotonic() - started
        # Each helper stage the next build reuses, under a name of its own: every step from the cache (seconds).
        for stage in KEPT_STAGES[target]:
            podman.run(*args(stage, stage_tag(stage)), timeout=600)
        saving = time.monotonic()
        # Plain tars (their digests are the layers' own), and only the blobs the layout lacks are written.
        podman.stream(
            ["save", "--format=oci-dir", "--uncompressed", f"--output={layout}", image.name], DiskGuard(cache)
        )
        image_id = podman.run("image", "inspect", "--format={{.Id}}", image.name).strip()
        name_in_layout(layout, f"sha256:{image_id}", image.name, {DEPENDENCIES_ANNOTATION: dependencies})
    except PodmanError as error:
        with contextlib.suppress(PodmanError):
            _clean_up_stopped_builds(podman)
        raise ImageError(str(error)) from error
    layer_sizes = image_layer_sizes(layout, image.name)
    new = sum(size for digest, size in layer_sizes.items() if digest not in blobs_before)
    say(
        f"{target} image built in {time.monotonic() - started:.0f} s (the build {built_s:.0f} s, into the layout"
        f" {time.monotonic() - saving:.0f} s): {len(layer_sizes)} layers, {sum(layer_sizes.values()) / 1e6:.0f} MB,"
        f" {new / 1e6:.0f} MB of them new; {image.name} in {layout}"
    )
    started = time.monotonic()
    removed = prune_layout(layout, target, keep=image.name)
    try:
        prune_store(podman, target, keep=image.name, base_tag=base_tag(recipe.base_key))
    except PodmanError as error:
        raise ImageError(f"pruning the build store: {error}") from error
    if removed:
        say(f"pruned {', '.join(removed)} and what only they used in {time.monotonic() - started:.0f} s")


def _make_room(podman: Podman, layout: Path, image: BuiltImage, base_key: str, say: Callable[[str], None]) -> None:
    """Drop the target's older images from the layout and the store before a build that needs their room."""
    removed = prune_layout(layout, image.target, keep=image.name)
    try:
        prune_store(podman, image.target, keep=image.name, base_tag=base_tag(base_key))
    except PodmanError as error:
        raise ImageError(f"pruning the build store: {error}") from error
    if removed:
        say(f"pruned {', '.join(removed)} before the build, for its room")


def stage_tag(stage: str) -> str:
    """The name that keeps a helper stage's image in the store (:data:`KEPT_STAGES`)."""
    return f"{REPOSITORY}/build-stage:{stage}"


def base_tag(base_key: str) -> str:
    """The base image's name in the store: its key in it, so a new base image is loaded, not mistaken."""
    return f"{REPOSITORY}/build-base:{base_key[:16]}"


def _base_in_store(podman: Podman, base: Path, base_key: str) -> str:
    name = base_tag(base_key)
    if not podman.exists(name):
        podman.run("tag", podman.load(base), name)
    return name


def _clean_up_stopped_builds(podman: Podman) -> None:
    """Remove what a stopped build left in the store (a build stopped by the disk guard leaves GBs): its
    build containers (buildah's, external to podman) and the temporary blobs of the step it was committing.

    Only while holding the build lock: no other build uses the store then.
    """
    listed = json.loads(podman.run("ps", "--all", "--external", "--format=json") or "[]")
    leftovers = [entry["Id"] for entry in listed if str(entry.get("State", "")).lower() == "storage"]
    if leftovers:
        podman.run("rm", "--force", *leftovers)
    for leftover in stale_temporaries(podman.tmpdir):
        shutil.rmtree(leftover, ignore_errors=True)


def stale_temporaries(tmpdir: Path) -> list[Path]:
    """The temporary directories under a store's ``tmpdir`` that only a running build would use."""
    if not tmpdir.is_dir():
        return []
    # Not buildah-cache: what RUN --mount=type=cache mounts lives there.
    return sorted(
        path for path in tmpdir.iterdir() if path.name != "buildah-cache" and path.name.startswith(_TEMPORARY_PREFIXES)
    )


def prune_store(podman: Podman, target: Target, keep: str, base_tag: str) -> None:
    """Untag ``target``'s other images and other base images, then remove every image nothing kept uses.

    What stays: the images named in the store (the newest of each target, the kept stages, the base
    image) and the steps they descend from, among them the dependencies' install of the newest build.
    """
    listed = json.loads(podman.run("images", "--format=json") or "[]")
    repository = keep.rsplit(":", 1)[0]
    base_repository = base_tag.rsplit(":", 1)[0]
    for entry in listed:
        for name in entry.get("Names") or []:
            if (name.startswith(f"{repository}:") and name != keep) or (
                name.startswith(f"{base_repository}:") and name != base_tag
            ):
                podman.run("untag", entry["Id"], name)
    # Dangling images (no name, no child), repeated until none is left: old builds' steps, stages made
    # from sources.
    podman.run("image", "prune", "--force", timeout=600)


def layout_index(layout: Path) -> dict[str, Any]:
    """The layout's ``index.json`` (empty when there is no layout yet)."""
    try:
        index: dict[str, Any] = json.loads((layout / "index.json").read_text())
    except FileNotFoundError:
        return {"schemaVersion": 2, "manifests": []}
    return index


def entry_name(entry: Mapping[str, Any]) -> str | None:
    """An ``index.json`` entry's image name, as containerd reads it."""
    annotations = entry.get("annotations") or {}
    name: str | None = annotations.get(NAME_ANNOTATION) or annotations.get(REF_ANNOTATION)
    return name


def holds(layout: Path, name: str) -> bool:
    """Whether the layout has an image called ``name`` (its manifest there too)."""
    for entry in layout_index(layout)["manifests"]:
        if entry_name(entry) == name:
            return _blob(layout, entry["digest"]).is_file()
    return False


def layout_annotations(layout: Path, key: str) -> set[str]:
    """The values of the annotation ``key`` over the layout's images."""
    return {
        value for entry in layout_index(layout)["manifests"] if (value := (entry.get("annotations") or {}).get(key))
    }


def _write_index(layout: Path, index: Mapping[str, Any]) -> None:
    partial = layout / "index.json.partial"
    partial.write_text(json.dumps(index))
    partial.replace(layout / "index.json")


def name_in_layout(layout: Path, config: str, name: str, annotations: Mapping[str, str]) -> None:
    """Name the layout's image whose config is ``config`` (what ``podman save`` wrote, unnamed) ``name``,
    as containerd and the OCI layout read it, with ``annotations`` beside."""
    index = layout_index(layout)
    found = [entry for entry in index["manifests"] if _config_digest(layout, entry) == config]
    if not found:
        raise ImageError(f"podman saved no image with the config {config} into {layout}")
    for entry in found:
        entry["annotations"] = {**(entry.get("annotations") or {}), NAME_ANNOTATION: name, REF_ANNOTATION: name}
        entry["annotations"] |= annotations
    _write_index(layout, index)


def _config_digest(layout: Path, entry: Mapping[str, Any]) -> str | None:
    """The config digest of an ``index.json`` entry's image manifest (None for anything else)."""
    if entry.get("mediaType") not in _MANIFEST_TYPES or not _blob(layout, entry["digest"]).is_file():
        return None
    config: str | None = _read_blob(layout, entry["digest"]).get("config", {}).get("digest")
    return config


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    return layout / "blobs" / algorithm / hexdigest


def _blobs(layout: Path) -> list[str]:
    return [f"{path.parent.name}:{path.name}" for path in (layout / "blobs").glob("*/*") if path.is_file()]


def _read_blob(layout: Path, digest: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(_blob(layout, digest).read_text())
    return document


def _referenced(layout: Path, descriptor: Mapping[str, Any]) -> set[str]:
    """The digests a descriptor needs: itself, and a manifest's config and layers or an index's manifests."""
    digest = descriptor["digest"]
    if descriptor.get("mediaType") not in _MANIFEST_TYPES or not _blob(layout, digest).is_file():
        return {digest}
    document = _read_blob(layout, digest)
    found = {digest, *(layer["digest"] for layer in document.get("layers", []))}
    if "config" in document:
        found.add(document["config"]["digest"])
    for child in document.get("manifests", []):
        found |= _referenced(layout, child)
    return found


def prune_layout(layout: Path, target: Target, keep: str) -> list[str]:
    """Drop ``target``'s images other than ``keep`` from the layout, and every blob no image left uses.

    Also removes the temporary files a stopped build left (containers/image writes ``oci-put-blob*``
    beside ``index.json``). Returns the names of the images dropped.
    """
    index = layout_index(layout)
    mine = re.compile(re.escape(keep.rsplit(":", 1)[0]) + ":")
    # Unnamed entries too: a stopped build saved them and never named them.
    dropped = [
        e
        for e in index["manifests"]
        if not entry_name(e) or (mine.match(entry_name(e) or "") and entry_name(e) != keep)
    ]
    if dropped:
        index["manifests"] = [entry for entry in index["manifests"] if entry not in dropped]
        _write_index(layout, index)
    used: set[str] = set()
    for entry in index["manifests"]:
        used |= _referenced(layout, entry)
    for digest in _blobs(layout):
        if digest not in used:
            _blob(layout, digest).unlink()
    for partial in layout.glob("oci-put-blob*"):
        partial.unlink()
    return [entry_name(entry) or entry["digest"] for entry in dropped]


def image_manifest(layout: Path, name: str) -> dict[str, Any]:
    """The manifest of the layout's image called ``name``."""
    for entry in layout_index(layout)["manifests"]:
        if entry_name(entry) == name:
            return _read_blob(layout, entry["digest"])
    raise ImageError(f"{layout} has no image {name}")


def image_config(layout: Path, name: str) -> dict[str, Any]:
    """The image configuration (User, Env, Entrypoint, ...) of the layout's image ``name``, read without podman."""
    return _read_blob(layout, image_manifest(layout, name)["config"]["digest"])


def image_layer_sizes(layout: Path, name: str) -> dict[str, int]:
    """The layout's image ``name``: each layer's digest and size, in order."""
    return {layer["digest"]: layer["size"] for layer in image_manifest(layout, name)["layers"]}
