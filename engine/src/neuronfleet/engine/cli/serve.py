"""``neuronfleet-engine compile`` and ``serve``: compiled artifacts and vLLM's server."""

from __future__ import annotations

import importlib.util
import os
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import (
    INSTANCE_TYPES,
    InstanceTypeName,
    NeuronTarget,
    get_instance_type,
    largest_instance_type,
)
from neuronfleet.contract.identity import ARTIFACT_CACHE_ENV, CompileIdentity, ModelSource
from neuronfleet.contract.lora import LoraAdapter, LoraSlots
from neuronfleet.contract.model_shapes import SHAPES, get_shape, served_name, shape_for_model
from neuronfleet.contract.names import HTTP_PORT, KV_EVENTS_PORT
from neuronfleet.contract.sim_settings import DEVICE_ENV, START_TIME_SCALE_ENV, ClockMode, Device, SimSettings
from neuronfleet.contract.start_time import weights_store
from neuronfleet.engine.artifacts.adapters import provision_adapter
from neuronfleet.engine.artifacts.provision import cache_root, compile_into_store, serving_artifact
from neuronfleet.engine.artifacts.store import ArtifactError
from neuronfleet.engine.cli.artifacts import StderrProgress, outcome_line, refuse_to_serve
from neuronfleet.engine.cli.common import (
    AsyncSchedulingOption,
    ConfigOption,
    err,
    fail,
    fail_validation,
    load_config,
    out,
)
from neuronfleet.engine.serving.serve import ServeRequest, exec_vllm_serve
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.tuning.prefill_cap import resolve_prefill_cap

DEFAULT_MODEL = "hf://neuronfleet/tiny"

DeviceOption = Annotated[
    Device,
    typer.Option(
        "--device",
        envvar=DEVICE_ENV,
        help="neuron (a Neuron host with the vLLM Neuron plugin) or sim (the simulated Neuron device).",
    ),
]
ModelOption = Annotated[
    str, typer.Option("--model", help="hf://org/name or s3://bucket/path; on the sim device it picks the shape.")
]
RevisionOption = Annotated[str, typer.Option("--revision", help="Model revision (part of the artifact identity).")]
TargetOption = Annotated[NeuronTarget, typer.Option("--target", help="Neuron target: trn1, trn2, trn3 or inf2.")]
ImageOption = Annotated[
    str | None,
    typer.Option(
        "--engine-image",
        help="Engine image (part of the artifact identity). Default: this version's.",
        show_default=False,
    ),
]
StoreOption = Annotated[
    str | None,
    typer.Option(
        "--artifact-store",
        help="Where compiled artifacts are kept, one per hash: a directory or s3://BUCKET[/PREFIX].",
        show_default=False,
    ),
]
CacheOption = Annotated[
    Path | None,
    typer.Option(
        "--cache-dir",
        envvar=ARTIFACT_CACHE_ENV,
        help="Local copies of s3:// artifacts (compiled here, then uploaded; downloaded before serving). "
        "Default: $XDG_CACHE_HOME/neuronfleet/artifacts (~/.cache by default).",
        show_default=False,
    ),
]
HashOption = Annotated[
    str | None,
    typer.Option(
        "--artifact-hash", help="The artifact's identity hash, checked against the one computed.", show_default=False
    ),
]
ShapeOption = Annotated[
    str | None,
    typer.Option(
        "--shape",
        help=f"Simulated model shape: {', '.join(SHAPES)}. Default: from --model.",
        show_default=False,
    ),
]
InstanceOption = Annotated[
    InstanceTypeName | None,
    typer.Option(
        "--instance-type",
        help=(
            "Instance type the simulated device stands for, or the Neuron host is (its step times derive the "
            "prefill cap, auto). Default: the target's largest."
        ),
        show_default=False,
    ),
]
ClockOption = Annotated[
    ClockMode, typer.Option("--clock", help="Simulated time: real (sleep for each step) or virtual (count only).")
]
LncOption = Annotated[
    int | None,
    typer.Option(
        "--logical-neuron-cores",
        min=1,
        max=2,
        help=(
            "Physical NeuronCores per logical core (LNC) the graphs are compiled for; part of the artifact identity. "
            "Default: the target's (2 on trn2 and trn3; trn1 and inf2 take only 1)."
        ),
        show_default=False,
    ),
]


MaxLorasOption = Annotated[
    int | None,
    typer.Option(
        "--max-loras",
        min=1,
        max=64,
        help="LoRA slots the graphs are compiled with (part of the artifact identity). Default: no LoRA.",
        show_default=False,
    ),
]
MaxLoraRankOption = Annotated[
    int | None,
    typer.Option(
        "--max-lora-rank",
        help="The largest adapter rank a LoRA slot holds: 8, 16, 32, 64, 128 or 256. Default with --max-loras: 16.",
        show_default=False,
    ),
]


LoraAdapterOption = Annotated[
    list[str] | None,
    typer.Option(
        "--lora-adapter",
        help="A LoRA adapter to serve, NAME=SOURCE[@SHA256] (SOURCE: s3://bucket/prefix or a folder); "
        "repeat for more, at most --max-loras.",
        show_default=False,
    ),
]


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
    return SimSettings(
        shape=shape,
        instance_type=instance_type,
        clock=clock,
        logical_neuron_cores=logical_neuron_cores,
        weights_store=weights_store(model),
        start_time_scale=start_time_scale(),
    )


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


def compile_command(
    config: ConfigOption = None,
    model: ModelOption = DEFAULT_MODEL,
    revision: RevisionOption = "main",
    target: TargetOption = "trn2",
    engine_image: ImageOption = None,
    artifact_store: StoreOption = None,
    artifact_hash: HashOption = None,
    cache_dir: CacheOption = None,
    device: DeviceOption = "neuron",
    shape: ShapeOption = None,
    instance_type: InstanceOption = None,
    clock: ClockOption = "real",
    logical_neuron_cores: LncOption = None,
    max_loras: MaxLorasOption = None,
    max_lora_rank: MaxLoraRankOption = None,
) -> None:
    """Compile every bucket's graph into the artifact store; an artifact already complete is not compiled again."""
    check_device(device)
    engine = load_config(config, None, None, None, None, None)
    lora = lora_slots(max_loras, max_lora_rank)
    if artifact_store is None:
        fail("--artifact-store is required: the directory that holds compiled artifacts")
    identity = compile_identity(engine, model, revision, target, engine_image, device, logical_neuron_cores, lora)
    if artifact_hash is not None and artifact_hash != identity.hash():
        fail(f"--artifact-hash {artifact_hash} does not match the identity computed here ({identity.hash()})")
    settings = SimSettings()
    if device == "sim":
        settings = sim_settings(model, target, shape, instance_type, clock, logical_neuron_cores)
    try:
        outcome = compile_into_store(
            engine, identity, artifact_store, cache=cache_root(cache_dir), settings=settings, progress=StderrProgress()
        )
    except ArtifactError as error:
        fail(str(error))
    out.print(outcome_line(outcome))


KvEventsPortOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=65535,
        help=f"Publish KV cache events (blocks cached and evicted, vLLM's format, over ZMQ) on this port, e.g. "
        f"{KV_EVENTS_PORT}, for a prefix-cache-aware router. Default: off.",
        show_default=False,
    ),
]
KvEventsReplayPortOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        max=65535,
        help="Replay recent KV cache events on this port. Default: --kv-events-port + 1.",
        show_default=False,
    ),
]


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


def serve_command(
    ctx: typer.Context,
    config: ConfigOption = None,
    device: DeviceOption = "neuron",
    model: ModelOption = DEFAULT_MODEL,
    revision: RevisionOption = "main",
    target: TargetOption = "trn2",
    engine_image: ImageOption = None,
    artifact_store: StoreOption = None,
    artifact_hash: HashOption = None,
    cache_dir: CacheOption = None,
    compile_on_start: Annotated[
        bool, typer.Option("--compile-on-start", help="Compile a missing or incomplete artifact instead of refusing.")
    ] = False,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = HTTP_PORT,
    drain_timeout: Annotated[
        int, typer.Option("--drain-timeout", min=0, help="Seconds in-flight requests have to finish after SIGTERM.")
    ] = 30,
    async_scheduling: AsyncSchedulingOption = True,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name", help="The model name clients use. Default: from --model.", show_default=False
        ),
    ] = None,
    shape: ShapeOption = None,
    instance_type: InstanceOption = None,
    clock: ClockOption = "real",
    kv_events_port: KvEventsPortOption = None,
    kv_events_replay_port: KvEventsReplayPortOption = None,
    logical_neuron_cores: LncOption = None,
    max_loras: MaxLorasOption = None,
    max_lora_rank: MaxLoraRankOption = None,
    lora_adapter: LoraAdapterOption = None,
) -> None:
    """Serve the OpenAI-compatible API: vLLM's server with the Neuron scheduler. Arguments after -- go to vLLM."""
    check_device(device)
    check_ports(port, kv_events_port, kv_events_replay_port)
    engine = load_config(config, None, None, None, None, None)
    lora = lora_slots(max_loras, max_lora_rank)
    name = served_model_name or served_name(model)
    adapters = parse_adapters(lora_adapter or [], lora, name)
    lnc = logical_neuron_cores
    settings = sim_settings(model, target, shape, instance_type, clock, lnc) if device == "sim" else SimSettings()
    if device == "sim":
        # The simulated device's step times are the cost model's: `auto` is derived from them.
        engine = resolve_prefill_cap(engine, step_times(settings.instance_type, settings.shape, engine, lnc))
    else:
        engine = resolve_on_neuron(engine, model, target, shape, instance_type)
    directory = None
    if artifact_store is not None:
        identity = compile_identity(engine, model, revision, target, engine_image, device, logical_neuron_cores, lora)
        directory = _artifact_directory(
            engine, identity, artifact_store, artifact_hash, cache_dir, settings, compile_on_start
        )
    elif artifact_hash is not None:
        fail("--artifact-hash needs --artifact-store")
    elif device == "neuron":
        fail("--device neuron needs --artifact-store: compile with `neuronfleet-engine compile` first")
    exec_vllm_serve(
        ServeRequest(
            engine=engine,
            device=device,
            model=model_to_load(model, device, settings, engine),
            served_model_name=name,
            revision=revision,
            host=host,
            port=port,
            drain_timeout=drain_timeout,
            async_scheduling=async_scheduling,
            artifact_dir=directory,
            sim=settings,
            kv_events_port=kv_events_port,
            kv_events_replay_port=kv_events_replay_port,
            lora=lora,
            adapters=provision_adapters(adapters, cache_dir),
            extra_args=tuple(ctx.args),
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


def _artifact_directory(
    engine: EngineConfig,
    identity: CompileIdentity,
    store: str,
    artifact_hash: str | None,
    cache_dir: Path | None,
    settings: SimSettings,
    compile_on_start: bool,
) -> Path:
    """The artifact to serve, verified in the local cache (compiled first with ``compile_on_start``)."""
    try:
        artifact = serving_artifact(
            engine,
            identity,
            store,
            artifact_hash=artifact_hash,
            cache=cache_root(cache_dir),
            settings=settings,
            compile_on_start=compile_on_start,
            progress=StderrProgress(),
        )
    except ArtifactError as error:
        refuse_to_serve(error)
    if artifact.compiled is not None and artifact.compiled.uploaded is not None:
        # After the upload's file lines, what was done, as `compile` says it.
        err.print(outcome_line(artifact.compiled), markup=False)
    return artifact.directory
