"""``neuronfleet-engine``: the engine's command line."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.error
import urllib.request
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any, NoReturn, cast, get_args

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from neuronfleet.engine.artifacts import (
    ArtifactError,
    BucketEntry,
    Manifest,
    artifact_dir,
    compile_artifact,
    is_complete,
    load_for_serving,
    simulated_compiler,
)
from neuronfleet.engine.buckets import chunk_sizes, get_bucket_for_count
from neuronfleet.engine.config import EngineConfig
from neuronfleet.engine.cost_model import INSTANCE_TYPES, CostModel, get_instance_type
from neuronfleet.engine.exposition import ExpositionError, Kind, observed_lengths
from neuronfleet.engine.identity import CompileIdentity, ModelSource, NeuronTarget
from neuronfleet.engine.model_shapes import SHAPES, get_shape
from neuronfleet.engine.recommend import (
    DEFAULT_GRANULARITY,
    BucketSet,
    Histogram,
    Recommendation,
    RecommendError,
    bucket_set,
    chunk_histogram,
    prompt_histogram,
    recommend,
)
from neuronfleet.engine.scenarios import SCENARIOS
from neuronfleet.engine.serve import Device, ServeRequest, exec_vllm_serve, served_name, shape_for_model
from neuronfleet.engine.sim_settings import Clock, SimSettings
from neuronfleet.engine.workloads import WORKLOADS, Workload

#: Exit status for input that is unreadable or breaks a rule.
EXIT_INVALID = 2
#: How long ``--metrics URL`` waits for the engine, and the most it reads.
METRICS_TIMEOUT_S = 10
METRICS_MAX_BYTES = 16 * 1024 * 1024

app = typer.Typer(help="The neuronfleet serving engine.", no_args_is_help=True, pretty_exceptions_enable=False)
buckets_app = typer.Typer(help="Validate and inspect compiled bucket sets.", no_args_is_help=True)
app.add_typer(buckets_app, name="buckets")

# soft_wrap: an error line stays one line, however long its path.
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigOption = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="Engine configuration file (YAML or JSON).", show_default=False),
]
MaxNumSeqs = Annotated[int | None, typer.Option(help="Overrides max_num_seqs.", show_default=False)]
MaxNumBatchedTokens = Annotated[int | None, typer.Option(help="Overrides max_num_batched_tokens.", show_default=False)]
MaxModelLen = Annotated[int | None, typer.Option(help="Overrides max_model_len.", show_default=False)]
PrefillBuckets = Annotated[
    str | None,
    typer.Option("--num-batched-tokens-buckets", help="Comma-separated prefill buckets.", show_default=False),
]
DecodeBuckets = Annotated[
    str | None, typer.Option("--num-seqs-buckets", help="Comma-separated decode buckets.", show_default=False)
]


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit with the invalid-input status."""
    err.print(f"error: {message}", markup=False)
    raise typer.Exit(EXIT_INVALID)


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping (JSON is YAML) from ``path``."""
    try:
        text = path.read_text()
    except OSError as error:
        fail(f"cannot read {path}: {error.strerror or error}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        fail(f"{path} is not valid YAML or JSON{where}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        fail(f"{path} must hold a mapping of engine settings, got {type(data).__name__}")
    return data


def parse_int_list(flag: str, text: str) -> list[int] | str:
    """Parse ``"1,2,4"``; anything else is passed on as given, so validation names the rule."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        fail(f"{flag} must be comma-separated integers, got {text!r}")


def format_validation_errors(error: ValidationError) -> list[str]:
    """One ``field: message`` line per error, without pydantic's decoration."""
    lines = []
    for detail in error.errors(include_url=False):
        field = ".".join(str(part) for part in detail["loc"]) or "config"
        message = detail["msg"]
        if detail["type"] == "value_error":
            message = str(detail["ctx"]["error"])
        elif detail["type"] == "extra_forbidden":
            message = "unknown setting"
        lines.append(f"{field}: {message}")
    return lines


def load_config(
    config: Path | None,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_model_len: int | None,
    num_batched_tokens_buckets: str | None,
    num_seqs_buckets: str | None,
) -> EngineConfig:
    """Build the configuration from a file and flags (flags win); exit 2 with every error."""
    settings: dict[str, Any] = read_config_file(config) if config is not None else {}
    overrides: dict[str, Any] = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_model_len": max_model_len,
    }
    if num_batched_tokens_buckets is not None:
        overrides["num_batched_tokens_buckets"] = parse_int_list(
            "--num-batched-tokens-buckets", num_batched_tokens_buckets
        )
    if num_seqs_buckets is not None:
        overrides["num_seqs_buckets"] = parse_int_list("--num-seqs-buckets", num_seqs_buckets)
    settings.update({key: value for key, value in overrides.items() if value is not None})
    try:
        return EngineConfig.model_validate(settings)
    except ValidationError as error:
        for line in format_validation_errors(error):
            err.print(line, markup=False)
        raise typer.Exit(EXIT_INVALID) from None


@buckets_app.command("validate")
def validate(
    config: ConfigOption = None,
    max_num_seqs: MaxNumSeqs = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    max_model_len: MaxModelLen = None,
    num_batched_tokens_buckets: PrefillBuckets = None,
    num_seqs_buckets: DecodeBuckets = None,
) -> None:
    """Check a configuration's buckets; print every error (exit 2) or the effective buckets (exit 0)."""
    engine = load_config(
        config, max_num_seqs, max_num_batched_tokens, max_model_len, num_batched_tokens_buckets, num_seqs_buckets
    )
    out.print("valid")
    out.print(f"num_batched_tokens_buckets: {engine.effective_num_batched_tokens_buckets}")
    out.print(f"num_seqs_buckets: {engine.effective_num_seqs_buckets}")


@buckets_app.command("show")
def show(
    config: ConfigOption = None,
    max_num_seqs: MaxNumSeqs = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    max_model_len: MaxModelLen = None,
    num_batched_tokens_buckets: PrefillBuckets = None,
    num_seqs_buckets: DecodeBuckets = None,
    length: Annotated[
        int | None,
        typer.Option("--length", min=1, help="Show how a prompt of this many tokens is chunked and padded."),
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
) -> None:
    """Print the effective buckets, and with ``--length N`` the padding a prompt of N tokens gets."""
    if output not in ("table", "json"):
        fail(f"--output must be table or json, got {output!r}")
    engine = load_config(
        config, max_num_seqs, max_num_batched_tokens, max_model_len, num_batched_tokens_buckets, num_seqs_buckets
    )
    prefill = engine.effective_num_batched_tokens_buckets
    chunks = []
    if length is not None:
        if length > engine.max_model_len:
            fail(f"--length {length} exceeds max_model_len ({engine.max_model_len})")
        for size in chunk_sizes(length, engine.effective_max_num_batched_tokens):
            bucket = get_bucket_for_count(size, prefill)
            chunks.append({"tokens": size, "bucket": bucket, "padding": bucket - size})
    if output == "json":
        document: dict[str, Any] = {
            "max_num_batched_tokens": engine.effective_max_num_batched_tokens,
            "num_batched_tokens_buckets": prefill,
            "num_seqs_buckets": engine.effective_num_seqs_buckets,
        }
        if length is not None:
            document["length"] = length
            document["chunks"] = chunks
        out.print_json(json.dumps(document))
        return
    out.print(f"effective max_num_batched_tokens: {engine.effective_max_num_batched_tokens}")
    out.print(f"num_batched_tokens_buckets: {prefill}")
    out.print(f"num_seqs_buckets: {engine.effective_num_seqs_buckets}")
    if length is not None:
        table = Table(title=f"prompt of {length} tokens")
        for column in ("chunk", "tokens", "bucket", "padding"):
            table.add_column(column, justify="right")
        for index, chunk in enumerate(chunks):
            table.add_row(str(index), str(chunk["tokens"]), str(chunk["bucket"]), str(chunk["padding"]))
        total_padding = sum(chunk["padding"] for chunk in chunks)
        total_padded = sum(chunk["bucket"] for chunk in chunks)
        out.print(table)
        out.print(f"padding: {total_padding} of {total_padded} computed tokens ({total_padding / total_padded:.1%})")


@app.command("trace")
def trace(
    scenario: Annotated[
        str | None, typer.Option("--scenario", "-s", help="Scenario to run; --list shows them.", show_default=False)
    ] = None,
    list_scenarios: Annotated[bool, typer.Option("--list", help="List the scenarios and exit.")] = False,
    async_scheduling: Annotated[
        bool,
        typer.Option(
            "--async-scheduling/--no-async-scheduling", help="NeuronAsyncScheduler (default) or NeuronScheduler."
        ),
    ] = True,
) -> None:
    """Run a scripted workload through the real vLLM scheduler; print one line per step."""
    if list_scenarios:
        for name, known in SCENARIOS.items():
            out.print(f"{name:<14} {known.summary}")
        return
    if scenario is None:
        fail("give --scenario NAME (or --list)")
    chosen = SCENARIOS.get(scenario)
    if chosen is None:
        fail(f"unknown scenario {scenario!r}; choose one of: {', '.join(SCENARIOS)}")
    # vLLM's start-up chatter would drown the trace; its warnings still show.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # vLLM takes seconds to import: only a trace that runs pays for it.
    from neuronfleet.engine.offline import run_scenario
    from neuronfleet.engine.trace import format_step

    engine_config = chosen.engine
    scheduler_name = "NeuronAsyncScheduler" if async_scheduling else "NeuronScheduler"
    out.print(f"scenario {chosen.name}: {chosen.summary}")
    out.print(
        f"{scheduler_name}; max_num_seqs {engine_config.max_num_seqs}, max_num_batched_tokens "
        f"{engine_config.max_num_batched_tokens}, max_model_len {engine_config.max_model_len}; "
        f"prefill buckets {engine_config.effective_num_batched_tokens_buckets}, "
        f"decode buckets {engine_config.effective_num_seqs_buckets}"
    )
    engine = run_scenario(chosen, async_scheduling=async_scheduling)
    for record in engine.steps:
        out.print(format_step(record, engine_config.effective_num_seqs_buckets))
    outputs = ", ".join(f"{req_id} {len(p.output_tokens)}" for req_id, p in engine.progress.items())
    out.print(f"finished: {outputs} tokens; padding tokens {engine.scheduler.total_padding_tokens}")


def read_lengths_file(path: Path) -> list[int]:
    """Prompt lengths from a file: one integer a line, or a JSON list of integers."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        fail(f"cannot read {path}: {getattr(error, 'strerror', None) or error}")
    if text.lstrip().startswith("["):
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            fail(f"{path} is not a valid JSON list: {error.msg} at line {error.lineno}")
        if not isinstance(values, list):
            fail(f"{path} must hold a JSON list of prompt lengths")
        for index, value in enumerate(values):
            if not isinstance(value, int) or isinstance(value, bool):
                fail(f"{path}[{index}]: expected an integer prompt length, got {value!r}")
        return values
    lengths = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            lengths.append(int(line))
        except ValueError:
            fail(f"{path} line {number}: expected an integer prompt length, got {line.strip()!r}")
    return lengths


def read_metrics(source: str) -> str:
    """Prometheus text from an ``http(s)://`` URL (a running engine's /metrics) or a file."""
    if not source.startswith(("http://", "https://")):
        try:
            return Path(source).read_text()
        except (OSError, UnicodeDecodeError) as error:
            fail(f"cannot read {source}: {getattr(error, 'strerror', None) or error}")
    try:  # only http(s) gets here: urlopen would also read file:// and others
        with urllib.request.urlopen(source, timeout=METRICS_TIMEOUT_S) as response:
            body: bytes = response.read(METRICS_MAX_BYTES)
        return body.decode()
    except urllib.error.HTTPError as error:
        fail(f"cannot fetch {source}: HTTP {error.code} {error.reason}")
    except (urllib.error.URLError, OSError) as error:
        fail(f"cannot fetch {source}: {getattr(error, 'reason', None) or error}")
    except UnicodeDecodeError:
        fail(f"{source} did not answer with text")


def set_document(buckets: BucketSet) -> dict[str, Any]:
    """A bucket set as JSON."""
    return {"count": buckets.count, "buckets": buckets.buckets, "padding_waste": round(buckets.padding_waste, 6)}


def recommendation_notes(result: Recommendation) -> list[str]:
    """What a reader of the figures should know that the figures do not say."""
    notes = []
    if result.recommended.count < result.requested_count:
        notes.append(
            f"asked for {result.requested_count} buckets, but only {result.useful_sizes} sizes can matter for this "
            f"distribution at granularity {result.granularity}; all of them are recommended"
        )
    if not result.defaults_are_on_granularity:
        notes.append(
            f"the default buckets are not all multiples of {result.granularity}, so the optimum under that "
            "granularity may waste more than they do"
        )
    return notes


@buckets_app.command("recommend")
def recommend_buckets(
    count: Annotated[
        int | None, typer.Option("--count", "-k", help="How many prefill buckets to compile.", show_default=False)
    ] = None,
    lengths: Annotated[
        Path | None,
        typer.Option("--lengths", help="Prompt lengths: one integer a line, or a JSON list.", show_default=False),
    ] = None,
    distribution: Annotated[
        str | None,
        typer.Option("--distribution", help=f"A named workload: {', '.join(WORKLOADS)}.", show_default=False),
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            help=(
                "A running engine's Prometheus metrics (http(s) URL or file): the "
                "neuronfleet:prefill_chunk_tokens histogram, else vllm:request_prompt_tokens."
            ),
            show_default=False,
        ),
    ] = None,
    samples: Annotated[int, typer.Option(help="Prompts drawn from --distribution.")] = 20_000,
    seed: Annotated[int, typer.Option(help="Seed for --distribution.")] = 0,
    granularity: Annotated[
        int, typer.Option(help="Every bucket but the last is a multiple of this.")
    ] = DEFAULT_GRANULARITY,
    config: ConfigOption = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    max_model_len: MaxModelLen = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table or json.")] = "table",
) -> None:
    """Recommend the prefill buckets that waste the least compute on padding for a prompt-length distribution.

    The buckets are exactly optimal for the distribution given; they are compared with
    the power-of-two defaults and with the optimum at the defaults' size.
    """
    if output not in ("table", "json"):
        fail(f"--output must be table or json, got {output!r}")
    if sum(source is not None for source in (lengths, distribution, metrics)) != 1:
        fail("give exactly one of --lengths, --distribution, --metrics")
    if count is None:
        fail("--count is required: how many prefill buckets to compile")
    if count < 1:
        fail(f"--count must be at least 1, got {count}")
    if granularity < 1:
        fail(f"--granularity must be at least 1, got {granularity}")
    workload = None
    if distribution is not None:
        workload = WORKLOADS.get(distribution)
        if workload is None:
            fail(f"unknown --distribution {distribution!r}; known: {', '.join(WORKLOADS)}")
        if samples < 1:
            fail(f"--samples must be at least 1, got {samples}")
        if config is None:
            # A workload comes with the limits it is meant for, unless a configuration says otherwise.
            if max_num_batched_tokens is None:
                max_num_batched_tokens = workload.max_num_batched_tokens
            if max_model_len is None:
                max_model_len = workload.max_model_len
    engine = load_config(config, None, max_num_batched_tokens, max_model_len, None, None)
    try:
        source, chunks = read_chunks(engine, workload, samples, seed, lengths, metrics)
        result = recommend(chunks, count, engine.effective_max_num_batched_tokens, granularity)
    except (RecommendError, ExpositionError) as error:
        fail(str(error))
    configured = None
    if engine.num_batched_tokens_buckets is not None:
        configured = bucket_set(chunks, list(engine.num_batched_tokens_buckets))
    print_recommendation(source, result, configured, output)


def read_chunks(
    engine: EngineConfig, workload: Workload | None, samples: int, seed: int, lengths: Path | None, metrics: str | None
) -> tuple[str, Histogram]:
    """The prefill chunk histogram from whichever source was given, and a line saying where it came from."""
    limits = (engine.max_num_batched_tokens, engine.max_model_len)
    if workload is not None:
        prompts = prompt_histogram(workload.sample(samples, seed, engine.max_model_len))
        return f"{samples} prompts of workload {workload.name} (seed {seed})", chunk_histogram(prompts, *limits)
    if lengths is not None:
        prompts = prompt_histogram(read_lengths_file(lengths))
        return f"{sum(prompts.values())} prompts from {lengths}", chunk_histogram(prompts, *limits)
    assert metrics is not None  # exactly one source, checked by the caller
    observed = observed_lengths(
        read_metrics(metrics), max_chunk=engine.effective_max_num_batched_tokens, max_prompt=engine.max_model_len
    )
    total = sum(observed.histogram.values())
    source = f"{total} {observed.kind.value} from {observed.metric} at {metrics} (at histogram bucket bounds)"
    if observed.kind is Kind.PROMPTS:
        return source, chunk_histogram(observed.histogram, *limits)
    return source, observed.histogram


def print_recommendation(source: str, result: Recommendation, configured: BucketSet | None, output: str) -> None:
    """The recommendation as a table, or JSON, ending with the line to paste into a configuration."""
    yaml_line = f"num_batched_tokens_buckets: {result.recommended.buckets}"
    notes = recommendation_notes(result)
    if output == "json":
        document: dict[str, Any] = {
            "source": source,
            "effective_max_num_batched_tokens": result.effective_max,
            "granularity": result.granularity,
            "chunks": result.chunks,
            "tokens": result.tokens,
            "requested_count": result.requested_count,
            "recommended": set_document(result.recommended),
            "optimal_at_default_count": set_document(result.optimal_at_default_count),
            "default": set_document(result.default),
            "configured": set_document(configured) if configured is not None else None,
            "notes": notes,
            "yaml": yaml_line,
        }
        out.print_json(json.dumps(document))
        return
    out.print(f"source: {source}", markup=False)
    out.print(
        f"prefill: {result.chunks} chunks, {result.tokens} tokens; "
        f"effective max_num_batched_tokens {result.effective_max}, granularity {result.granularity}"
    )
    table = Table(title="padding waste: share of padded prefill compute spent on padding")
    table.add_column("bucket set")
    table.add_column("count", justify="right")
    table.add_column("buckets")
    table.add_column("waste", justify="right")
    rows = [
        ("recommended", result.recommended),
        ("optimal at default count", result.optimal_at_default_count),
        ("default (powers of two)", result.default),
    ]
    if configured is not None:
        rows.append(("configured", configured))
    for name, buckets in rows:
        table.add_row(name, str(buckets.count), str(buckets.buckets), f"{buckets.padding_waste:.2%}")
    out.print(table)
    for note in notes:
        out.print(f"note: {note}", markup=False)
    out.print(yaml_line)


# Serving and compiling ----------------------------------------------------------------

#: Exit status when the compiled artifact to serve is missing or incomplete.
EXIT_NO_ARTIFACT = 3
DEFAULT_MODEL = "hf://neuronfleet/tiny"

DeviceOption = Annotated[
    str,
    typer.Option(
        "--device",
        envvar="NEURONFLEET_DEVICE",
        help="neuron (a Neuron host with the vLLM Neuron plugin) or sim (the simulated Neuron device).",
    ),
]
ModelOption = Annotated[
    str, typer.Option("--model", help="hf://org/name or s3://bucket/path; on the sim device it picks the shape.")
]
RevisionOption = Annotated[str, typer.Option("--revision", help="Model revision (part of the artifact identity).")]
TargetOption = Annotated[str, typer.Option("--target", help="Neuron target: trn2 or inf2 (trn1: neuron device only).")]
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
    typer.Option("--artifact-store", help="Directory that holds compiled artifacts, one per hash.", show_default=False),
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
        help="Simulated model shape: tiny, llama-3.1-8b, llama-3.1-70b. Default: from --model.",
        show_default=False,
    ),
]
InstanceOption = Annotated[
    str | None,
    typer.Option(
        "--instance-type",
        help="Instance type the simulated device stands for. Default: TARGET.48xlarge.",
        show_default=False,
    ),
]
ClockOption = Annotated[
    str, typer.Option("--clock", help="Simulated time: real (sleep for each step) or virtual (count only).")
]


def check_device(device: str) -> Device:
    """``sim`` or ``neuron``; anything else is bad input."""
    if device == "sim":
        return "sim"
    if device == "neuron":
        return "neuron"
    fail(f"--device must be sim or neuron, got {device!r}")


def compile_identity(
    engine: EngineConfig, model: str, revision: str, target: str, image: str | None
) -> CompileIdentity:
    """The artifact identity of serving ``model`` with ``engine``: the function the operator uses."""
    if target not in get_args(NeuronTarget):
        fail(f"--target must be one of {', '.join(get_args(NeuronTarget))}, got {target!r}")
    try:
        source = ModelSource(uri=model, revision=revision)
        return CompileIdentity.of(source, engine, cast(NeuronTarget, target), image or default_image())
    except ValidationError as error:
        for line in format_validation_errors(error):
            err.print(line, markup=False)
        raise typer.Exit(EXIT_INVALID) from None


def default_image() -> str:
    """This version's engine image: the identity's default."""
    return f"neuronfleet/engine:{package_version('neuronfleet')}"


def sim_settings(model: str, target: str, shape: str | None, instance_type: str | None, clock: str) -> SimSettings:
    """The simulated device's settings, checked: a known shape, an instance of the target's family, a clock."""
    shape = shape or shape_for_model(model)
    if shape not in SHAPES:
        fail(f"unknown --shape {shape!r}; known: {', '.join(SHAPES)}")
    if target not in ("trn2", "inf2"):
        fail(f"the simulated device models trn2 and inf2, not --target {target}")
    instance_type = instance_type or f"{target}.48xlarge"
    instance = INSTANCE_TYPES.get(instance_type)
    if instance is None:
        fail(f"unknown --instance-type {instance_type!r}; known: {', '.join(INSTANCE_TYPES)}")
    if instance.family != target:
        fail(f"--instance-type {instance_type} is not a {target} instance")
    if clock not in ("real", "virtual"):
        fail(f"--clock must be real or virtual, got {clock!r}")
    return SimSettings(shape=shape, instance_type=instance_type, clock=cast(Clock, clock))


def run_compile(
    engine: EngineConfig, identity: CompileIdentity, store: str, device: Device, settings: SimSettings | None
) -> tuple[Manifest, int]:
    """Compile the artifact into ``store``, with a progress bar on stderr; one line and exit 2 on failure."""
    if device == "neuron":
        from neuronfleet.engine.neuron_compile import neuron_compile_bucket

        compile_bucket = neuron_compile_bucket(engine, identity, store)
    else:
        assert settings is not None
        try:
            cost = CostModel(
                get_instance_type(settings.instance_type), get_shape(settings.shape), engine.tensor_parallel_size
            )
        except ValueError as error:
            fail(str(error))
        compile_bucket = simulated_compiler(cost, sleep=settings.clock == "real")
    artifact_hash = identity.hash()
    progress = Progress(
        TextColumn("compiling artifact {task.fields[artifact]}: {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        # Nothing to show for an artifact that is already complete.
        disable=is_complete_quietly(store, artifact_hash),
    )
    total = len(engine.effective_num_batched_tokens_buckets) + len(engine.effective_num_seqs_buckets)
    with progress:
        task = progress.add_task("", total=total, artifact=artifact_hash)

        def on_bucket(entry: BucketEntry, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, description=f"{entry.kind} {entry.size}")

        try:
            return compile_artifact(store, identity, device, compile_bucket, on_bucket)
        except ArtifactError as error:
            fail(str(error))


def is_complete_quietly(store: str, artifact_hash: str) -> bool:
    """Whether the artifact is complete; an unreadable one is not (compiling says why)."""
    try:
        return is_complete(store, artifact_hash)
    except ArtifactError:
        return False


@app.command("compile")
def compile_command(
    config: ConfigOption = None,
    model: ModelOption = DEFAULT_MODEL,
    revision: RevisionOption = "main",
    target: TargetOption = "trn2",
    engine_image: ImageOption = None,
    artifact_store: StoreOption = None,
    artifact_hash: HashOption = None,
    device: DeviceOption = "neuron",
    shape: ShapeOption = None,
    instance_type: InstanceOption = None,
    clock: ClockOption = "real",
) -> None:
    """Compile every bucket's graph into the artifact store; an artifact already complete is not compiled again."""
    chosen = check_device(device)
    engine = load_config(config, None, None, None, None, None)
    if artifact_store is None:
        fail("--artifact-store is required: the directory that holds compiled artifacts")
    identity = compile_identity(engine, model, revision, target, engine_image)
    if artifact_hash is not None and artifact_hash != identity.hash():
        fail(f"--artifact-hash {artifact_hash} does not match the identity computed here ({identity.hash()})")
    settings = sim_settings(model, target, shape, instance_type, clock) if chosen == "sim" else None
    manifest, compiled = run_compile(engine, identity, artifact_store, chosen, settings)
    where = f"{artifact_store.rstrip('/')}/{manifest.hash}"
    if compiled:
        out.print(
            f"compiled {compiled} of {len(manifest.buckets)} graphs: artifact {manifest.hash} complete at {where}"
        )
    else:
        out.print(f"artifact {manifest.hash} already complete at {where}: nothing to compile")


@app.command("serve", context_settings={"allow_extra_args": True})
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
    compile_on_start: Annotated[
        bool, typer.Option("--compile-on-start", help="Compile a missing or incomplete artifact instead of refusing.")
    ] = False,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    drain_timeout: Annotated[
        int, typer.Option("--drain-timeout", help="Seconds in-flight requests have to finish after SIGTERM.")
    ] = 30,
    async_scheduling: Annotated[
        bool,
        typer.Option(
            "--async-scheduling/--no-async-scheduling", help="NeuronAsyncScheduler (default) or NeuronScheduler."
        ),
    ] = True,
    served_model_name: Annotated[
        str | None,
        typer.Option(
            "--served-model-name", help="The model name clients use. Default: from --model.", show_default=False
        ),
    ] = None,
    shape: ShapeOption = None,
    instance_type: InstanceOption = None,
    clock: ClockOption = "real",
) -> None:
    """Serve the OpenAI-compatible API: vLLM's server with the Neuron scheduler. Arguments after -- go to vLLM."""
    chosen = check_device(device)
    engine = load_config(config, None, None, None, None, None)
    if not 1 <= port <= 65535:
        fail(f"--port must be between 1 and 65535, got {port}")
    if drain_timeout < 0:
        fail(f"--drain-timeout must not be negative, got {drain_timeout}")
    settings = sim_settings(model, target, shape, instance_type, clock) if chosen == "sim" else SimSettings()
    if chosen == "neuron" and importlib.util.find_spec("vllm_neuron") is None:
        fail("--device neuron needs the vLLM Neuron plugin (vllm-neuron), which is not installed here")
    directory = None
    if artifact_store is not None:
        identity = compile_identity(engine, model, revision, target, engine_image)
        directory = serving_artifact(
            engine, identity, artifact_store, artifact_hash, chosen, settings, compile_on_start
        )
    elif artifact_hash is not None:
        fail("--artifact-hash needs --artifact-store")
    elif chosen == "neuron":
        fail("--device neuron needs --artifact-store: compile with `neuronfleet-engine compile` first")
    model_to_load = model.removeprefix("hf://")
    if chosen == "sim":
        from neuronfleet.engine.model_dir import model_dir

        try:
            model_to_load = str(model_dir(settings.shape, engine.max_model_len))
        except ValueError as error:
            fail(str(error))
    exec_vllm_serve(
        ServeRequest(
            engine=engine,
            device=chosen,
            model=model_to_load,
            served_model_name=served_model_name or served_name(model),
            revision=revision,
            host=host,
            port=port,
            drain_timeout=drain_timeout,
            async_scheduling=async_scheduling,
            artifact_dir=directory,
            sim=settings,
            extra_args=tuple(ctx.args),
        )
    )


def serving_artifact(
    engine: EngineConfig,
    identity: CompileIdentity,
    store: str,
    artifact_hash: str | None,
    device: Device,
    settings: SimSettings,
    compile_on_start: bool,
) -> Path:
    """The directory of the complete artifact to serve; exit 3 when it is missing or incomplete."""
    wanted = artifact_hash or identity.hash()
    buckets = (engine.effective_num_batched_tokens_buckets, engine.effective_num_seqs_buckets)
    try:
        directory = artifact_dir(store, wanted)
        try:
            load_for_serving(directory, *buckets)
        except ArtifactError:
            if not compile_on_start:
                raise
            if wanted != identity.hash():
                fail(f"cannot compile artifact {wanted}: the identity computed here is {identity.hash()}")
            run_compile(engine, identity, store, device, settings if device == "sim" else None)
    except ArtifactError as error:
        err.print(f"error: {error}", markup=False)
        raise typer.Exit(EXIT_NO_ARTIFACT) from None
    return directory
