"""What makes an image rebuild (its content key and the digests that key its installs), what a build keeps
in the layout, and the disk guard; no podman needed."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from neuronfleet.devcluster.images.dockerfile import (
    KEPT_STAGES,
    NEEDED_BYTES,
    NEEDED_BYTES_CACHED,
    build_args,
    prune_before_build,
    stale_temporaries,
)
from neuronfleet.devcluster.images.inputs import (
    INPUT_FILES,
    LOCK_DIGEST_ARG,
    SOURCES_DIGEST_ARG,
    build_digests,
    checkout,
    checkout_key,
    dependencies_key,
    image_key,
    input_files,
    read_inputs,
)
from neuronfleet.devcluster.images.layout import (
    DEPENDENCIES_ANNOTATION,
    NAME_ANNOTATION,
    REF_ANNOTATION,
    holds,
    image_config,
    image_layer_sizes,
    layout_annotations,
    layout_index,
    name_in_layout,
    prune_layout,
)
from neuronfleet.devcluster.images.podman import DiskGuard, Podman

FILES = [("Dockerfile", b"FROM x\n"), ("uv.lock", b"version = 1\n"), ("engine/a.py", b"A = 1\n")]


def test_key_is_stable_and_changes_with_every_input() -> None:
    key = image_key("engine", FILES, "base-1")
    assert key == image_key("engine", list(FILES), "base-1")
    changed_file = [*FILES[:2], ("engine/a.py", b"A = 2\n")]
    renamed_file = [*FILES[:2], ("engine/b.py", b"A = 1\n")]
    added_file = [*FILES, ("operator/b.py", b"")]
    others = {
        image_key("operator", FILES, "base-1"),
        image_key("engine", FILES, "base-2"),
        image_key("engine", changed_file, "base-1"),
        image_key("engine", renamed_file, "base-1"),
        image_key("engine", added_file, "base-1"),
    }
    assert key not in others
    assert len(others) == 5


def test_inputs_are_what_the_build_context_sends(tmp_path: Path) -> None:
    root = checkout()
    found = {str(p) for p in input_files(root)}
    assert set(INPUT_FILES) <= found
    assert "engine/src/neuronfleet/engine/cli/main.py" in found
    assert "engine/src/neuronfleet/contract/config.py" in found
    # The dev harness is no input: only its metadata, which uv reads to check the workspace's lock.
    assert [p for p in found if p.startswith("devcluster/")] == ["devcluster/pyproject.toml"]
    assert not {p for p in found if p.startswith(("tests/", "bench/", ".venv/")) or "__pycache__" in p}
    # Exactly what .dockerignore lets through, so the key covers every byte the Dockerfile can COPY.
    ignore = (root / ".dockerignore").read_text().splitlines()
    sent = {line.removeprefix("!").rstrip("/") for line in ignore if line.startswith("!")}
    assert {p if p.startswith("devcluster/") else p.split("/")[0] for p in found} == sent | {
        "Dockerfile",
        ".dockerignore",
    }


def fake_checkout(root: Path) -> Path:
    for name in INPUT_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    for folder in ("engine", "operator", "devcluster"):
        (root / folder / "__pycache__").mkdir(parents=True, exist_ok=True)
        (root / folder / "m.py").write_text("x = 1\n")
    return root


def test_a_source_edit_changes_the_key(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path / "checkout")
    before = checkout_key("engine", root, "base")
    (root / "engine" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    assert checkout_key("engine", root, "base") == before, "bytecode is no input"
    (root / "devcluster" / "m.py").write_text("x = 2\n")
    assert checkout_key("engine", root, "base") == before, "the dev harness is no input"
    (root / "operator" / "m.py").write_text("x = 2\n")
    assert checkout_key("engine", root, "base") != before


def test_a_source_edit_changes_the_sources_digest_and_not_the_lock_digest(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path / "checkout")
    before = build_digests(read_inputs(root))
    (root / "engine" / "m.py").write_text("x = 1\n\n")
    after_source = build_digests(read_inputs(root))
    assert after_source.lock == before.lock, "the dependencies' install is reused"
    assert after_source.sources != before.sources, "the project is installed again"
    (root / "uv.lock").write_text("version = 2\n")
    after_lock = build_digests(read_inputs(root))
    assert after_lock.lock != after_source.lock
    # The project's install reads the lock stage's files too (uv sync --locked).
    assert after_lock.sources != after_source.sources
    # Every file the lock stage holds counts, and so does each source file's name.
    for name in ("pyproject.toml", "devcluster/pyproject.toml"):
        (root / name).write_text(f"{name} edited")
        assert build_digests(read_inputs(root)).lock != after_lock.lock, name
    edited = build_digests(read_inputs(root))
    (root / "operator" / "m.py").rename(root / "operator" / "n.py")
    assert build_digests(read_inputs(root)).sources != edited.sources
    # The readme is the project's metadata, read only by its install: an edit leaves the dependencies.
    (root / "README.md").write_text("a new readme")
    assert build_digests(read_inputs(root)).lock == edited.lock
    assert build_digests(read_inputs(root)).sources != edited.sources


def test_only_what_uv_resolves_from_keys_the_dependencies(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path / "checkout")
    project = '[project]\nname = "p"\ndependencies = ["a"]\n\n[tool.uv]\ndefault-groups = ["dev"]\n'
    (root / "pyproject.toml").write_text(project + "\n[tool.ruff]\nline-length = 120\n")
    before = build_digests(read_inputs(root))
    deps_before = dependencies_key("engine", read_inputs(root), "base")
    # A linter's table or the packages' folders: the project is installed again, the dependencies are not.
    (root / "pyproject.toml").write_text(
        project + '\n[tool.ruff]\nline-length = 100\n\n[tool.setuptools]\npackage-dir = { "p" = "src/p" }\n'
    )
    edited = build_digests(read_inputs(root))
    assert edited.lock == before.lock
    assert dependencies_key("engine", read_inputs(root), "base") == deps_before
    assert edited.sources != before.sources
    # What uv reads: the project's dependencies and uv's own table.
    for changed in (project.replace('["a"]', '["a", "b"]'), project.replace('"dev"', '"docs"')):
        (root / "pyproject.toml").write_text(changed)
        assert build_digests(read_inputs(root)).lock != before.lock
        assert dependencies_key("engine", read_inputs(root), "base") != deps_before


def test_the_digests_are_passed_as_the_build_arguments_the_dockerfile_declares(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path / "checkout")
    digests = build_digests(read_inputs(root))
    args = build_args("engine", root, "base", "localhost/x:1", digests)
    assert f"--build-arg={LOCK_DIGEST_ARG}={digests.lock}" in args
    assert f"--build-arg={SOURCES_DIGEST_ARG}={digests.sources}" in args
    dockerfile = (checkout() / "Dockerfile").read_text()
    for arg in (LOCK_DIGEST_ARG, SOURCES_DIGEST_ARG):
        assert re.search(rf"^ARG {arg}$", dockerfile, re.MULTILINE), arg


def test_the_kept_stages_are_stages_of_the_dockerfile() -> None:
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", (checkout() / "Dockerfile").read_text(), re.MULTILINE))
    assert {stage for kept in KEPT_STAGES.values() for stage in kept} <= stages - {"operator", "engine"}


def test_the_dependencies_key_ignores_the_sources(tmp_path: Path) -> None:
    root = fake_checkout(tmp_path / "checkout")
    before = dependencies_key("engine", read_inputs(root), "base")
    (root / "engine" / "m.py").write_text("x = 3\n")
    assert dependencies_key("engine", read_inputs(root), "base") == before
    assert dependencies_key("operator", read_inputs(root), "base") != before
    assert dependencies_key("engine", read_inputs(root), "base-2") != before
    # A comment is nothing the layer cache sees; an instruction (or a parser directive) is.
    (root / "Dockerfile").write_text("# a note on why\n" + (root / "Dockerfile").read_text() + "\n# and another\n")
    assert dependencies_key("engine", read_inputs(root), "base") == before
    (root / "Dockerfile").write_text("# syntax=docker/dockerfile:1\n" + (root / "Dockerfile").read_text())
    assert dependencies_key("engine", read_inputs(root), "base") != before
    (root / "Dockerfile").write_text("FROM y\n")
    assert dependencies_key("engine", read_inputs(root), "base") != before


class Layout:
    """A hand-made OCI image layout: JSON and byte blobs, images named in ``index.json``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True)
        (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.index: dict[str, Any] = {"schemaVersion": 2, "manifests": []}
        self.save()

    def save(self) -> None:
        (self.root / "index.json").write_text(json.dumps(self.index))

    def blob(self, data: bytes) -> str:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        (self.root / "blobs" / "sha256" / digest[7:]).write_bytes(data)
        return digest

    def image(self, name: str | None, layers: list[bytes], user: str = "1000:1000") -> dict[str, str]:
        """Write an image of these layers; its manifest's and config's digests, and each layer's."""
        config = self.blob(json.dumps({"config": {"User": user}, "rootfs": {"diff_ids": []}, "n": name}).encode())
        digests = [self.blob(layer) for layer in layers]
        described = [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": len(layer)}
            for digest, layer in zip(digests, layers, strict=True)
        ]
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": 1},
            "layers": described,
        }
        digest = self.blob(json.dumps(manifest).encode())
        entry: dict[str, Any] = {"mediaType": manifest["mediaType"], "digest": digest, "size": 1}
        if name is not None:
            entry["annotations"] = {REF_ANNOTATION: name, NAME_ANNOTATION: name}
        self.index["manifests"].append(entry)
        self.save()
        return {"manifest": digest, "config": config, **{f"layer{i}": layer for i, layer in enumerate(digests)}}

    def blobs(self) -> set[str]:
        return {f"sha256:{path.name}" for path in (self.root / "blobs" / "sha256").iterdir()}


def test_prune_keeps_the_newest_image_of_that_target_and_every_blob_it_shares(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "layout")
    old = layout.image("localhost/neuronfleet/engine:old", [b"base", b"deps", b"project-1"])
    new = layout.image("localhost/neuronfleet/engine:new", [b"base", b"deps", b"project-2"])
    operator = layout.image("localhost/neuronfleet/operator:op", [b"base", b"operator-deps", b"operator"])
    # An image a stopped build saved and never named, and a blob it was writing.
    unnamed = layout.image(None, [b"half"])
    (layout.root / "oci-put-blob12345").write_bytes(b"partial")
    kept = layout.blobs() - {old["manifest"], old["config"], old["layer2"], *unnamed.values()}

    dropped = prune_layout(layout.root, keep="localhost/neuronfleet/engine:new")

    assert dropped == ["localhost/neuronfleet/engine:old", unnamed["manifest"]]
    assert [entry["digest"] for entry in layout_index(layout.root)["manifests"]] == [
        new["manifest"],
        operator["manifest"],
    ]
    assert layout.blobs() == kept
    assert new["layer1"] == old["layer1"] in kept, "the dependencies' layer both builds share stays"
    assert not list(layout.root.glob("oci-put-blob*"))
    assert prune_layout(layout.root, keep="localhost/neuronfleet/engine:new") == []
    assert layout.blobs() == kept


def test_an_image_saved_unnamed_is_named_for_containerd(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "layout")
    other = layout.image("localhost/neuronfleet/operator:op", [b"a"])
    saved = layout.image(None, [b"base", b"deps"])
    name = "localhost/neuronfleet/engine:k1"
    assert not holds(layout.root, name)

    name_in_layout(layout.root, saved["config"], name, {DEPENDENCIES_ANNOTATION: "d1"})

    entries = layout_index(layout.root)["manifests"]
    assert entries[1]["annotations"] == {NAME_ANNOTATION: name, REF_ANNOTATION: name, DEPENDENCIES_ANNOTATION: "d1"}
    assert entries[0]["digest"] == other["manifest"]
    assert holds(layout.root, name)
    assert layout_annotations(layout.root, DEPENDENCIES_ANNOTATION) == {"d1"}
    assert image_layer_sizes(layout.root, name) == {saved["layer0"]: 4, saved["layer1"]: 4}
    # Its manifest gone, the layout no longer holds it (the next build writes it again).
    (layout.root / "blobs" / "sha256" / saved["manifest"][7:]).unlink()
    assert not holds(layout.root, name)


def test_image_config_reads_the_configuration_of_the_named_image(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "layout")
    layout.image("localhost/neuronfleet/operator:op", [b"a"], user="1000:1000")
    layout.image("localhost/neuronfleet/engine:k", [b"b"], user="0:0")
    assert image_config(layout.root, "localhost/neuronfleet/operator:op")["config"]["User"] == "1000:1000"
    assert image_config(layout.root, "localhost/neuronfleet/engine:k")["config"]["User"] == "0:0"
    assert not holds(tmp_path / "nothing-here", "localhost/neuronfleet/engine:k")


def test_a_stopped_build_leaves_no_temporary_blobs_but_the_cache_mounts_stay(tmp_path: Path) -> None:
    for name in ("buildah3646064262", "storage3976748653", "container_images_storage_1", "buildah-cache", "other"):
        (tmp_path / name).mkdir()
    assert [path.name for path in stale_temporaries(tmp_path)] == [
        "buildah3646064262",
        "container_images_storage_1",
        "storage3976748653",
    ]
    assert stale_temporaries(tmp_path / "missing") == []


def test_disk_guard_stops_the_process_group_when_space_runs_low(tmp_path: Path) -> None:
    guard = DiskGuard(tmp_path, minimum=2**62, interval_s=0.1)
    with subprocess.Popen(["sleep", "60"], start_new_session=True) as process:
        guard.watch(process).join(timeout=10)
        assert process.wait(timeout=10) == -15
    assert guard.tripped_at is not None


def test_disk_guard_leaves_a_process_alone_while_space_lasts(tmp_path: Path) -> None:
    guard = DiskGuard(tmp_path, minimum=1, interval_s=0.05)
    with subprocess.Popen(["sleep", "0.5"], start_new_session=True) as process:
        watcher = guard.watch(process)
        assert process.wait(timeout=10) == 0
        watcher.join(timeout=10)
    assert guard.tripped_at is None


def test_cli_refuses_an_unknown_target(run_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    refused = run_cli("neuronfleet-dev", "images", "build", "--target", "nope")
    assert refused.returncode == 2
    assert refused.stderr.strip() == "error: unknown target nope: choose from operator, engine"


def test_podman_run_root_stays_short_for_a_deep_store(tmp_path: Path) -> None:
    deep = tmp_path / ("store-" * 20)
    podman = Podman(deep, tmp_path / "runc")
    # podman refuses a run root longer than 50 characters; a store this deep would have one of 150.
    assert len(str(podman.run_root)) <= 50
    assert podman.argv()[podman.argv().index("--runroot") + 1] == str(podman.run_root)
    assert Podman(tmp_path / "other", tmp_path / "runc").run_root != podman.run_root


def test_a_build_short_of_room_prunes_older_images_only_when_it_reinstalls_the_dependencies() -> None:
    gb = 10**9
    # Reinstalling: the older image's layers are about to be replaced anyway.
    assert prune_before_build(20 * gb, NEEDED_BYTES["engine"], cached=False)
    # Cached: the older image holds the very layer the build reuses; pruning it meant a 10 GB reinstall.
    assert not prune_before_build(14 * gb, NEEDED_BYTES_CACHED, cached=True)
    # Room enough: nothing is pruned before the build.
    assert not prune_before_build(NEEDED_BYTES["engine"], NEEDED_BYTES["engine"], cached=False)
