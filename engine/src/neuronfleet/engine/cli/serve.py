"""``neuronfleet-engine compile`` and ``serve``: compiled artifacts and vLLM's server."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib.metadata import version as package_version
from pathlib import Path

from pydantic import ValidationError

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import (
    INSTANCE_TYPES,
    InstanceTypeName,
    NeuronTarget,
    get_instance_type,
    largest_instance_type,
)
from neuronfleet.contract.identity import CompileIdentity, ModelSource
from neuronfleet.contract.lora import LoraAdapter, LoraSlots
from neuronfleet.contract.model_shapes import SHAPES, get_shape, served_name, shape_for_model
from neuronfleet.contract.sim_settings import (
    START_TIME_SCALE_ENV,
    STEP_TIMES_ENV,
    ClockMode,
    Device,
    SimSettings,
    StepTimesFrom,
)
from neuronfleet.contract.start_time import weights_store
from neuronfleet.engine.artifacts.adapters import provision_adapter
from neuronfleet.engine.artifacts.provision import ServingArtifact, cache_root, compile_into_store, serving_artifact
from neuronfleet.engine.artifacts.store import ArtifactError
from neuronfleet.engine.cli.artifacts import StderrProgress, outcome_line, refuse_to_serve
from neuronfleet.engine.cli.common import err, fail, fail_validation, load_config, out
from neuronfleet.engine.cli.options import CompileOptions, ServeOptions
from neuronfleet.engine.serving.serve import ServeRequest, exec_vllm_serve
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning.prefill_cap import resolve_prefill_cap


def lora_slots(max_loras: int | None, max_lora_rank: int | None) -> LoraSlots | None:
    """The LoRA slots ``--max-loras`` and ``--max-lora-rank`` ask for; ``None`` without ``--max-loras``."""
    if max_loras is None:
        if max_lora_rank is not None:
            fail("--max-lora-rank needs --max-loras")
        return None
    try:
        rank = {} if max_lora_rank is None else {"max_lora_rank": max_lora_rank}
        return LoraSlots.model_validate({"max_loras": max_loras, **rank})
    except ValidationError as error:
        fail_validation(error)


def check_device(device: Device) -> None:
    """``--device neuron`` needs the vLLM Neuron plugin installed here."""
    if device == "neuron" and importlib.util.find_spec("vllm_neuron") is None:
        fail(
            "--device neuron needs the vLLM Neuron plugin (vllm-neuron), which is not installed here; "
            "--device sim runs the simulated Neuron device"
        )


def compile_identity(
    engine: EngineConfig,
    model: str,
    revision: str,
    target: NeuronTarget,
    image: str | None,
    device: Device,
    logical_neuron_cores: int | None = None,
    lora: LoraSlots | None = None,
) -> CompileIdentity:
    """The artifact identity of serving ``model`` with ``engine`` on ``device``: the function the operator uses."""
    try:
        source = ModelSource(uri=model, revision=revision)
        return CompileIdentity.of(source, engine, target, image or default_image(), device, logical_neuron_cores, lora)
    except ValidationError as error:
        fail_validation(error)


def default_image() -> str:
    """This version's engine image: the identity's default."""
    return f"neuronfleet/engine:{package_version('neuronfleet')}"


def sim_settings(
    model: str,
    target: NeuronTarget,
    shape: str | None,
    instance_type: InstanceTypeName | None,
    clock: ClockMode,
    logical_neuron_cores: int | None = None,
) -> SimSettings:
    """The simulated device's settings, checked: a known shape, an instance of the target's family."""
    shape = shape or shape_for_model(model)
    if shape not in SHAPES:
        fail(f"unknown --shape {shape!r}; known: {', '.join(SHAPES)}")
    instance_type = instance_type or largest_instance_type(target).name
    instance = INSTANCE_TYPES[instance_type]
    if instance.target != target:
        fail(f"--instance-type {instance_type} is not a {target} instance")
    timed_by = step_times_from()
    if timed_by == "scheduler" and clock == "virtual":
        fail(f"{STEP_TIMES_ENV}=scheduler needs --clock real: on the virtual clock no step takes any time to time")
    return SimSettings(
        shape=shape,
        instance_type=instance_type,
        clock=clock,
        logical_neuron_cores=logical_neuron_cores,
        weights_store=weights_store(model),
        start_time_scale=start_time_scale(),
        step_times=timed_by,
    )


def step_times_from() -> StepTimesFrom:
    """Who publishes the simulated device's step times: ``NEURONFLEET_SIM_STEP_TIMES``, else the device."""
    value = os.environ.get(STEP_TIMES_ENV, "device")
    if value not in ("device", "scheduler"):
        fail(f"{STEP_TIMES_ENV}={value!r}: device (the simulated device's) or scheduler (as on a real Neuron device)")
    return "scheduler" if value == "scheduler" else "device"


def start_time_scale() -> float:
    """The share of the modelled start time a simulated replica spends: ``NEURONFLEET_START_TIME_SCALE``, else 1."""
    value = os.environ.get(START_TIME_SCALE_ENV, "1")
    try:
        scale = float(value)
    except ValueError:
        scale = -1.0
    if not 0.0 <= scale <= 1.0:
        fail(f"{START_TIME_SCALE_ENV}={value!r}: a number from 0 to 1 (1: a Neuron replica's full start time)")
    return scale


def step_times(instance_type: str, shape: str, engine: EngineConfig, lnc: int | None = None) -> CostModel:
    """The cost model of a replica of ``shape`` on ``instance_type`` at LNC ``lnc``; a one-line error when it
    cannot exist."""
    try:
        instance = get_instance_type(instance_type)
        return CostModel(instance, get_shape(shape), engine.tensor_parallel_size, logical_neuron_cores=lnc)
    except ValueError as error:
        fail(str(error))


def resolve_on_neuron(
    engine: EngineConfig, model: str, target: NeuronTarget, shape: str | None, instance_type: InstanceTypeName | None
) -> EngineConfig:
    """``auto`` derived from the calibrated cost model of a model whose architecture is known here.

    The cost model predicts Neuron's published step times within 25% (docs/engine.md, "Calibration"). A
    model of another architecture keeps ``auto``, which the scheduler runs as no cap and says so.
    """
    shape = shape or shape_for_model(model)
    if shape not in SHAPES or shape == "tiny":
        return engine
    instance = instance_type or largest_instance_type(target).name
    return resolve_prefill_cap(engine, step_times(instance, shape, engine))


def identity_of(options: CompileOptions, engine: EngineConfig, lora: LoraSlots | None) -> CompileIdentity:
    """The identity of the artifact ``options`` name for ``engine``: the function the operator uses."""
    return compile_identity(
        engine, options.model, options.revision, options.target, options.engine_image, options.device,
        options.logical_neuron_cores, lora,
    )  # fmt: skip


def device_settings(options: CompileOptions) -> SimSettings:
    """The simulated device's settings, checked, on ``--device sim``; the defaults (unread) on Neuron."""
    if options.device != "sim":
        return SimSettings()
    return sim_settings(
        options.model, options.target, options.shape, options.instance_type, options.clock,
        options.logical_neuron_cores,
    )  # fmt: skip


def compile_artifact(options: CompileOptions, _: Sequence[str] = ()) -> None:
    """Compile every bucket's graph into the artifact store; an artifact already complete is not compiled again."""
    check_device(options.device)
    engine = load_config(options.config, None, None, None, None, None)
    lora = lora_slots(options.max_loras, options.max_lora_rank)
    if options.artifact_store is None:
        fail("--artifact-store is required: the directory that holds compiled artifacts")
    identity = identity_of(options, engine, lora)
    if options.artifact_hash is not None and options.artifact_hash != identity.hash():
        fail(f"--artifact-hash {options.artifact_hash} does not match the identity computed here ({identity.hash()})")
    try:
        outcome = compile_into_store(
            engine, identity, options.artifact_store, cache=cache_root(options.cache_dir),
            settings=device_settings(options), progress=StderrProgress(),
        )  # fmt: skip
    except ArtifactError as error:
        fail(str(error))
    out.print(outcome_line(outcome))


def check_ports(port: int, kv_events_port: int | None, kv_events_replay_port: int | None) -> None:
    """Fail unless the HTTP port and the KV events' two ports are three different ports."""
    if kv_events_port is None:
        if kv_events_replay_port is not None:
            fail("--kv-events-replay-port needs --kv-events-port")
        return
    replay = kv_events_port + 1 if kv_events_replay_port is None else kv_events_replay_port
    if len({port, kv_events_port, replay}) < 3:
        fail(
            f"the HTTP port ({port}), the KV events port ({kv_events_port}) and its replay port ({replay}) must differ"
        )


@dataclass(frozen=True)
class ServePlan:
    """What ``serve`` runs, decided from its options alone: checked, ``auto`` resolved, nothing fetched yet."""

    #: The server, but for what the edge fills in: the model's directory, the artifact's and the adapters'.
    request: ServeRequest
    #: The artifact to serve (``None``: compiled at start, on the simulated device only).
    identity: CompileIdentity | None
    adapters: list[LoraAdapter]


def plan_serve(options: ServeOptions, vllm_args: Sequence[str] = ()) -> ServePlan:
    """``serve``'s options checked and resolved into what it runs; bad input is one line and exit 2."""
    check_device(options.device)
    check_ports(options.port, options.kv_events_port, options.kv_events_replay_port)
    engine = load_config(options.config, None, None, None, None, None)
    lora = lora_slots(options.max_loras, options.max_lora_rank)
    name = options.served_model_name or served_name(options.model)
    adapters = parse_adapters(options.lora_adapter or [], lora, name)
    settings = device_settings(options)
    if options.device == "sim":
        # The simulated device's step times are the cost model's: `auto` is derived from them.
        cost = step_times(settings.instance_type, settings.shape, engine, options.logical_neuron_cores)
        engine = resolve_prefill_cap(engine, cost)
    else:
        engine = resolve_on_neuron(engine, options.model, options.target, options.shape, options.instance_type)
    identity = None
    if options.artifact_store is not None:
        identity = identity_of(options, engine, lora)
    elif options.artifact_hash is not None:
        fail("--artifact-hash needs --artifact-store")
    elif options.device == "neuron":
        fail("--device neuron needs --artifact-store: compile with `neuronfleet-engine compile` first")
    request = ServeRequest(
        engine=engine, device=options.device, model=options.model, served_model_name=name, revision=options.revision,
        host=options.host, port=options.port, drain_timeout=options.drain_timeout,
        async_scheduling=options.async_scheduling, sim=settings, kv_events_port=options.kv_events_port,
        kv_events_replay_port=options.kv_events_replay_port, lora=lora, extra_args=tuple(vllm_args),
    )  # fmt: skip
    return ServePlan(request, identity, adapters)


def serve(options: ServeOptions, vllm_args: Sequence[str] = ()) -> None:
    """Serve the OpenAI-compatible API: vLLM's server with the Neuron scheduler. Arguments after -- go to vLLM."""
    planned = plan_serve(options, vllm_args)
    request = planned.request
    directory = None
    sim = request.sim
    if planned.identity is not None:
        artifact = _provision_artifact(options, request.engine, planned.identity, request.sim)
        directory = artifact.directory
        if artifact.weights_from is not None:
            # The replica reads the shards the compile wrote, never the model's checkpoint.
            sim = sim.model_copy(update={"weights_store": artifact.weights_from, "presharded_weights": True})
    exec_vllm_serve(
        replace(
            request,
            sim=sim,
            model=model_to_load(options.model, options.device, request.sim, request.engine),
            artifact_dir=directory,
            adapters=provision_adapters(planned.adapters, options.cache_dir),
        )
    )


def model_to_load(model: str, device: Device, settings: SimSettings, engine: EngineConfig) -> str:
    """What vLLM loads: the model's id or path on Neuron, the simulated shape's local directory on sim."""
    if device != "sim":
        return model.removeprefix("hf://")
    from neuronfleet.engine.sim.model_dir import model_dir

    try:
        return str(model_dir(settings.shape, engine.max_model_len))
    except ValueError as error:
        fail(str(error))


def parse_adapters(values: list[str], slots: LoraSlots | None, model_name: str) -> list[LoraAdapter]:
    """The ``--lora-adapter`` values, checked: well formed, named once, not the model's name, within the slots."""
    try:
        adapters = [LoraAdapter.parse(value) for value in values]
    except ValidationError as error:
        fail_validation(error)
    except ValueError as error:
        fail(str(error))
    names = [adapter.name for adapter in adapters]
    if adapters and slots is None:
        fail("--lora-adapter needs --max-loras: the graphs must be compiled with LoRA slots")
    if slots is not None and len(adapters) > slots.max_loras:
        fail(f"{len(adapters)} LoRA adapters given, but --max-loras {slots.max_loras} slots")
    repeated = sorted({name for name in names if names.count(name) > 1} | ({model_name} & set(names)))
    if repeated:
        fail(f"LoRA adapter names must be unique and differ from the model's ({model_name}): {', '.join(repeated)}")
    return adapters


def provision_adapters(adapters: list[LoraAdapter], cache_dir: Path | None) -> dict[str, Path]:
    """Every adapter in a local folder, checked, by name; one that cannot be served stops the replica."""
    provisioned: dict[str, Path] = {}
    for adapter in adapters:
        try:
            ready = provision_adapter(adapter, cache_root(cache_dir))
        except ArtifactError as error:
            refuse_to_serve(error)
        err.print(f"LoRA adapter {adapter.name}: {ready.directory} (digest {ready.digest[:12]}…)", markup=False)
        provisioned[adapter.name] = ready.directory
    return provisioned


def _provision_artifact(
    options: ServeOptions, engine: EngineConfig, identity: CompileIdentity, settings: SimSettings
) -> ServingArtifact:
    """The artifact to serve, verified in the local cache (compiled first with ``--compile-on-start``)."""
    assert options.artifact_store is not None
    try:
        artifact = serving_artifact(
            engine,
            identity,
            options.artifact_store,
            artifact_hash=options.artifact_hash,
            cache=cache_root(options.cache_dir),
            settings=settings,
            compile_on_start=options.compile_on_start,
            progress=StderrProgress(),
            cache_limit=options.cache_max_bytes,
        )
    except ArtifactError as error:
        refuse_to_serve(error)
    if artifact.compiled is not None and artifact.compiled.uploaded is not None:
        # After the upload's file lines, what was done, as `compile` says it.
        err.print(outcome_line(artifact.compiled), markup=False)
    # The node cache's use lock (artifact.in_use) stays open through vLLM's exec: the copy is not evicted.
    return artifact
