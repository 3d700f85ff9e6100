"""``neuronfleet-engine buckets recommend``: the least-padding buckets for a length distribution."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.metrics import PREFILL_CHUNK_TOKENS, PROMPT_TOKENS
from neuronfleet.engine.cli.common import (
    ConfigOption,
    MaxModelLen,
    MaxNumBatchedTokens,
    OutputFormat,
    OutputOption,
    fail,
    load_config,
    out,
)
from neuronfleet.engine.tuning.exposition import ExpositionError, Kind, observed_lengths
from neuronfleet.engine.tuning.recommend import (
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
from neuronfleet.engine.tuning.workloads import WORKLOADS, Workload

#: How long ``--metrics URL`` waits for the engine, and the most it reads.
METRICS_TIMEOUT_S = 10
METRICS_MAX_BYTES = 16 * 1024 * 1024


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


def recommend_buckets(
    count: Annotated[
        int | None,
        typer.Option("--count", "-k", min=1, help="How many prefill buckets to compile.", show_default=False),
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
                f"{PREFILL_CHUNK_TOKENS} histogram, else {PROMPT_TOKENS}."
            ),
            show_default=False,
        ),
    ] = None,
    samples: Annotated[int, typer.Option(min=1, help="Prompts drawn from --distribution.")] = 20_000,
    seed: Annotated[int, typer.Option(help="Seed for --distribution.")] = 0,
    granularity: Annotated[
        int, typer.Option(min=1, help="Every bucket but the last is a multiple of this.")
    ] = DEFAULT_GRANULARITY,
    config: ConfigOption = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    max_model_len: MaxModelLen = None,
    output: OutputOption = "table",
) -> None:
    """Recommend the prefill buckets that waste the least compute on padding for a prompt-length distribution.

    The buckets are exactly optimal for the distribution given; they are compared with
    the power-of-two defaults and with the optimum at the defaults' size.
    """
    if sum(source is not None for source in (lengths, distribution, metrics)) != 1:
        fail("give exactly one of --lengths, --distribution, --metrics")
    if count is None:
        fail("--count is required: how many prefill buckets to compile")
    workload = None
    if distribution is not None:
        workload = WORKLOADS.get(distribution)
        if workload is None:
            fail(f"unknown --distribution {distribution!r}; known: {', '.join(WORKLOADS)}")
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


def print_recommendation(
    source: str, result: Recommendation, configured: BucketSet | None, output: OutputFormat
) -> None:
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
