"""vLLM's executor for the simulated Neuron device.

vLLM takes it through its own extension point (``--distributed-executor-backend
neuronfleet.engine.sim.executor.SimNeuronExecutor``) and runs it inside the
engine core, beside the scheduler. Every call vLLM makes on its workers goes to
one in-process :class:`SimNeuronWorker`, which answers the KV cache questions
from the model shape and the cost model and runs steps on the simulated device.
Steps run on one device thread in order, so under async scheduling the engine
core schedules the next step while the device is busy, as with a real device.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.request import LoRARequest
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.executor.abstract import Executor
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.serial_utils import run_method
from vllm.v1.worker.worker_base import CompilationTimes

from neuronfleet.contract.faults import NeuronRuntimeError, write_termination_message
from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.contract.sim_settings import SimSettings, read_settings
from neuronfleet.contract.start_time import StartTime, predict_start
from neuronfleet.engine.artifacts import store as artifacts
from neuronfleet.engine.artifacts.weights import load_shards
from neuronfleet.engine.scheduler import metrics, vllm_compat
from neuronfleet.engine.scheduler.neuron import read_neuron_config
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.device import Clock, SimulatedNeuronDevice, StepResult
from neuronfleet.engine.sim.faults import FaultInjector, InjectedFault
from neuronfleet.engine.sim.handed_cores import check_handed_cores

logger = init_logger(__name__)

#: The KV cache layout the simulated device reports (vLLM's NHD).
KV_CACHE_LAYOUT = "LBNHC"
_DTYPE_BYTES = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4}


class SimNeuronWorker:
    """The one worker of a simulated replica: answers vLLM's worker calls."""

    def __init__(self, vllm_config: VllmConfig, settings: SimSettings) -> None:
        self.vllm_config = vllm_config
        self.settings = settings
        model_config = vllm_config.model_config
        self.shape = get_shape(settings.shape)
        # vLLM has resolved "auto" and names to a torch dtype by now.
        self.dtype = model_config.dtype if isinstance(model_config.dtype, torch.dtype) else torch.bfloat16
        self.cost = CostModel(
            instance=get_instance_type(settings.instance_type),
            shape=self.shape,
            tensor_parallel_size=vllm_config.parallel_config.tensor_parallel_size,
            dtype_bytes=_DTYPE_BYTES.get(self.dtype, 2),
            logical_neuron_cores=settings.logical_neuron_cores,
        )
        # The cores this container was handed, refused where the Neuron runtime would refuse them.
        lnc = settings.logical_neuron_cores or self.cost.instance.chip.default_lnc
        handed = check_handed_cores(os.environ, self.cost.tensor_parallel_size, lnc)
        if handed is not None:
            logger.info("Simulated runtime: reserving logical NeuronCores %s at LNC=%d", list(handed), lnc)
        self.block_size = vllm_config.cache_config.block_size
        neuron_config = read_neuron_config(vllm_config.additional_config)
        self.max_prefills_per_step = int(neuron_config.get("max_prefills_per_step", 1))
        self.engine_buckets = (
            list(neuron_config["num_batched_tokens_buckets"]),
            list(neuron_config["num_seqs_buckets"]),
        )
        #: Decode contexts below max_model_len (vLLM Neuron's ``decode_context_length_buckets``).
        self.decode_contexts = list(neuron_config.get("decode_context_length_buckets") or [])
        self.clock = Clock(settings.clock)
        self.faults = FaultInjector()
        self.device: SimulatedNeuronDevice | None = None
        self._pending: ModelRunnerOutput | None = None
        self.kv_cache_config: KVCacheConfig | None = None
        #: Loaded LoRA adapters' ranks by vLLM's adapter id.
        self.adapter_ranks: dict[int, int] = {}
        #: Bytes of the compiled artifact's files, loaded onto the device at start (none when compiled at load).
        self.graphs_bytes = 0

    # Start-up ---------------------------------------------------------------------

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """One full-attention KV spec per layer, with the whole replica's KV heads."""
        spec = FullAttentionSpec(
            block_size=self.block_size,
            # Every head the replica holds: a KV head replicated over several cores takes HBM on each.
            num_kv_heads=self.cost.kv_heads_held,
            head_size=self.shape.head_dim,
            dtype=self.dtype,
        )
        return {f"model.layers.{i}.self_attn.attn": spec for i in range(self.shape.num_hidden_layers)}

    def get_supported_kv_cache_layouts(self) -> list[str]:
        """The layouts the device's attention supports."""
        return [KV_CACHE_LAYOUT]

    def set_kv_cache_layout(self, kv_cache_layout: str, cp_kv_cache_interleave_size: int = 1) -> None:
        """The engine core's resolved layout: nothing to lay out on a simulated device.

        vLLM 0.29 passes the layout alone (the differences are listed in ``vllm_compat``).
        """

    def determine_available_memory(self) -> int:
        """HBM for the KV cache, capped at what ``max_num_seqs`` full-length requests need
        (:meth:`CostModel.simulated_kv_cache_bytes`)."""
        memory_utilization = vllm_compat.gpu_memory_utilization(self.vllm_config.cache_config)
        if self.cost.kv_cache_bytes(memory_utilization) <= 0:
            raise ValueError(
                f"{self.shape.name} ({self.cost.weight_bytes / 2**30:.1f} GiB of weights) does not fit "
                f"{self.settings.instance_type} at tensor_parallel_size {self.cost.tensor_parallel_size} "
                f"({self.cost.hbm_bytes / 2**30:.1f} GiB of HBM)"
            )
        return self.cost.simulated_kv_cache_bytes(
            memory_utilization,
            block_size=self.block_size,
            max_num_seqs=self.vllm_config.scheduler_config.max_num_seqs,
            max_model_len=self.vllm_config.model_config.max_model_len,
        )

    def initialize_from_config(self, kv_cache_configs: list[KVCacheConfig]) -> None:
        """Load the compiled artifact (or compile now) and make the device."""
        # The executor passes every worker's configuration; this is the only worker.
        kv_cache_config = kv_cache_configs[0]
        self.kv_cache_config = kv_cache_config
        prefill_buckets, decode_buckets = self.engine_buckets
        if self.settings.artifact_dir is not None:
            # `serve` checked every file before vLLM started: they are not read twice.
            manifest = artifacts.load_for_serving(
                self.settings.artifact_dir,
                prefill_buckets,
                decode_buckets,
                decode_contexts=self.decode_contexts,
                verify_files=False,
            )
            prefill_buckets, decode_buckets = manifest.compiled_buckets()
            graphs = f"{artifacts.GRAPHS_DIR}/"
            self.graphs_bytes = sum(entry.size for entry in manifest.files if entry.path.startswith(graphs))
            logger.info("Loaded compiled artifact %s from %s", manifest.hash, self.settings.artifact_dir)
            if manifest.weights is not None and manifest.weights.files:
                self._load_shards(Path(self.settings.artifact_dir), manifest.weights.files)
        else:
            entries = artifacts.planned_buckets(prefill_buckets, decode_buckets, self.decode_contexts)
            logger.info("No artifact given: compiling %d graphs now", len(entries))
            self.clock.advance(sum(self.cost.compile_seconds(entry.size) for entry in entries))
        max_model_len = self.vllm_config.model_config.max_model_len
        self.device = SimulatedNeuronDevice(
            self.cost,
            block_size=self.block_size,
            prefill_buckets=prefill_buckets,
            decode_buckets=decode_buckets,
            decode_context_buckets=[*self.decode_contexts, max_model_len],
            clock=self.clock,
            on_step=self._record_step,
            max_prefills_per_step=self.max_prefills_per_step,
            faults=self.faults,
            adapter_ranks=self.adapter_ranks,
        )
        logger.info(
            "Simulated Neuron device: %s on %s, tensor parallel %d, %s clock; prefill buckets %s, decode buckets %s, "
            "decode contexts %s; KV cache %d blocks",
            self.shape.name,
            self.settings.instance_type,
            self.cost.tensor_parallel_size,
            self.settings.clock,
            prefill_buckets,
            decode_buckets,
            [*self.decode_contexts, max_model_len],
            kv_cache_config.num_blocks,
        )

    def _record_step(self, step: StepResult) -> None:
        """Publish a device step's time, unless the scheduler times the steps (as on a real Neuron device)."""
        assert self.device is not None
        if self.settings.step_times == "device":
            metrics.record_device_step(step.kind, step.seconds, self.device.prefill_buckets[-1])

    def _load_shards(self, artifact: Path, files: list[str]) -> None:
        """Read the weights' shards as a replica loads them onto its ranks (the tiny shape's are real)."""
        read = load_shards(artifact, files, self.shape, self.cost.tensor_parallel_size)
        logger.info("Loaded the weights pre-sharded for %d ranks: %d files, %d bytes", len(files), len(files), read)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        """Start as a Neuron replica would before it serves: fetch, load and shard the weights, load the graphs,
        run each graph once (:mod:`neuronfleet.contract.start_time`); on a real clock, scaled by
        ``start_time_scale``. Graphs are compiled ahead of time (or at load), so nothing compiles here."""
        assert self.device is not None, "initialize_from_config makes the device first"
        start = self.modelled_start()
        spent = start.scaled(self.settings.start_time_scale if self.settings.clock == "real" else 0.0)
        metrics.record_start(spent.phases(), self.settings.weights_store, presharded=self.settings.presharded_weights)
        if self.settings.step_times == "device":
            metrics.record_prefill_rate(
                self.cost.prefill_tokens_per_s(self.device.prefill_buckets), self.device.prefill_buckets[-1]
            )
        logger.info(
            "Replica start, as a Neuron replica of %s from %s (%s) takes %s; spent %s (start_time_scale %g, %s clock)",
            self.shape.name,
            self.settings.weights_store,
            "weights pre-sharded" if self.settings.presharded_weights else "checkpoint sharded on load",
            start.describe(),
            f"{spent.total_s:.1f} s",
            self.settings.start_time_scale,
            self.settings.clock,
        )
        time.sleep(spent.total_s)
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def modelled_start(self) -> StartTime:
        """This replica's start at full scale: its weights from its store, its graphs, a step of each graph."""
        assert self.device is not None, "initialize_from_config makes the device first"
        device = self.device
        warmup = self.cost.warmup_seconds(device.prefill_buckets, device.decode_buckets, device.decode_context_buckets)
        return predict_start(
            self.cost.weight_bytes,
            self.settings.weights_store,
            graphs_bytes=self.graphs_bytes,
            warmup_s=warmup,
            presharded=self.settings.presharded_weights,
        )

    def get_supported_tasks(self) -> tuple[str, ...]:
        """Text generation only."""
        return ("generate",)

    # Steps --------------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        """Run the step; its tokens are handed over by :meth:`sample_tokens` (vLLM's two-phase step)."""
        assert self.device is not None, "initialize_from_config runs before any step"
        try:
            result = self.device.execute(scheduler_output)
        except NeuronRuntimeError as error:
            # The engine core dies of this (vLLM's way with a failed step); first say why, where it stays.
            message = write_termination_message(error)
            metrics.record_device_fault(error.status, self.device.prefill_buckets[-1])
            logger.error("%s; this replica stops", message)
            raise
        if result.kind == "empty":
            return result.output
        self._pending = result.output
        return None

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        """The tokens of the step :meth:`execute_model` ran (grammars are not applied)."""
        output, self._pending = self._pending, None
        assert output is not None, "sample_tokens follows a non-empty execute_model"
        return output

    def inject_fault(self, fault: dict[str, Any]) -> None:
        """Take ``fault`` (an :class:`InjectedFault`) on the next step: the fault endpoint's call."""
        injected = InjectedFault.model_validate(fault)
        self.faults.inject(injected)
        logger.warning("Fault injected into the simulated device: %s", injected.model_dump_json())

    # LoRA adapters -------------------------------------------------------------------

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Load an adapter into the device's slots: its ``adapter_config.json`` read and checked as vLLM's LoRA
        manager does (rank within ``max_lora_rank``, no bias); a full set of slots is vLLM's to avoid."""
        lora_config = self.vllm_config.lora_config
        assert lora_config is not None, "vLLM adds adapters only with --enable-lora"
        if lora_request.lora_int_id not in self.adapter_ranks:
            helper = PEFTHelper.from_local_dir(lora_request.lora_path, self.vllm_config.model_config.max_model_len)
            helper.validate_legal(lora_config)
            self.adapter_ranks[lora_request.lora_int_id] = vllm_compat.adapter_rank(helper)
            logger.info(
                "LoRA adapter %s (rank %d) loaded from %s",
                lora_request.lora_name,
                self.adapter_ranks[lora_request.lora_int_id],
                lora_request.lora_path,
            )
        return True

    def remove_lora(self, lora_id: int) -> bool:
        """Free an adapter's slot."""
        removed = self.adapter_ranks.pop(lora_id, None) is not None
        return removed

    def pin_lora(self, lora_id: int) -> bool:
        """Adapters stay loaded until removed: pinning changes nothing."""
        return lora_id in self.adapter_ranks

    def list_loras(self) -> set[int]:
        """The adapters loaded."""
        return set(self.adapter_ranks)

    def take_draft_token_ids(self) -> None:
        """No speculative decoding."""
        return None

    def supports_draft_weight_updates(self) -> bool:
        """No draft model, so none to update (vLLM 0.29's engine core asks at start-up)."""
        return False

    # Housekeeping vLLM calls on every worker ---------------------------------------

    def reset_mm_cache(self) -> None:
        """No multimodal cache."""

    def reset_encoder_cache(self) -> None:
        """No encoder cache."""

    def shutdown(self) -> None:
        """Nothing to release."""


class SimNeuronExecutor(Executor):
    """Runs one :class:`SimNeuronWorker` in the engine core, its steps on a device thread."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        settings = read_settings(self.vllm_config.additional_config)
        self.worker = SimNeuronWorker(self.vllm_config, settings)
        # One thread: steps complete in the order they were submitted, as on a device queue.
        self._device_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="neuron-sim")

    def collective_rpc(  # type: ignore[override]
        self,
        method: str | Callable[..., Any],
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
    ) -> list[Any] | Future[list[Any]]:
        """Call ``method`` on the worker, on the device thread behind any queued step."""

        def call() -> list[Any]:
            return [run_method(self.worker, method, args, kwargs or {})]

        future = self._device_thread.submit(call)
        return future if non_block else future.result(timeout)

    def execute_model(  # type: ignore[override]
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | Future[ModelRunnerOutput | None] | None:
        """Queue a step on the device."""
        future = self._device_thread.submit(self.worker.execute_model, scheduler_output)
        return future if non_block else future.result()

    def sample_tokens(  # type: ignore[override]
        self, grammar_output: GrammarOutput | None, non_block: bool = False
    ) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        """Queue the hand-over of the last step's tokens, behind that step."""
        future = self._device_thread.submit(self.worker.sample_tokens, grammar_output)
        return future if non_block else future.result()

    def check_health(self) -> None:
        """Healthy while the engine core runs."""

    def shutdown(self) -> None:
        """Stop the device thread once queued steps finish."""
        self._device_thread.shutdown(wait=True)

    @classmethod
    def supports_async_scheduling(cls) -> bool:
        """Steps are queued on the device thread, so the engine core may schedule ahead."""
        return True
