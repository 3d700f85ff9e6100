"""The node image store against a real containerd: images unpacked once, nodes started from hard links,
and only the layers a node lacks sent to it."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from neuronfleet.devcluster.process.tools import NodeTools
from neuronfleet.devcluster.realnode import store as store_module
from neuronfleet.devcluster.realnode.store import NodeImageStore, OciImage, chain_ids

REPOSITORY = "localhost/neuronfleet/store-test"


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def layer(files: dict[str, bytes]) -> bytes:
    """An uncompressed layer tar holding ``files``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            _add(tar, name, data)
    return buffer.getvalue()


def write_image(path: Path, name: str, layers: Sequence[bytes]) -> OciImage:
    """An OCI archive of ``layers`` named ``name``, as podman saves one."""
    digests = [hashlib.sha256(data).hexdigest() for data in layers]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"User": "1000"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{d}" for d in digests]},
            "history": [{"created_by": f"layer {i}"} for i in range(len(layers))],
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": f"sha256:{hashlib.sha256(config).hexdigest()}",
                "size": len(config),
            },
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{d}", "size": len(data)}
                for d, data in zip(digests, layers, strict=True)
            ],
        }
    ).encode()
    entry = {
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": f"sha256:{hashlib.sha256(manifest).hexdigest()}",
        "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": name},
    }
    with tarfile.open(path, "w") as archive:
        _add(archive, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        _add(archive, "index.json", json.dumps({"schemaVersion": 2, "manifests": [entry]}).encode())
        for blob in (config, manifest, *layers):
            _add(archive, f"blobs/sha256/{hashlib.sha256(blob).hexdigest()}", blob)
    return OciImage.read(path)


def test_chain_ids_follow_the_oci_rule() -> None:
    """The first layer's key is its digest; each next one hashes the parent's key, a space and its digest."""
    first, second = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    expected = "sha256:" + hashlib.sha256(f"{first} {second}".encode()).hexdigest()
    assert chain_ids([first, second]) == [first, expected]


def test_a_thin_archive_leaves_out_the_layers_present(tmp_path: Path) -> None:
    base, top = layer({"base": b"1" * 4096}), layer({"top": b"2"})
    image = write_image(tmp_path / "image.tar", f"{REPOSITORY}:one", [base, top])
    kept = image.write_thin(tmp_path / "thin.tar", present={image.chain_ids[0]})
    assert kept == 1
    with tarfile.open(tmp_path / "thin.tar") as thin:
        blobs = {name.rsplit("/", 1)[-1] for name in thin.getnames() if name.startswith("blobs/")}
    assert hashlib.sha256(base).hexdigest() not in blobs
    assert hashlib.sha256(top).hexdigest() in blobs
    assert OciImage.read(tmp_path / "thin.tar").manifest == image.manifest


def test_only_the_layers_not_unpacked_need_room(tmp_path: Path) -> None:
    """A rebuild that changes the top layer needs room for that layer, not for the whole image again."""
    base, top = layer({"base": b"1" * 4096}), layer({"top": b"2"})
    image = write_image(tmp_path / "image.tar", f"{REPOSITORY}:one", [base, top])
    assert [entry["size"] for entry in image.layers_missing(set())] == [len(base), len(top)]
    assert [entry["size"] for entry in image.layers_missing({image.chain_ids[0]})] == [len(top)]
    assert image.layers_missing(set(image.chain_ids)) == []


def test_reading_a_layout_names_its_image(tmp_path: Path) -> None:
    image = write_image(tmp_path / "image.tar", f"{REPOSITORY}:one", [layer({"f": b"x"})])
    with tarfile.open(tmp_path / "image.tar") as archive:
        archive.extractall(tmp_path / "layout", filter="data")
    from_directory = OciImage.read(tmp_path / "layout", f"{REPOSITORY}:one")
    assert (from_directory.name, from_directory.manifest_digest) == (image.name, image.manifest_digest)


@pytest.fixture
def store() -> Iterator[NodeImageStore]:
    # Beside the cache (hard links need one file system), removed afterwards.
    with tempfile.TemporaryDirectory(prefix="nf-store-test-") as directory:
        yield NodeImageStore(Path(directory) / "store", NodeTools.locate().directory)


def test_images_are_unpacked_once_and_nodes_start_with_them(store: NodeImageStore, tmp_path: Path) -> None:
    base = layer({"opt/env/big": b"0" * (1 << 20)})
    one = write_image(tmp_path / "one.tar", f"{REPOSITORY}:one", [base, layer({"app": b"one"})])
    two = write_image(tmp_path / "two.tar", f"{REPOSITORY}:two", [base, layer({"app": b"two"})])
    said: list[str] = []

    store.prepare([one], say=said.append)
    assert len(said) == 1
    assert said[0].startswith(f"node image store: {one.name} unpacked (2 new layers) in ")
    store.prepare([one], say=said.append)
    assert len(said) == 1, "an image the store holds is not unpacked again"

    # A new build of the same image shares its base layer: only the top one is sent, and the old build goes.
    store.prepare([two], say=said.append)
    assert said[-1].startswith(f"node image store: {two.name} unpacked (1 new layers)")
    assert store.missing([one, two]) == [one]
    content = store.root / "io.containerd.content.v1.content" / "blobs" / "sha256"
    layers = {entry["digest"].split(":")[1] for entry in two.manifest["layers"]}
    assert not layers & {blob.name for blob in content.iterdir()}, "unpacked layer blobs are collected"

    node = NodeImageStore(tmp_path / "node", store.binaries)
    store.clone_to(node.root)
    snapshots = store.root / "io.containerd.snapshotter.v1.overlayfs" / "snapshots"
    (big,) = snapshots.glob("*/fs/opt/env/big")
    assert (node.root / big.relative_to(store.root)).stat().st_ino == big.stat().st_ino, "hard-linked, not copied"
    # The node's containerd runs on its own copy: it holds the image, and a third build sends one layer.
    three = write_image(tmp_path / "three.tar", f"{REPOSITORY}:three", [base, layer({"app": b"three"})])
    assert node.missing([two, three]) == [three]
    node.prepare([three], say=said.append)
    assert said[-1].startswith(f"node image store: {three.name} unpacked (1 new layers)")
    assert store.missing([two, three]) == [three], "a node's import never changes the store"


def test_short_of_room_older_builds_go_before_a_new_one_is_unpacked(
    store: NodeImageStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = layer({"opt/env/big": b"0" * (1 << 20)})
    one = write_image(tmp_path / "one.tar", f"{REPOSITORY}:one", [base, layer({"app": b"one"})])
    two = write_image(tmp_path / "two.tar", f"{REPOSITORY}:two", [base, layer({"app": b"two"})])
    said: list[str] = []
    store.prepare([one], say=said.append)
    # No disk has this much room beyond what an unpack needs.
    monkeypatch.setattr(store_module, "ROOM_MARGIN_BYTES", 10**18)
    store.prepare([two], say=said.append)
    assert said[-2] == f"node image store: dropping {one.name} first, for {two.name}'s room"
    # Its layers went with it: the new build is unpacked whole.
    assert said[-1].startswith(f"node image store: {two.name} unpacked (2 new layers)")
    assert store.missing([one, two]) == [one]
