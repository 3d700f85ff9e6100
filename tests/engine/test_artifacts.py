"""Compiled artifacts in a store: the manifest, idempotence, resuming, and what serving accepts."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from harness.damage import flip_bytes

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.engine.artifacts.store import (
    MANIFEST,
    ArtifactError,
    BucketEntry,
    OutdatedManifestError,
    StoreError,
    artifact_dir,
    compile_artifact,
    load_for_serving,
    read_manifest,
)

ENGINE = EngineConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=1024)
IDENTITY = CompileIdentity.of(ModelSource(uri="hf://org/model"), ENGINE, "trn2", "neuronfleet/engine:test", "sim")
PREFILL, DECODE = [128, 256, 512], [1, 2, 4]


def one_second(entry: BucketEntry) -> float:
    return 1.0


def test_compile_writes_one_manifest_entry_per_bucket(tmp_path: Path) -> None:
    manifest, compiled = compile_artifact(str(tmp_path), IDENTITY, one_second)
    assert compiled == 6
    assert manifest.complete
    on_disk = json.loads((tmp_path / IDENTITY.hash() / MANIFEST).read_text())
    assert on_disk["hash"] == IDENTITY.hash()
    assert on_disk["identity"] == IDENTITY.document()
    assert on_disk["status"] == "complete"
    assert [(e["kind"], e["size"], e["shape"], e["status"], e["seconds"]) for e in on_disk["buckets"]] == [
        ("prefill", 128, {"batch": 1, "tokens": 128}, "compiled", 1.0),
        ("prefill", 256, {"batch": 1, "tokens": 256}, "compiled", 1.0),
        ("prefill", 512, {"batch": 1, "tokens": 512}, "compiled", 1.0),
        ("decode", 1, {"batch": 1, "tokens": 1}, "compiled", 1.0),
        ("decode", 2, {"batch": 2, "tokens": 1}, "compiled", 1.0),
        ("decode", 4, {"batch": 4, "tokens": 1}, "compiled", 1.0),
    ]


def test_compiling_a_complete_artifact_again_changes_nothing(tmp_path: Path) -> None:
    compile_artifact(str(tmp_path), IDENTITY, one_second)
    before = (tmp_path / IDENTITY.hash() / MANIFEST).read_bytes()

    def never(entry: BucketEntry) -> float:
        raise AssertionError(f"recompiled {entry.kind} {entry.size}")

    manifest, compiled = compile_artifact(str(tmp_path), IDENTITY, never)
    assert compiled == 0
    assert manifest.complete
    assert (tmp_path / IDENTITY.hash() / MANIFEST).read_bytes() == before


def test_an_interrupted_compile_is_incomplete_and_resumes(tmp_path: Path) -> None:
    def fail_on_third(entry: BucketEntry) -> float:
        if entry.size == 512:
            raise RuntimeError("compiler crashed")
        return 1.0

    with pytest.raises(RuntimeError, match="compiler crashed"):
        compile_artifact(str(tmp_path), IDENTITY, fail_on_third)
    directory = artifact_dir(str(tmp_path), IDENTITY.hash())
    with pytest.raises(ArtifactError, match=r"incomplete \(2 of 6 graphs compiled\)"):
        load_for_serving(directory, PREFILL, DECODE)

    compiled_now: list[int] = []

    def record(entry: BucketEntry) -> float:
        compiled_now.append(entry.size)
        return 2.0

    manifest, compiled = compile_artifact(str(tmp_path), IDENTITY, record)
    assert (compiled, compiled_now) == (4, [512, 1, 2, 4])
    assert load_for_serving(directory, PREFILL, DECODE) == manifest


def test_serving_needs_the_configured_decode_contexts(tmp_path: Path) -> None:
    with_contexts = IDENTITY.model_copy(
        update={"engine": IDENTITY.engine.model_copy(update={"decode_context_length_buckets": [256]})}
    )
    manifest, compiled = compile_artifact(str(tmp_path), with_contexts, one_second)
    # The prefills, the decodes at max_model_len and the decodes at 256 tokens of context.
    assert compiled == len(PREFILL) + 2 * len(DECODE)
    assert manifest.compiled_buckets() == (PREFILL, DECODE)
    assert manifest.compiled_decode_contexts() == [256]
    directory = tmp_path / with_contexts.hash()
    assert load_for_serving(directory, PREFILL, DECODE, decode_contexts=[256]) == manifest
    with pytest.raises(
        ArtifactError, match=re.escape("compiled for decode context buckets [256], not the configured []")
    ):
        load_for_serving(directory, PREFILL, DECODE)


def test_serving_needs_a_manifest(tmp_path: Path) -> None:
    message = f"no compiled artifact at {tmp_path} (no manifest.json): run `neuronfleet-engine compile` first"
    with pytest.raises(ArtifactError, match=re.escape(message)):
        load_for_serving(tmp_path, PREFILL, DECODE)


def test_serving_needs_the_configured_buckets(tmp_path: Path) -> None:
    compile_artifact(str(tmp_path), IDENTITY, one_second)
    with pytest.raises(ArtifactError, match=re.escape("compiled for prefill buckets [128, 256, 512]")):
        load_for_serving(tmp_path / IDENTITY.hash(), [512], DECODE)


def test_a_directory_holding_another_artifact_is_refused(tmp_path: Path) -> None:
    compile_artifact(str(tmp_path), IDENTITY, one_second)
    other = CompileIdentity.of(ModelSource(uri="hf://org/other"), ENGINE, "trn2", "neuronfleet/engine:test", "sim")
    (tmp_path / other.hash()).symlink_to(tmp_path / IDENTITY.hash())
    with pytest.raises(ArtifactError, match=f"belongs to another artifact \\({IDENTITY.hash()}\\)"):
        compile_artifact(str(tmp_path), other, one_second)


def test_a_store_directory_is_local(tmp_path: Path) -> None:
    # s3:// stores are copied to a local directory first; other schemes are never directories.
    with pytest.raises(ArtifactError, match="'pvc://claim/neff' is not a local path: give a directory"):
        artifact_dir("pvc://claim/neff", IDENTITY.hash())


def test_an_unreadable_manifest_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ArtifactError, match="is not a valid artifact manifest"):
        read_manifest(tmp_path)


def test_a_complete_manifest_lists_every_file_but_itself_its_lock_and_temporaries(tmp_path: Path) -> None:
    directory = tmp_path / IDENTITY.hash()

    def write_graph(entry: BucketEntry) -> float:
        (directory / "neff").mkdir(parents=True, exist_ok=True)
        (directory / "neff" / f"{entry.kind}-{entry.size}.neff").write_bytes(b"x" * entry.size)
        (directory / "neff" / ".partial.tmp").write_bytes(b"half")
        return 1.0

    manifest, _ = compile_artifact(str(tmp_path), IDENTITY, write_graph)
    assert [(f.path, f.size) for f in manifest.files] == [
        ("neff/decode-1.neff", 1),
        ("neff/decode-2.neff", 2),
        ("neff/decode-4.neff", 4),
        ("neff/prefill-128.neff", 128),
        ("neff/prefill-256.neff", 256),
        ("neff/prefill-512.neff", 512),
    ]
    assert manifest.files[0].sha256 == hashlib.sha256(b"x").hexdigest()
    assert read_manifest(directory) == manifest


def test_serving_checks_every_listed_file_by_size_and_sha256(tmp_path: Path) -> None:
    directory = tmp_path / IDENTITY.hash()

    def write_graph(entry: BucketEntry) -> float:
        (directory / "neff").mkdir(parents=True, exist_ok=True)
        (directory / "neff" / f"{entry.kind}-{entry.size}.neff").write_bytes(bytes(range(256)) * entry.size)
        return 1.0

    manifest, _ = compile_artifact(str(tmp_path), IDENTITY, write_graph)
    assert load_for_serving(directory, PREFILL, DECODE) == manifest
    remedy = f"the artifact is damaged, delete {directory} and compile it again"

    graph = directory / "neff" / "prefill-512.neff"
    flip_bytes(graph)
    found, listed = hashlib.sha256(graph.read_bytes()).hexdigest(), manifest.files[-1].sha256
    with pytest.raises(StoreError) as refused:
        load_for_serving(directory, PREFILL, DECODE)
    assert str(refused.value) == (
        f"{graph} is not the file the manifest lists (SHA-256 {found[:12]}…, expected {listed[:12]}…): {remedy}"
    )
    # A caller that has just checked every file (an s3:// download) does not read them again.
    assert load_for_serving(directory, PREFILL, DECODE, verify_files=False) == manifest

    graph.unlink()
    with pytest.raises(StoreError) as refused:
        load_for_serving(directory, PREFILL, DECODE)
    assert str(refused.value) == f"{graph} is missing: {remedy}"


def test_a_manifest_of_schema_1_is_refused_in_one_line(tmp_path: Path) -> None:
    compile_artifact(str(tmp_path), IDENTITY, one_second)
    directory = tmp_path / IDENTITY.hash()
    # As schema 1 wrote it: no file list to check a copy against.
    old = json.loads((directory / MANIFEST).read_text())
    old["schema_version"] = 1
    del old["files"]
    (directory / MANIFEST).write_text(json.dumps(old))
    line = (
        f"artifact {IDENTITY.hash()} at {directory} has manifest schema version 1; this engine reads version 2 "
        "and later: delete it and compile it again"
    )
    for use in (
        lambda: read_manifest(directory),
        lambda: load_for_serving(directory, PREFILL, DECODE),
        lambda: compile_artifact(str(tmp_path), IDENTITY, one_second),
    ):
        with pytest.raises(OutdatedManifestError) as refused:
            use()
        assert str(refused.value) == line
