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

A split that does not divide evenly is padded with zeros to a multiple of the ranks (whole heads for attention);
key and value heads fewer than the ranks are repeated so that each rank holds one, as NxD Inference does for GQA.

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


@dataclass(frozen=True)
class Split:
    """How one weight is split over the ranks: along ``axis`` in whole units of ``unit`` (a head, or one)."""

    axis: int | None
    unit: int = 1
    #: Key or value heads: repeated rather than padded when fewer than the ranks.
    repeat_heads: bool = False

    def units(self, dims: tuple[int, ...]) -> int:
        """How many whole units the split axis holds."""
        assert self.axis is not None
        return dims[self.axis] // self.unit

    def units_per_rank(self, dims: tuple[int, ...], tensor_parallel_size: int) -> int:
        """Units each rank holds: all of them spread evenly, padded (or key/value heads repeated) to fit."""
        units = self.units(dims)
        if self.repeat_heads and units < tensor_parallel_size and tensor_parallel_size % units == 0:
            return 1
        return math.ceil(units / tensor_parallel_size)


def split_of(name: str, shape: ModelShape) -> Split:
    """How the weight ``name`` of ``shape`` is split (its axis ``None``: replicated on every rank)."""
    module = name.split(".")[-2]
    unit = shape.head_dim if module in _HEADS else 1
    if module in _COLUMN:
        return Split(0, unit, repeat_heads=module in _KV)
    if module in _ROW:
        return Split(1, unit)
    return Split(None)


def rank_shapes(shape: ModelShape, tensor_parallel_size: int) -> dict[str, tuple[int, ...]]:
    """Every weight's shape in one rank's shard of ``shape`` at ``tensor_parallel_size`` (every rank's is the same)."""
    shapes = {}
    for name, dims in checkpoint_shapes(shape).items():
        split = split_of(name, shape)
        if split.axis is None:
            shapes[name] = dims
            continue
        sliced = list(dims)
        sliced[split.axis] = split.units_per_rank(dims, tensor_parallel_size) * split.unit
        shapes[name] = tuple(sliced)
    return shapes


def shard_tensor(tensor: torch.Tensor, split: Split, tensor_parallel_size: int) -> list[torch.Tensor]:
    """``tensor``'s slice for each rank, padded with zeros (or key/value heads repeated) where the ranks need."""
    import torch

    if split.axis is None:
        return [tensor] * tensor_parallel_size
    dims = tuple(tensor.shape)
    units, per_rank = split.units(dims), split.units_per_rank(dims, tensor_parallel_size)
    if per_rank * tensor_parallel_size != units:
        heads = tensor.reshape(*dims[: split.axis], units, split.unit, *dims[split.axis + 1 :])
        if split.repeat_heads and tensor_parallel_size % units == 0:
            heads = heads.repeat_interleave(tensor_parallel_size // units, dim=split.axis)
        else:
            padding = list(heads.shape)
            padding[split.axis] = per_rank * tensor_parallel_size - units
            heads = torch.cat([heads, heads.new_zeros(padding)], dim=split.axis)
        tensor = heads.flatten(split.axis, split.axis + 1)
    return [part.contiguous() for part in tensor.chunk(tensor_parallel_size, dim=split.axis)]


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
        for rank, part in enumerate(shard_tensor(tensor, split_of(name, shape), tensor_parallel_size)):
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
