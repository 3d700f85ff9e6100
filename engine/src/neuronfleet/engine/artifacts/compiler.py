"""Which compiler builds an artifact's graphs: the vLLM Neuron plugin on Neuron, the simulated compiler on sim.

Either is a per-graph step for :func:`neuronfleet.engine.artifacts.store.compile_artifact`: it compiles
one bucket's graph into ``STORE/HASH/neff`` and returns the seconds it took. On the simulated device the
compile also shards the model's weights for the artifact's tensor parallelism (:func:`choose_weights_writer`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.contract.start_time import BF16_BYTES
from neuronfleet.engine.artifacts.store import (
    GRAPHS_DIR,
    ArtifactError,
    BucketEntry,
    ShardedWeights,
    WriteWeights,
    artifact_dir,
)
from neuronfleet.engine.artifacts.weights import simulated_checkpoint, write_shards
from neuronfleet.engine.sim.compiler import simulated_compiler
from neuronfleet.engine.sim.cost_model import CostModel

#: Compiles one graph of the artifact and returns the seconds it took.
CompileBucket = Callable[[BucketEntry], float]


class CompileError(ArtifactError):
    """A compile that cannot run or did not finish: settings the compiler refuses, or an artifact it cannot make."""


def choose_compiler(
    engine: EngineConfig, identity: CompileIdentity, store: str, settings: SimSettings
) -> CompileBucket:
    """The compile step for ``identity``'s device, writing into the local ``store``.

    ``settings`` are the simulated device's (ignored on Neuron); settings its cost model refuses
    (more tensor parallelism than the instance has cores) raise :class:`CompileError`, a store that
    is not a local directory :class:`ArtifactError`.
    """
    if identity.device == "neuron":
        # Only a Neuron compile needs it; it starts vLLM in a subprocess.
        from neuronfleet.engine.artifacts.neuron_compile import neuron_compile_bucket

        return neuron_compile_bucket(engine, identity, store)
    artifact_hash = identity.hash()
    try:
        cost = CostModel(
            get_instance_type(settings.instance_type),
            get_shape(settings.shape),
            engine.tensor_parallel_size,
            logical_neuron_cores=settings.logical_neuron_cores,
        )
    except ValueError as error:
        raise CompileError(str(error)) from None
    graphs = artifact_dir(store, artifact_hash) / GRAPHS_DIR
    return simulated_compiler(cost, sleep=settings.clock == "real", graphs=graphs, seed=artifact_hash)


def choose_weights_writer(
    engine: EngineConfig, identity: CompileIdentity, settings: SimSettings
) -> WriteWeights | None:
    """What writes the weights' shards beside the graphs: on the simulated device, the tiny shape's real shards
    of its checkpoint, or a larger shape's size alone (its reading is modelled); ``None`` on Neuron, whose
    compile does not shard the weights yet (a replica shards them on load)."""
    if identity.device == "neuron":
        return None
    shape = get_shape(settings.shape)
    tensor_parallel_size = engine.tensor_parallel_size

    def write_weights(directory: Path) -> ShardedWeights:
        files = []
        if shape.name == "tiny":
            files = write_shards(simulated_checkpoint(shape), shape, tensor_parallel_size, directory)
        return ShardedWeights(
            tensor_parallel_size=tensor_parallel_size, bytes=shape.num_parameters * BF16_BYTES, files=files
        )

    return write_weights
