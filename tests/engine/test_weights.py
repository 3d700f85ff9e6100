"""Weights pre-sharded for an artifact's tensor parallelism: the split, the files the compile writes, and a
replica's load refusing shards that are not its own. Real safetensors files of the tiny model's checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.contract.start_time import BF16_BYTES
from neuronfleet.engine.artifacts.provision import compile_into_store
from neuronfleet.engine.artifacts.store import ArtifactError, load_for_serving
from neuronfleet.engine.artifacts.weights import (
    attention_layout,
    checkpoint_shapes,
    load_shards,
    rank_shapes,
    shard_name,
    split_of,
    write_checkpoint,
    write_shards,
)

TINY = get_shape("tiny")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("checkpoint") / "model.safetensors"
    write_checkpoint(TINY, path)
    return path


def test_the_checkpoint_holds_every_weight_the_shape_counts(checkpoint: Path) -> None:
    weights = load_file(checkpoint)
    assert {name: tuple(tensor.shape) for name, tensor in weights.items()} == checkpoint_shapes(TINY)
    assert sum(tensor.numel() for tensor in weights.values()) == TINY.num_parameters
    assert {tensor.dtype for tensor in weights.values()} == {torch.bfloat16}
    assert checkpoint.stat().st_size >= TINY.num_parameters * BF16_BYTES


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_shards_that_divide_evenly_put_back_together_are_the_checkpoint(
    checkpoint: Path, tmp_path: Path, ranks: int
) -> None:
    files = write_shards(checkpoint, TINY, ranks, tmp_path)
    assert files == [shard_name(rank, ranks) for rank in range(ranks)]
    original = load_file(checkpoint)
    shards = [load_file(tmp_path / name) for name in files]
    expected = rank_shapes(TINY, ranks)
    for shard in shards:
        assert {name: tuple(tensor.shape) for name, tensor in shard.items()} == expected
    for name, tensor in original.items():
        split = split_of(name, TINY, ranks)
        if split.axis is None:
            assert all(torch.equal(shard[name], tensor) for shard in shards), name
        elif name.endswith(("k_proj.weight", "v_proj.weight")) and ranks > TINY.num_key_value_heads:
            # Two key/value heads over four ranks: each head held by the two ranks that share it.
            heads = tensor.reshape(TINY.num_key_value_heads, TINY.head_dim, TINY.hidden_size)
            for rank, shard in enumerate(shards):
                assert torch.equal(shard[name], heads[rank // 2]), (name, rank)
        else:
            assert torch.equal(torch.cat([shard[name] for shard in shards], dim=split.axis), tensor), name


def test_a_split_that_does_not_divide_is_padded_with_zeros_in_whole_heads(checkpoint: Path, tmp_path: Path) -> None:
    """Three ranks: four query heads become six (two each, the last two zero), 128 MLP rows become 129."""
    files = write_shards(checkpoint, TINY, 3, tmp_path)
    original = load_file(checkpoint)
    shards = [load_file(tmp_path / name) for name in files]
    query = "model.layers.0.self_attn.q_proj.weight"
    assert [tuple(shard[query].shape) for shard in shards] == [(2 * TINY.head_dim, TINY.hidden_size)] * 3
    whole = torch.cat([shard[query] for shard in shards])
    assert torch.equal(whole[: 4 * TINY.head_dim], original[query])
    assert not whole[4 * TINY.head_dim :].any(), "padding heads are zero"
    down = "model.layers.1.mlp.down_proj.weight"
    whole = torch.cat([shard[down] for shard in shards], dim=1)
    assert whole.shape == (TINY.hidden_size, 129)
    assert torch.equal(whole[:, :128], original[down])
    assert not whole[:, 128:].any()


@pytest.mark.parametrize("ranks", [3, 4, 8])
def test_every_query_head_sits_beside_its_groups_key_and_value_heads(
    checkpoint: Path, tmp_path: Path, ranks: int
) -> None:
    """Four query heads in two groups: on every rank, each query head held is one of the key/value head's group
    (heads 0-1 with key/value head 0, 2-3 with 1), every head is held somewhere, and padding is zeros."""
    query_layout, kv_layout = attention_layout(TINY, ranks)
    per_group = TINY.num_attention_heads // TINY.num_key_value_heads
    for queries, kvs in zip(query_layout, kv_layout, strict=True):
        assert {q // per_group for q in queries if q >= 0} <= set(kvs), (queries, kvs)
    assert {q for queries in query_layout for q in queries if q >= 0} == set(range(TINY.num_attention_heads))
    files = write_shards(checkpoint, TINY, ranks, tmp_path)
    original = load_file(checkpoint)
    head = TINY.head_dim
    for rank, name in enumerate(files):
        shard = load_file(tmp_path / name)
        for layer in range(TINY.num_hidden_layers):
            prefix = f"model.layers.{layer}.self_attn"
            for slot, q in enumerate(query_layout[rank]):
                held = shard[f"{prefix}.q_proj.weight"][slot * head : (slot + 1) * head]
                out = shard[f"{prefix}.o_proj.weight"][:, slot * head : (slot + 1) * head]
                if q < 0:
                    assert not held.any()
                    assert not out.any()
                else:
                    assert torch.equal(held, original[f"{prefix}.q_proj.weight"][q * head : (q + 1) * head])
                    assert torch.equal(out, original[f"{prefix}.o_proj.weight"][:, q * head : (q + 1) * head])
            for slot, kv in enumerate(kv_layout[rank]):
                held = shard[f"{prefix}.k_proj.weight"][slot * head : (slot + 1) * head]
                expected = original[f"{prefix}.k_proj.weight"][kv * head : (kv + 1) * head]
                assert torch.equal(held, expected) if kv >= 0 else not held.any()


def test_a_replica_loads_its_own_shards_and_refuses_any_other(checkpoint: Path, tmp_path: Path) -> None:
    files = write_shards(checkpoint, TINY, 2, tmp_path)
    assert load_shards(tmp_path, files, TINY, 2) == sum((tmp_path / name).stat().st_size for name in files)
    with pytest.raises(ArtifactError, match="not the 4 wanted"):
        load_shards(tmp_path, files, TINY, 4)
    # Rank 1's file in rank 0's place: its header names its rank.
    shutil.copy(tmp_path / files[1], tmp_path / files[0])
    with pytest.raises(ArtifactError, match=r"rank-00-of-02.safetensors is not rank 0 of 2"):
        load_shards(tmp_path, files, TINY, 2)


def test_a_checkpoint_of_another_shape_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"is not a llama-3\.1-8b checkpoint"):
        write_shards(checkpoint, get_shape("llama-3.1-8b"), 2, tmp_path)


def test_the_compile_writes_the_shards_beside_the_graphs_checksummed_in_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512, tensor_parallel_size=2)
    identity = CompileIdentity.of(ModelSource(uri="hf://neuronfleet/tiny"), engine, "trn2", "engine:test", "sim")
    settings = SimSettings(clock="virtual")
    outcome = compile_into_store(
        engine, identity, str(tmp_path / "store"), cache=tmp_path / "unused", settings=settings, progress=_Quiet()
    )
    directory = tmp_path / "store" / outcome.artifact_hash
    manifest = load_for_serving(directory, [128, 256], [1, 2])
    assert manifest.weights is not None
    assert manifest.weights.files == [shard_name(0, 2), shard_name(1, 2)]
    assert manifest.weights.bytes == TINY.num_parameters * BF16_BYTES
    listed = {entry.path for entry in manifest.files}
    assert set(manifest.weights.files) <= listed, "every shard is checked like a graph"
    assert load_shards(directory, manifest.weights.files, TINY, 2) > TINY.num_parameters * BF16_BYTES / 2


def test_a_large_shape_on_the_simulated_device_records_its_weights_without_writing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    engine = EngineConfig(max_num_seqs=2, max_num_batched_tokens=256, max_model_len=512, tensor_parallel_size=2)
    model = ModelSource(uri="hf://meta-llama/Llama-3.1-8B")
    identity = CompileIdentity.of(model, engine, "trn2", "engine:test", "sim")
    settings = SimSettings(clock="virtual", shape="llama-3.1-8b")
    outcome = compile_into_store(
        engine, identity, str(tmp_path / "store"), cache=tmp_path / "unused", settings=settings, progress=_Quiet()
    )
    manifest = load_for_serving(tmp_path / "store" / outcome.artifact_hash, [128, 256], [1, 2])
    assert manifest.weights is not None
    assert manifest.weights.files == []
    assert manifest.weights.bytes == get_shape("llama-3.1-8b").num_parameters * BF16_BYTES
    assert not (tmp_path / "cache").exists(), "no checkpoint of a large shape is written"


class _Quiet:
    """A provisioning progress that keeps nothing."""

    def compile_started(self, *_: object) -> None: ...
    def graph_compiled(self, *_: object) -> None: ...
    def compile_stopped(self) -> None: ...
    def file_uploaded(self, *_: object) -> None: ...
    def file_downloaded(self, *_: object) -> None: ...
    def evicted(self, *_: object) -> None: ...
