"""The NeuronCores a simulated replica's container was handed, checked as the Neuron runtime checks them.

Where a DRA claim (or the device plugin) hands a container its devices, the Neuron runtime reserves the logical
NeuronCores ``NEURON_RT_VISIBLE_CORES`` names, counted at the setting ``NEURON_LOGICAL_NC_CONFIG`` gives, and a
graph compiled for another setting or for more cores than it was handed does not load. The simulated device
refuses to start in the same cases, so a claim that hands too little fails on a laptop as it would on Neuron.
Without either variable (a replica given no devices) nothing is checked.
"""

from __future__ import annotations

from collections.abc import Mapping

from neuronfleet.contract import dra


def parse_cores(text: str) -> tuple[int, ...]:
    """The cores ``text`` names: indexes and ranges separated by commas ("0-3,8", the runtime's syntax)."""
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"{dra.VISIBLE_CORES_ENV}={text!r}: {part!r} is not a core or a range of them") from None
        if low < 0 or high < low:
            raise ValueError(f"{dra.VISIBLE_CORES_ENV}={text!r}: {part!r} is not a range of cores")
        cores.extend(range(low, high + 1))
    return tuple(cores)


def check_handed_cores(environ: Mapping[str, str], tensor_parallel_size: int, lnc: int) -> tuple[int, ...] | None:
    """The cores handed to a replica sharded over ``tensor_parallel_size`` logical cores compiled at LNC ``lnc``;
    ``None`` when the environment hands none. ValueError, naming both sides, where the runtime would refuse."""
    handed_lnc = environ.get(dra.LNC_ENV)
    if handed_lnc is not None and handed_lnc.strip() != str(lnc):
        raise ValueError(
            f"the container's NeuronCores are set to {dra.LNC_ENV}={handed_lnc}, "
            f"but the replica's graphs are compiled for logical NeuronCores of {lnc}"
        )
    visible = environ.get(dra.VISIBLE_CORES_ENV)
    if visible is None:
        return None
    cores = parse_cores(visible)
    if (handed := len(set(cores))) < tensor_parallel_size:
        raise ValueError(
            f"the container was handed {handed} logical NeuronCores ({dra.VISIBLE_CORES_ENV}={visible}), "
            f"and tensor parallelism {tensor_parallel_size} needs {tensor_parallel_size}"
        )
    return cores
