"""The images the Dockerfile builds, in one OCI image layout under the cache, rebuilt only when an input changes.

``build(target)`` runs ``podman build --layers --target <target>`` on a local base image into podman's store
``~/.cache/neuronfleet/images/store``, then saves the image, its layers as plain tars, into the OCI image
layout directory ``~/.cache/neuronfleet/images/layout``, named ``localhost/neuronfleet/<target>:<key>`` there
and in the store (``index.json``: ``io.containerd.image.name`` and ``org.opencontainers.image.ref.name``).
Both persist across builds: the store is buildah's layer cache, and the layout writes only the blobs it lacks.
Each target keeps only its newest image, in the layout and in the store. What an image is made of and its
key: :mod:`~neuronfleet.devcluster.images.inputs`; the layout itself: :mod:`~neuronfleet.devcluster.images.layout`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from neuronfleet.devcluster.images import node_images, runc_norlimits
from neuronfleet.devcluster.images.inputs import (
    BuildDigests,
    ImageError,
    Target,
    base_archive,
    build_digests,
    checkout,
    dependencies_key,
    file_digest,
    image_key,
    read_inputs,
)
from neuronfleet.devcluster.images.layout import (
    DEPENDENCIES_ANNOTATION,
    blobs,
    holds,
    image_layer_sizes,
    layout_annotations,
    name_in_layout,
    prune_layout,
)
from neuronfleet.devcluster.images.podman import DiskGuard, Podman, PodmanError, free_bytes

#: Under the image cache: podman's store (the layer cache) and the OCI image layout the images go into.
STORE_DIR = "store"
LAYOUT_DIR = "layout"

#: Free space a build must find before it starts, the guard's 5 GB included. Installing the dependencies
#: peaks while buildah commits that step to the store: the build container's copy of the environment,
#: the store's new layer, and a gzip copy of it each for buildah and the store (for the engine: 9.9 GB
#: twice and 4.6 GB twice, about 29 GB). The store and the layout then keep one plain copy each.
NEEDED_BYTES: dict[Target, int] = {"operator": 7 * 10**9, "engine": 35 * 10**9}
#: The same when the layout's image of that target was built from the same lock, base image and
#: Dockerfile: the dependencies' layer comes from the cache, and only the project's small layer is new.
NEEDED_BYTES_CACHED = 7 * 10**9

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
REPOSITORY = "localhost/neuronfleet"

#: `make setup` filled, so uv's own UV_CACHE_DIR wins over its default.
UV_CACHE = Path(os.environ.get("UV_CACHE_DIR") or Path.home() / ".cache" / "uv")
UV_CACHE_IN_BUILD = "/uv-cache"
#: The host's CA bundle, mounted read-only during the build only (never part of an image).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


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
    if prune_before_build(free_bytes(cache), needed, cached):
        _make_room(podman, layout, image, recipe.base_key, say)
    if free_bytes(cache) < needed:
        kept = " (the older image is kept: it holds the dependencies' layer this build reuses)" if cached else ""
        raise ImageError(
            f"building the {target} image needs {needed / 1e9:.0f} GB free under {cache}, "
            f"there are {free_bytes(cache) / 1e9:.1f} GB{kept}"
        )
    started = time.monotonic()
    layers = "its dependencies' layer from the cache" if cached else "its dependencies installed"
    say(f"building the {target} image {image.key}, {layers} (podman, store in {podman.root}, into {layout})")
    blobs_before = set(blobs(layout))
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
    removed = prune_layout(layout, keep=image.name)
    try:
        prune_store(podman, target, keep=image.name, base_tag=base_tag(recipe.base_key))
    except PodmanError as error:
        raise ImageError(f"pruning the build store: {error}") from error
    if removed:
        say(f"pruned {', '.join(removed)} and what only they used in {time.monotonic() - started:.0f} s")


def prune_before_build(free: int, needed: int, cached: bool) -> bool:
    """Whether to drop the target's older images before a build, for their room: only when the build is
    short of room and installs its dependencies anew. With the dependencies' layer cached, the older image
    is what holds that layer: dropping it would gain a few MB and make the build reinstall them (10 GB for
    the engine)."""
    return free < needed and not cached


def _make_room(podman: Podman, layout: Path, image: BuiltImage, base_key: str, say: Callable[[str], None]) -> None:
    """Drop the target's older images from the layout and the store before a build that needs their room."""
    removed = prune_layout(layout, keep=image.name)
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
