"""Which compiler builds an artifact's graphs: the vLLM Neuron plugin on Neuron, the simulated compiler on sim.

Either is a per-graph step for :func:`neuronfleet.engine.artifacts.store.compile_artifact`: it compiles
one bucket's graph into ``STORE/HASH/neff`` and returns the seconds it took.
"""

from __future__ import annotations

from collections.abc import Callable

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.identity import CompileIdentity
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.contract.sim_settings import SimSettings
from neuronfleet.engine.artifacts.store import GRAPHS_DIR, ArtifactError, BucketEntry, artifact_dir
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
