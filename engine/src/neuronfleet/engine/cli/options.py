"""The options of ``neuronfleet-engine compile`` and ``serve``, each declared once, as typed records.

A command's options are the fields of a frozen dataclass (``CompileOptions``, and ``ServeOptions``, which
adds the server's to them); :func:`command` turns one into a typer command that parses the command line
into that record and hands it to a plain function. The operator renders the same options from
``contract/invocation.py``; ``tests/operator/test_engine_command_line.py`` parses each list it renders here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, TypeVar, get_type_hints

import typer

from neuronfleet.contract.hardware import InstanceTypeName, NeuronTarget
from neuronfleet.contract.identity import ARTIFACT_CACHE_ENV, ARTIFACT_CACHE_LIMIT_ENV
from neuronfleet.contract.model_shapes import SHAPES
from neuronfleet.contract.names import HTTP_PORT, KV_EVENTS_PORT
from neuronfleet.contract.sim_settings import DEVICE_ENV, ClockMode, Device
from neuronfleet.engine.cli.common import AsyncSchedulingOption, ConfigOption

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
        "--shape", help=f"Simulated model shape: {', '.join(SHAPES)}. Default: from --model.", show_default=False
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
CompileOnStartOption = Annotated[
    bool, typer.Option("--compile-on-start", help="Compile a missing or incomplete artifact instead of refusing.")
]
HostOption = Annotated[str, typer.Option(help="Address to listen on.")]
PortOption = Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")]
DrainTimeoutOption = Annotated[
    int, typer.Option("--drain-timeout", min=0, help="Seconds in-flight requests have to finish after SIGTERM.")
]
ServedNameOption = Annotated[
    str | None,
    typer.Option("--served-model-name", help="The model name clients use. Default: from --model.", show_default=False),
]
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
        min=1, max=65535, help="Replay recent KV cache events on this port. Default: --kv-events-port + 1.",
        show_default=False,
    ),
]  # fmt: skip
CacheLimitOption = Annotated[
    int | None,
    typer.Option(
        "--cache-max-bytes",
        envvar=ARTIFACT_CACHE_LIMIT_ENV,
        min=1,
        help="Bytes the artifact cache may hold: before a copy, the artifacts no replica uses are evicted, least "
        "recently used first, until it fits. Default: no bound.",
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


@dataclass(frozen=True)
class CompileOptions:
    """``neuronfleet-engine compile``'s options: what an artifact is (its identity) and where it is kept."""

    config: ConfigOption = None
    device: DeviceOption = "neuron"
    model: ModelOption = DEFAULT_MODEL
    revision: RevisionOption = "main"
    target: TargetOption = "trn2"
    engine_image: ImageOption = None
    artifact_store: StoreOption = None
    artifact_hash: HashOption = None
    cache_dir: CacheOption = None
    shape: ShapeOption = None
    instance_type: InstanceOption = None
    clock: ClockOption = "real"
    logical_neuron_cores: LncOption = None
    max_loras: MaxLorasOption = None
    max_lora_rank: MaxLoraRankOption = None


@dataclass(frozen=True)
class ServeOptions(CompileOptions):
    """``neuronfleet-engine serve``'s options: the artifact's, and the server's."""

    compile_on_start: CompileOnStartOption = False
    host: HostOption = "0.0.0.0"
    port: PortOption = HTTP_PORT
    drain_timeout: DrainTimeoutOption = 30
    async_scheduling: AsyncSchedulingOption = True
    served_model_name: ServedNameOption = None
    kv_events_port: KvEventsPortOption = None
    kv_events_replay_port: KvEventsReplayPortOption = None
    lora_adapter: LoraAdapterOption = None
    cache_max_bytes: CacheLimitOption = None


Options = TypeVar("Options", CompileOptions, ServeOptions)


def command(options: type[Options], run: Callable[[Options, Sequence[str]], None]) -> Callable[..., None]:
    """A typer command whose options are the fields of ``options``: it parses them into that record and calls
    ``run`` with it and the arguments left over (after ``--``); its help is ``run``'s docstring."""
    hints = get_type_hints(options, include_extras=True)
    parameters = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters += [
        inspect.Parameter(field.name, keyword, default=field.default, annotation=hints[field.name])
        for field in fields(options)
    ]

    def parsed(ctx: typer.Context, **values: object) -> None:
        run(options(**values), tuple(ctx.args))  # type: ignore[arg-type]

    parsed.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    parsed.__doc__ = run.__doc__
    parsed.__name__ = run.__name__
    return parsed
