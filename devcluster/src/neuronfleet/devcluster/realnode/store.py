"""The node image store: the real node's images, unpacked once and kept across clusters.

Unpacking the engine image (about 10 GB of files) into a containerd takes minutes, and every cluster's
node used to pay it again. Here the images live in a store: a containerd root under the cache
(``<cache>/node-store``), brought up to date by a containerd of its own. A node's containerd then
starts on a copy of the store's root made of hard links (seconds, no data copied), so its images are
there from its first second. An image the node still lacks is imported as a *thin* archive: its
index, manifest and config, and only the layers the node has no snapshot for. A new engine image whose
dependency layer is unchanged adds only its small top layer.

The store's layer blobs are removed once unpacked: pods run from snapshots, and the archives stay in
the image cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.images.dockerfile import BuiltImage
from neuronfleet.devcluster.process.tools import cache_root

#: Where a containerd root keeps its bolt databases: copied, never linked (containerd writes them in place).
_DATABASE_SUFFIX = ".db"
#: containerd names an imported image after this annotation of the index entry.
_NAME_ANNOTATION = "io.containerd.image.name"
_REF_ANNOTATION = "org.opencontainers.image.ref.name"
SNAPSHOTTER = "overlayfs"


#: containerd's local transfer plugin, unpacking imports for the node's platform into the snapshotter
#: its pods run from (without it: "no unpack platforms defined"); both containerds here use it.
UNPACK_CONFIG = f"""  [plugins.'io.containerd.transfer.v1.local']
    [[plugins.'io.containerd.transfer.v1.local'.unpack_config]]
      platform = 'linux/amd64'
      snapshotter = '{SNAPSHOTTER}'
      differ = 'walking'
"""


class StoreError(RigError):
    """An image could not be read, or containerd refused it."""


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The snapshot keys (OCI chain IDs) of an image's layers, from their uncompressed digests."""
    chain: list[str] = []
    for diff_id in diff_ids:
        chain.append(
            diff_id if not chain else "sha256:" + hashlib.sha256(f"{chain[-1]} {diff_id}".encode()).hexdigest()
        )
    return chain


@dataclass(frozen=True)
class OciImage:
    """One image of an OCI image layout, a directory or a tar of one: its name, manifest, config and blobs."""

    source: Path
    name: str
    manifest_digest: str
    manifest: dict[str, Any]
    config: dict[str, Any]

    @classmethod
    def read(cls, source: Path, name: str | None = None) -> OciImage:
        """The image called ``name`` (or the only one) of a layout directory or archive, its JSON read alone."""
        with _opened(source) as layout:
            entries = layout.json("index.json").get("manifests", [])
            named = {_name_of(entry): entry for entry in entries}
            if name is None and len(entries) != 1:
                raise StoreError(f"{source}: expected one image in index.json, found {len(entries)}")
            entry = entries[0] if name is None else named.get(name)
            if entry is None:
                raise StoreError(f"{source}: no image {name!r} in index.json (it has {', '.join(map(str, named))})")
            found = _name_of(entry)
            if not found:
                raise StoreError(f"{source}: the image in index.json has no name annotation")
            manifest = layout.json(_blob_path(entry["digest"]))
            config = layout.json(_blob_path(manifest["config"]["digest"]))
        return cls(source, found, entry["digest"], manifest, config)

    @classmethod
    def of(cls, image: BuiltImage) -> OciImage:
        """One of the Dockerfile's images, as built (see :mod:`neuronfleet.devcluster.images.dockerfile`)."""
        return cls.read(image.source, image.name)

    @property
    def chain_ids(self) -> list[str]:
        """Each layer's snapshot key, bottom layer first."""
        return chain_ids(self.config["rootfs"]["diff_ids"])

    def layers_missing(self, present: set[str]) -> list[dict[str, Any]]:
        """The manifest's layer entries whose snapshot is not in ``present``, bottom layer first."""
        return [
            layer
            for layer, chain_id in zip(self.manifest["layers"], self.chain_ids, strict=True)
            if chain_id not in present
        ]

    def write_thin(self, destination: Path, present: set[str]) -> int:
        """An archive of this image alone without the layers whose snapshot is in ``present``; layers kept."""
        layers = [layer["digest"] for layer in self.layers_missing(present)]
        with _opened(self.source) as layout, tarfile.open(destination, "w") as thin:
            entry = {
                "mediaType": self.manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json"),
                "digest": self.manifest_digest,
                "size": layout.size(_blob_path(self.manifest_digest)),
                "annotations": {_NAME_ANNOTATION: self.name, _REF_ANNOTATION: self.name},
            }
            _add(thin, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            _add(thin, "index.json", json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode())
            for digest in (self.manifest_digest, self.manifest["config"]["digest"], *layers):
                layout.copy(_blob_path(digest), thin)
        return len(layers)


@contextmanager
def _opened(source: Path) -> Iterator[_Layout]:
    if source.is_dir():
        yield _Layout(source, None)
    else:
        with tarfile.open(source) as tar:
            yield _Layout(source, tar)


class _Layout:
    """Read access to an OCI image layout, as a directory or as a tar archive of one."""

    def __init__(self, source: Path, tar: tarfile.TarFile | None) -> None:
        self.source = source
        self._tar = tar

    def _member(self, name: str) -> tarfile.TarInfo:
        assert self._tar is not None
        try:
            return self._tar.getmember(name)
        except KeyError:
            raise StoreError(f"{self.source}: no {name}") from None

    def json(self, name: str) -> dict[str, Any]:
        if self._tar is None:
            path = self.source / name
            if not path.is_file():
                raise StoreError(f"{self.source}: no {name}")
            document: dict[str, Any] = json.loads(path.read_bytes())
            return document
        stream = self._tar.extractfile(self._member(name))
        assert stream is not None
        document = json.load(stream)
        return document

    def size(self, name: str) -> int:
        return (self.source / name).stat().st_size if self._tar is None else self._member(name).size

    def copy(self, name: str, into: tarfile.TarFile) -> None:
        if self._tar is None:
            into.add(self.source / name, name)
        else:
            member = self._member(name)
            into.addfile(member, self._tar.extractfile(member))


def _name_of(entry: dict[str, Any]) -> str | None:
    annotations = entry.get("annotations", {})
    name: str | None = annotations.get(_NAME_ANNOTATION) or annotations.get(_REF_ANNOTATION)
    return name


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    archive.addfile(info, io.BytesIO(data))


def _blob_path(digest: str) -> str:
    algorithm, value = digest.split(":", 1)
    return f"blobs/{algorithm}/{value}"


class Containerd:
    """``ctr`` against one containerd socket, in Kubernetes' namespace."""

    def __init__(self, ctr: Path, socket: Path) -> None:
        self.ctr = ctr
        self.socket = socket

    def run(self, *args: str, timeout: float = 60) -> str:
        """``ctr args...``; its output, or :class:`StoreError` with its error."""
        argv = [str(self.ctr), f"--address={self.socket}", "--namespace=k8s.io", *args]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise StoreError(f"ctr {' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def images(self) -> dict[str, str]:
        """Each image's name and its manifest digest."""
        rows = (line.split() for line in self.run("images", "ls").splitlines()[1:])
        return {row[0]: row[2] for row in rows if len(row) >= 3}

    def snapshots(self) -> set[str]:
        """The keys of the committed snapshots (a layer's chain ID once it is unpacked)."""
        listed = self.run("snapshots", f"--snapshotter={SNAPSHOTTER}", "ls").splitlines()[1:]
        return {row.split()[0] for row in listed if row.split() and row.split()[-1] == "Committed"}

    def load(self, image: OciImage, scratch: Path, *, discard_layers: bool = False, timeout: float = 1800) -> int:
        """Import ``image`` unless it is here already, sending only the layers not unpacked; layers sent."""
        if self.images().get(image.name) == image.manifest_digest:
            return 0
        thin = scratch / "thin.oci.tar"
        sent = image.write_thin(thin, self.snapshots())
        try:
            self.run("images", "import", "--local", f"--snapshotter={SNAPSHOTTER}", str(thin), timeout=timeout)
        finally:
            thin.unlink(missing_ok=True)
        if discard_layers:
            # Unpacked, a layer's blob is never read again (a local import keeps it all the same).
            held = set(self.run("content", "ls", "--quiet").split())
            unpacked = [layer["digest"] for layer in image.manifest["layers"] if layer["digest"] in held]
            if unpacked:
                self.run("content", "rm", *unpacked)
        return sent

    def collected(self, root: Path, digests: Sequence[str], timeout: float = 10) -> None:
        """Wait until the garbage collector removed the blobs ``digests`` from the content store at ``root``.

        Not past ``timeout``: it takes well under a second, but once in a CI run a blob stayed for the whole
        minute this waited then. A blob left behind only takes room until the next collection."""
        blobs = [root / "io.containerd.content.v1.content" / _blob_path(digest) for digest in digests]
        deadline = time.monotonic() + timeout
        while any(blob.exists() for blob in blobs) and time.monotonic() < deadline:
            time.sleep(0.1)


def clone_root(source: Path, root: Path) -> None:
    """Make ``root`` a containerd root with the images of ``source``: files hard-linked, databases copied."""
    root.parent.mkdir(parents=True, exist_ok=True)
    if not source.is_dir():
        return
    done = subprocess.run(["cp", "-a", "--link", str(source), str(root)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise StoreError(f"copying the node image store into {root} failed: {done.stderr.strip()}")
    for database in root.rglob(f"*{_DATABASE_SUFFIX}"):
        private = database.with_name(database.name + ".copy")
        shutil.copy2(database, private)
        os.replace(private, database)


def containerd_store_config(root: Path, state: Path, socket: Path) -> str:
    """A containerd of its own for the store: no CRI, overlayfs, unpacking for linux/amd64."""
    return f"""version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins]
  # A removed layer blob is collected at once, while this short-lived containerd still runs.
  [plugins.'io.containerd.gc.v1.scheduler']
    deletion_threshold = 1
    startup_delay = "0s"
    schedule_delay = "0s"
{UNPACK_CONFIG}"""


@dataclass(frozen=True)
class NodeImageStore:
    """The containerd root new nodes start from, and the lock that keeps it whole."""

    directory: Path
    binaries: Path

    @classmethod
    def default(cls, binaries: Path) -> NodeImageStore:
        """``$NEURONFLEET_CACHE/node-store`` (default ``~/.cache/neuronfleet/node-store``), run with ``binaries``."""
        return cls(cache_root() / "node-store", binaries)

    @property
    def root(self) -> Path:
        """The containerd root nodes start from."""
        return self.directory / "root"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def missing(self, images: Sequence[OciImage]) -> list[OciImage]:
        """The images the store does not hold yet (read without starting containerd when it holds none)."""
        if not self.root.is_dir():
            return list(images)
        with (
            self._locked(),
            tempfile.TemporaryDirectory(prefix="nf-store-") as scratch,
            self._containerd(Path(scratch)) as ctr,
        ):
            held = ctr.images()
        return [image for image in images if held.get(image.name) != image.manifest_digest]

    def prepare(self, images: Sequence[OciImage], say: Callable[[str], None] = print) -> None:
        """Hold ``images``, unpacking each one missing once; older builds of the same images are dropped."""
        with (
            self._locked(),
            tempfile.TemporaryDirectory(prefix="nf-store-") as scratch,
            self._containerd(Path(scratch)) as ctr,
        ):
            held = ctr.images()
            # Older builds of the same images; another name's images stay: other nodes may use them.
            repositories = {_repository(image.name) for image in images}
            wanted = {image.name for image in images}
            stale = sorted(name for name in held if name not in wanted and _repository(name) in repositories)
            for image in images:
                if held.get(image.name) == image.manifest_digest:
                    continue
                if stale and not _has_room(self.directory, image, ctr.snapshots()):
                    # Dropped after the new one is unpacked, they would lend it their unchanged layers; short of
                    # room, they go first (a node started from the store holds its own links to them).
                    say(f"node image store: dropping {', '.join(stale)} first, for {image.name}'s room")
                    ctr.run("images", "rm", "--sync", *stale, timeout=600)
                    stale = []
                _check_room(self.directory, image, ctr.snapshots())
                started = time.monotonic()
                layers = ctr.load(image, Path(scratch), discard_layers=True)
                ctr.collected(self.root, [layer["digest"] for layer in image.manifest["layers"]])
                elapsed = time.monotonic() - started
                say(f"node image store: {image.name} unpacked ({layers} new layers) in {elapsed:.0f} s")
            if stale:
                # Synchronous: the garbage collector removes their snapshots before containerd stops.
                ctr.run("images", "rm", "--sync", *stale, timeout=600)

    def clone_to(self, root: Path) -> None:
        """Make ``root`` a containerd root holding the store's images (under the lock: never half-updated)."""
        with self._locked():
            clone_root(self.root, root)

    @contextmanager
    def _containerd(self, scratch: Path) -> Iterator[Containerd]:
        socket = scratch / "containerd.sock"
        config = scratch / "containerd.toml"
        config.write_text(containerd_store_config(self.root, scratch / "state", socket))
        log_path = scratch / "containerd.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                [str(self.binaries / "containerd"), "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PATH": f"{self.binaries}:{os.environ.get('PATH', '')}"},
            )
            try:
                deadline = time.monotonic() + 30
                while not socket.exists():
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise StoreError(f"the node image store's containerd did not start: {_tail(log_path)}")
                    time.sleep(0.05)
                yield Containerd(self.binaries / "ctr", socket)
            finally:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


#: Disk a layer takes while it is unpacked, per byte of its blob: the blob in containerd's content store
#: (discarded once unpacked) and the snapshot. A gzip layer unpacks to about 2.2 times its size; a plain tar
#: (what the images' layout holds: `podman save --uncompressed`) to its own size.
_UNPACK_FACTOR = {"gzip": 3.2, "tar": 2.0}


def _unpack_factor(media_type: str) -> float:
    return _UNPACK_FACTOR["gzip"] if media_type.endswith(("+gzip", ".gzip")) else _UNPACK_FACTOR["tar"]


def _room_needed(image: OciImage, present: set[str]) -> float:
    """Bytes unpacking ``image`` takes (the layers already unpacked cost nothing)."""
    return float(sum(_unpack_factor(layer["mediaType"]) * layer["size"] for layer in image.layers_missing(present)))


#: Room kept free beyond an unpack's estimate before older builds are let to stay during it.
ROOM_MARGIN_BYTES = 5 * 10**9


def _has_room(directory: Path, image: OciImage, present: set[str]) -> bool:
    return shutil.disk_usage(directory).free >= _room_needed(image, present) + ROOM_MARGIN_BYTES


def _check_room(directory: Path, image: OciImage, present: set[str]) -> None:
    """Refuse, before unpacking, an image the disk has no room for."""
    needed = _room_needed(image, present)
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise StoreError(
            f"unpacking {image.name} into the node image store needs about {needed / 1e9:.0f} GB free "
            f"under {directory}, there are {free / 1e9:.1f} GB"
        )


def _repository(name: str) -> str:
    """``localhost/neuronfleet/engine`` of ``localhost/neuronfleet/engine:abc``."""
    return name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"
