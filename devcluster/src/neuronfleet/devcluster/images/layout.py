"""The OCI image layout the images go into: its index, the names containerd reads, and pruning.

Read and written without podman: a layout is ``index.json`` and content-addressed blobs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from neuronfleet.devcluster.images.inputs import ImageError

NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
#: The key of what the image's dependencies' layer was built from (:func:`dependencies_key`).
DEPENDENCIES_ANNOTATION = "io.neuronfleet.dependencies-key"
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


def blobs(layout: Path) -> list[str]:
    """The digests of every blob the layout holds."""
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


def prune_layout(layout: Path, keep: str) -> list[str]:
    """Drop the other images of ``keep``'s repository (its target's) from the layout, and every blob no image
    left uses.

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
    for digest in blobs(layout):
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
