"""The import paths users type keep working after the engine moved into subpackages."""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest
from vllm.utils.import_utils import resolve_obj_by_qualname

from neuronfleet.contract.config import ASYNC_SCHEDULER_CLS, SYNC_SCHEDULER_CLS
from neuronfleet.contract.sim_settings import EXECUTOR_CLS
from neuronfleet.engine.scheduler import neuron
from neuronfleet.engine.sim import executor


@pytest.mark.parametrize(
    ("qualname", "cls"),
    [
        ("neuronfleet.engine.scheduler.NeuronAsyncScheduler", neuron.NeuronAsyncScheduler),
        ("neuronfleet.engine.scheduler.NeuronScheduler", neuron.NeuronScheduler),
    ],
)
def test_scheduler_cls_resolves_as_vllm_resolves_it(qualname: str, cls: type) -> None:
    # vLLM loads --scheduler-cls with this very function.
    assert resolve_obj_by_qualname(qualname) is cls


def test_the_executor_path_the_engine_passes_vllm_resolves() -> None:
    assert resolve_obj_by_qualname(EXECUTOR_CLS) is executor.SimNeuronExecutor


def test_the_engine_renders_the_public_scheduler_paths() -> None:
    assert ASYNC_SCHEDULER_CLS == "neuronfleet.engine.scheduler.NeuronAsyncScheduler"
    assert SYNC_SCHEDULER_CLS == "neuronfleet.engine.scheduler.NeuronScheduler"


@pytest.mark.parametrize(
    ("group", "name"),
    [
        ("console_scripts", "neuronfleet-engine"),
        ("console_scripts", "neuronfleet-operator"),
        ("console_scripts", "neuronfleet-dev"),
        ("vllm.platform_plugins", "neuronfleet_sim"),
        ("vllm.general_plugins", "neuronfleet"),
        ("vllm.endpoint_plugins", "neuronfleet_ready"),
    ],
)
def test_entry_points_load(group: str, name: str) -> None:
    (entry,) = entry_points(group=group, name=name)
    assert callable(entry.load())
