"""vLLM platform plugin for the simulated Neuron device.

Registered under vLLM's ``vllm.platform_plugins`` entry point group. vLLM asks
every platform plugin, in every process, whether its platform is present; this
one answers only when ``NEURONFLEET_DEVICE=sim`` is set (the serve command sets
it), so installing neuronfleet changes nothing for any other vLLM use.

The platform is a host (CPU) device to PyTorch; the model never runs on it.
The engine's executor (:mod:`neuronfleet.engine.sim.executor`) does the work.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch
from vllm.exceptions import VLLMValidationError
from vllm.platforms.interface import Platform, PlatformEnum

from neuronfleet.contract.model_shapes import ARCHITECTURE
from neuronfleet.contract.sim_settings import DEVICE_ENV, EXECUTOR_CLS

#: The executor the simulated platform runs vLLM's model execution on.


@functools.cache
def register_model_class() -> None:
    """Register the class of the shapes' architecture with vLLM in this process, imported here.

    vLLM registers its model classes lazily and inspects one (its interfaces: text generation,
    pipeline parallelism, ...) in a fresh Python process, so that importing a model cannot
    initialise CUDA in the server. That process imports torch and vLLM all over again: on a
    2-core host, a third of the start-up (7.6 s of 24 s). Its on-disk cache, under
    ``~/.cache/vllm``, does not help a pod, whose home is a fresh ``emptyDir``. The simulated
    device has no CUDA to protect, so the same class is imported in the server (0.2 s) and
    vLLM inspects it there, with the same result.
    """
    from vllm.model_executor.models import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, ModelRegistry.models[ARCHITECTURE].load_model_cls())


def activate() -> str | None:
    """vLLM's platform plugin hook: the platform's qualified name when the simulated device is chosen."""
    if os.environ.get(DEVICE_ENV) == "sim":
        return f"{__name__}.SimNeuronPlatform"
    return None


class SimNeuronPlatform(Platform):
    """A Neuron device simulated on the host: tensors live in host memory."""

    _enum = PlatformEnum.OOT
    device_name = "neuron-sim"
    device_type = "cpu"
    dispatch_key = "CPU"
    dist_backend = "gloo"
    simple_compile_backend = "eager"

    @classmethod
    def pre_register_and_update(cls, parser: Any = None) -> None:
        """Before vLLM reads the model's architecture: its classes are inspected in this process."""
        register_model_class()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        """A name for logs."""
        return "simulated Neuron device"

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        """Nothing to select on the host."""

    @classmethod
    def manual_seed_all(cls, seed: int) -> None:
        """The simulated device's tokens do not depend on a seed."""

    @classmethod
    def inference_mode(cls) -> Any:
        """Plain no-grad: nothing runs through autograd here."""
        return torch.no_grad()

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        """Host memory is not pinned for a host device."""
        return False

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        """Refuse what the simulated device cannot produce: it has no logits, so no logprobs or grammars."""
        for name in (
            "logprobs",
            "prompt_logprobs",
            "logprob_token_ids",
            "prompt_logprob_token_ids",
            "structured_outputs",
        ):
            if getattr(params, name, None) is not None:
                raise VLLMValidationError(
                    f"{name} is not supported by the simulated Neuron device (it samples without logits)",
                    parameter=name,
                )

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        """Run model execution on the simulated executor, in the engine core process."""
        parallel_config = vllm_config.parallel_config
        backend = parallel_config.distributed_executor_backend
        if backend not in (None, "uni", "mp", EXECUTOR_CLS):
            raise ValueError(f"the simulated Neuron device runs on {EXECUTOR_CLS}, not {backend!r}")
        parallel_config.distributed_executor_backend = EXECUTOR_CLS
