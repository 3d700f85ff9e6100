"""The model's weights pre-sharded for an artifact's tensor parallelism: written by the compile, read by replicas.

A replica that loads a checkpoint shards it for its tensor parallelism on every start (NxD Inference's default
since Neuron 2.23: 187 s of loading for Llama 3.1 405B on trn2, 49 s of it sharding, against 108 s from
pre-sharded files). The compile writes each rank's shard once, into ``STORE/HASH/weights/``, beside the graphs and
checksummed in the manifest with them, so a replica reads its ranks' files and never the checkpoint.

Each rank's file holds the slices of every weight that rank multiplies, split as Megatron-style tensor parallelism
(NxD Inference's layers) splits them:

- column parallel, by output rows: the query, key and value projections (whole heads), the MLP's gate and up
  projections, the embeddings and the output head (by vocabulary rows);
- row parallel, by input columns: the attention's output projection (whole heads) and the MLP's down projection;
- replicated: the norms.

A split that does not divide evenly is padded with zeros to a multiple of the ranks. Attention keeps every query
head beside its group's key/value head (GQA): ranks a multiple of the key/value heads share each one (repeated, as
NxD Inference does), the group's query heads spread over them and padded within the group; otherwise each rank
holds whole groups, padded with groups of zeros (:func:`attention_layout`).

On the simulated device the tiny shape's shards are real: its checkpoint is written here once (deterministic
BF16 values, Llama's tensor names), as the Hub's file would be downloaded. A larger shape's shards are not
written: their size and the time to read them come from the start-time model.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from neuronfleet.contract.model_shapes import ModelShape
from neuronfleet.engine.artifacts.store import ArtifactError
from neuronfleet.engine.paths import user_cache

if TYPE_CHECKING:
    import torch

#: The shards' directory inside an artifact.
WEIGHTS_DIR = "weights"
#: The checkpoint's file name in its directory (a Hub repository's single-file checkpoint).
CHECKPOINT_FILE = "model.safetensors"
#: Bumped when the checkpoint written for a shape changes.
CHECKPOINT_VERSION = 1
#: Spread of the checkpoint's values: a trained Llama's initialisation.
_INIT_STD = 0.02

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")
_ROW = ("o_proj", "down_proj")
_HEADS = ("q_proj", "k_proj", "v_proj", "o_proj")
_KV = ("k_proj", "v_proj")


def shard_name(rank: int, tensor_parallel_size: int) -> str:
    """The file of one rank's shard, relative to the artifact: ``weights/rank-RR-of-TT.safetensors``."""
    return f"{WEIGHTS_DIR}/rank-{rank:02d}-of-{tensor_parallel_size:02d}.safetensors"


def checkpoint_shapes(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Every weight of ``shape``'s checkpoint by its Llama name, with its shape (``[out, in]`` for a matrix)."""
    hidden, heads_width = shape.hidden_size, shape.num_attention_heads * shape.head_dim
    kv_width, mlp = shape.num_key_value_heads * shape.head_dim, shape.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, hidden)}
    for layer in range(shape.num_hidden_layers):
        prefix = f"model.layers.{layer}"
        shapes |= {
            f"{prefix}.self_attn.q_proj.weight": (heads_width, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_width, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_width, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, heads_width),
            f"{prefix}.mlp.gate_proj.weight": (mlp, hidden),
            f"{prefix}.mlp.up_proj.weight": (mlp, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, mlp),
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
        }
    return shapes | {"model.norm.weight": (hidden,), "lm_head.weight": (shape.vocab_size, hidden)}


#: Per rank, the units of a split axis it holds, in order (-1: a unit of zeros, padding).
Layout = tuple[tuple[int, ...], ...]


def even_layout(units: int, tensor_parallel_size: int) -> Layout:
    """``units`` spread evenly over the ranks in order, the last ones padded with zero units to fit."""
    per_rank = math.ceil(units / tensor_parallel_size)
    return tuple(
        tuple(unit if unit < units else -1 for unit in range(rank * per_rank, (rank + 1) * per_rank))
        for rank in range(tensor_parallel_size)
    )


def attention_layout(shape: ModelShape, tensor_parallel_size: int) -> tuple[Layout, Layout]:
    """Per rank, the query heads and the key/value heads it holds: every query head beside its group's key/value
    head. Ranks a multiple of the key/value heads share each one (repeated), its group's query heads spread over
    them and padded within the group; otherwise each rank holds whole groups, padded with zero groups."""
    groups = shape.num_key_value_heads
    per_group = shape.num_attention_heads // groups
    if tensor_parallel_size % groups == 0:
        sharing = tensor_parallel_size // groups
        per_rank = math.ceil(per_group / sharing)
        query, kv = [], []
        for rank in range(tensor_parallel_size):
            group, part = divmod(rank, sharing)
            within = range(part * per_rank, (part + 1) * per_rank)
            query.append(tuple(group * per_group + i if i < per_group else -1 for i in within))
            kv.append((group,))
        return tuple(query), tuple(kv)
    kv_layout = even_layout(groups, tensor_parallel_size)
    query_layout = tuple(
        tuple(group * per_group + i if group >= 0 else -1 for group in held for i in range(per_group))
        for held in kv_layout
    )
    return query_layout, kv_layout


@dataclass(frozen=True)
class Split:
    """How one weight is split over the ranks: along ``axis``, in units of ``unit`` rows or columns (a head, or
    one), each rank holding the units ``layout`` gives it; ``axis`` None: the whole weight on every rank."""

    axis: int | None
    unit: int = 1
    layout: Layout = ()


def split_of(name: str, shape: ModelShape, tensor_parallel_size: int) -> Split:
    """How the weight ``name`` of ``shape`` is split over ``tensor_parallel_size`` ranks."""
    module = name.split(".")[-2]
    dims = checkpoint_shapes(shape)[name]
    if module in _HEADS:
        query, kv = attention_layout(shape, tensor_parallel_size)
        return Split(1 if module in _ROW else 0, shape.head_dim, kv if module in _KV else query)
    if module in _COLUMN:
        return Split(0, 1, even_layout(dims[0], tensor_parallel_size))
    if module in _ROW:
        return Split(1, 1, even_layout(dims[1], tensor_parallel_size))
    return Split(None)


def rank_shapes(shape: ModelShape, tensor_parallel_size: int) -> dict[str, tuple[int, ...]]:
    """Every weight's shape in one rank's shard of ``shape`` at ``tensor_parallel_size`` (every rank's is the same)."""
    shapes = {}
    for name, dims in checkpoint_shapes(shape).items():
        split = split_of(name, shape, tensor_parallel_size)
        sliced = list(dims)
        if split.axis is not None:
            sliced[split.axis] = len(split.layout[0]) * split.unit
        shapes[name] = tuple(sliced)
    return shapes


def shard_tensor(tensor: torch.Tensor, split: Split, tensor_parallel_size: int) -> list[torch.Tensor]:
    """``tensor``'s slice for each rank: the units its layout gives it, zeros where it pads."""
    import torch

    if split.axis is None:
        return [tensor] * tensor_parallel_size
    axis, dims = split.axis, tuple(tensor.shape)
    units = tensor.reshape(*dims[:axis], dims[axis] // split.unit, split.unit, *dims[axis + 1 :])
    zero = torch.zeros_like(units.narrow(axis, 0, 1))
    return [
        torch.cat([units.narrow(axis, unit, 1) if unit >= 0 else zero for unit in held], dim=axis)
        .flatten(axis, axis + 1)
        .contiguous()
        for held in split.layout
    ]


def _write_atomically(tensors: dict[str, torch.Tensor], target: Path, metadata: dict[str, str]) -> None:
    """Write a safetensors file that readers see whole or not at all."""
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(handle)
    try:
        save_file(tensors, temporary, metadata=metadata)
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def write_checkpoint(shape: ModelShape, target: Path) -> None:
    """``shape``'s checkpoint in BF16 at ``target``: deterministic values, the norms at one."""
    import torch

    generator = torch.Generator().manual_seed(CHECKPOINT_VERSION)
    tensors = {
        name: torch.ones(dims) if len(dims) == 1 else torch.randn(dims, generator=generator) * _INIT_STD
        for name, dims in checkpoint_shapes(shape).items()
    }
    _write_atomically({name: tensor.to(torch.bfloat16) for name, tensor in tensors.items()}, target, {})


def simulated_checkpoint(shape: ModelShape, root: Path | None = None) -> Path:
    """The simulated model's checkpoint, as the Hub would hold it, written once under the user cache."""
    path = (root or user_cache("models")) / f"{shape.name}-checkpoint-v{CHECKPOINT_VERSION}" / CHECKPOINT_FILE
    if not path.is_file():
        write_checkpoint(shape, path)
    return path


def write_shards(checkpoint: Path, shape: ModelShape, tensor_parallel_size: int, artifact: Path) -> list[str]:
    """Shard ``checkpoint`` of ``shape`` for ``tensor_parallel_size`` ranks into ``artifact``; return the files."""
    from safetensors.torch import load_file

    try:
        weights = load_file(checkpoint)
    except (OSError, ValueError) as error:
        raise ArtifactError(f"cannot read the checkpoint {checkpoint}: {error}") from None
    expected = checkpoint_shapes(shape)
    found = {name: tuple(tensor.shape) for name, tensor in weights.items()}
    if found != expected:
        raise ArtifactError(f"{checkpoint} is not a {shape.name} checkpoint: its weights' names or shapes differ")
    ranks: list[dict[str, torch.Tensor]] = [{} for _ in range(tensor_parallel_size)]
    for name, tensor in weights.items():
        split = split_of(name, shape, tensor_parallel_size)
        for rank, part in enumerate(shard_tensor(tensor, split, tensor_parallel_size)):
            ranks[rank][name] = part
    names = []
    for rank, tensors in enumerate(ranks):
        names.append(shard_name(rank, tensor_parallel_size))
        metadata = {"rank": str(rank), "tensor_parallel_size": str(tensor_parallel_size), "model": shape.name}
        _write_atomically(tensors, artifact / names[-1], metadata)
    return names


def load_shards(artifact: Path, files: list[str], shape: ModelShape, tensor_parallel_size: int) -> int:
    """Read every rank's shard in ``artifact`` as a replica loads them; refuse one not made for this replica.

    Returns the bytes read. Each file must be its rank's, at this tensor parallelism, with exactly the weights and
    shapes :func:`rank_shapes` gives.
    """
    from safetensors import SafetensorError, safe_open

    wanted = [shard_name(rank, tensor_parallel_size) for rank in range(tensor_parallel_size)]
    if files != wanted:
        raise ArtifactError(f"the artifact at {artifact} holds shards {files}, not the {tensor_parallel_size} wanted")
    expected = rank_shapes(shape, tensor_parallel_size)
    read = 0
    for rank, name in enumerate(files):
        path = artifact / name
        try:
            with safe_open(path, framework="pt") as shard:
                metadata = shard.metadata() or {}
                found = {key: tuple(shard.get_tensor(key).shape) for key in shard.keys()}  # noqa: SIM118
        except (OSError, SafetensorError) as error:
            raise ArtifactError(f"cannot read the shard {path}: {error}") from None
        if metadata.get("rank") != str(rank) or metadata.get("tensor_parallel_size") != str(tensor_parallel_size):
            raise ArtifactError(f"{path} is not rank {rank} of {tensor_parallel_size}: its header says {metadata}")
        if found != expected:
            raise ArtifactError(f"{path} does not hold rank {rank}'s weights of {shape.name}")
        read += path.stat().st_size
    return read
