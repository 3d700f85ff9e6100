"""What makes an image rebuild (its content key), what a build keeps, and the disk guard; no podman needed."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

from neuronfleet.devcluster.images.dockerfile import (
    INPUT_FILES,
    archive_config,
    checkout,
    checkout_key,
    image_key,
    input_files,
    prune,
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
    assert "engine/cli/main.py" in found
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


def test_a_source_edit_changes_the_key(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    for name in INPUT_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    for folder in ("engine", "operator", "devcluster"):
        (root / folder / "__pycache__").mkdir(parents=True, exist_ok=True)
        (root / folder / "m.py").write_text("x = 1\n")
    before = checkout_key("engine", root, "base")
    (root / "engine" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0")
    assert checkout_key("engine", root, "base") == before, "bytecode is no input"
    (root / "devcluster" / "m.py").write_text("x = 2\n")
    assert checkout_key("engine", root, "base") == before, "the dev harness is no input"
    (root / "operator" / "m.py").write_text("x = 2\n")
    assert checkout_key("engine", root, "base") != before


def test_prune_keeps_the_newest_build_of_that_target_alone(tmp_path: Path) -> None:
    for key, target in [("old", "engine"), ("new", "engine"), ("op", "operator")]:
        (tmp_path / key).mkdir()
        (tmp_path / key / f"{target}.oci.tar").write_bytes(b"")
    (tmp_path / "base-1.oci.tar").write_bytes(b"")
    assert prune(tmp_path, "engine", keep="new") == [tmp_path / "old" / "engine.oci.tar"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base-1.oci.tar", "new", "op"]


def test_archive_config_reads_the_image_configuration(tmp_path: Path) -> None:
    config = {"architecture": "amd64", "config": {"User": "1000:1000", "Entrypoint": ["x"]}}
    blobs = {"sha256:c": config, "sha256:m": {"config": {"digest": "sha256:c"}, "layers": []}}
    archive = tmp_path / "image.oci.tar"
    with tarfile.open(archive, "w") as tar:
        members: dict[str, object] = {"index.json": {"manifests": [{"digest": "sha256:m"}]}}
        members |= {f"blobs/sha256/{d.split(':')[1]}": body for d, body in blobs.items()}
        for name, body in members.items():
            data = json.dumps(body).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert archive_config(archive) == config


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
