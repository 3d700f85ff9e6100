"""Which device the engine runs on, and the simulated device's settings (carried in ``additional_config``).

The engine core runs in its own process; ``additional_config`` is the part of
vLLM's configuration that travels there untouched, so the serve command puts
the device settings under :data:`SETTINGS_KEY` beside the scheduler's
``neuron_config``. This module depends on pydantic alone.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from neuronfleet.contract.hardware import DEFAULT_INSTANCE_TYPE
from neuronfleet.contract.start_time import StoreKind

#: The ``additional_config`` key holding :class:`SimSettings`.
SETTINGS_KEY = "neuronfleet_sim"
#: Environment variable that activates the simulated platform in every vLLM process.
DEVICE_ENV = "NEURONFLEET_DEVICE"
#: Environment variable setting ``start_time_scale`` for the serve command (tests set 0.01, for example).
START_TIME_SCALE_ENV = "NEURONFLEET_START_TIME_SCALE"
#: Environment variable setting ``step_times`` for the serve command.
STEP_TIMES_ENV = "NEURONFLEET_SIM_STEP_TIMES"
#: vLLM's ``--distributed-executor-backend`` for the simulated device.
EXECUTOR_CLS = "neuronfleet.engine.sim.executor.SimNeuronExecutor"

#: Where the engine runs: a Neuron host with the vLLM Neuron plugin, or the simulated Neuron device.
Device = Literal["sim", "neuron"]

#: How the simulated device keeps time: ``real`` sleeps for each step, ``virtual`` only counts it.
ClockMode = Literal["real", "virtual"]
#: Who publishes the steps' device time and the prefill rate: the simulated device, from its cost model, or (as
#: with a real Neuron device, whose executor reports neither) the scheduler, timing each step.
StepTimesFrom = Literal["device", "scheduler"]


class SimSettings(BaseModel):
    """What the simulated device stands for and how it keeps time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shape: str = Field("tiny", description="Named model shape (see neuronfleet.contract.model_shapes).")
    instance_type: str = Field(DEFAULT_INSTANCE_TYPE, description="Instance type the cost model stands for.")
    clock: ClockMode = Field("real", description="real: sleep for each step's time; virtual: only count it.")
    artifact_dir: str | None = Field(
        None, description="Compiled artifact to load (its manifest fixes the compiled buckets); None: compile now."
    )
    logical_neuron_cores: int | None = Field(
        None, description="Physical NeuronCores per logical core the cost model times (LNC); None: the chip's default."
    )
    weights_store: StoreKind = Field(
        "local", description="Where the weights are fetched from at start (hf, s3, pvc; local: already on the node)."
    )
    presharded_weights: bool = Field(
        False, description="The weights come pre-sharded in the artifact; False: the checkpoint, sharded on load."
    )
    step_times: StepTimesFrom = Field(
        "device",
        description=(
            "device: the device publishes each step's time and its warm-up's prefill rate; scheduler: it publishes "
            "neither, as a real Neuron device's executor does not, and the scheduler times the steps."
        ),
    )
    start_time_scale: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Share of a Neuron replica's modelled start time a real-clock replica spends: 1 is full scale.",
    )


def read_settings(additional_config: Any) -> SimSettings:
    """The simulated device's settings from vLLM's ``additional_config`` (defaults when absent)."""
    section = (additional_config or {}).get(SETTINGS_KEY) or {}
    return SimSettings.model_validate(section)
