"""``neuronfleet-engine``: the engine's command line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from neuronfleet.contract.buckets import chunk_sizes, get_bucket_for_count
from neuronfleet.engine.cli.common import (
    AsyncSchedulingOption,
    ConfigOption,
    DecodeBuckets,
    MaxModelLen,
    MaxNumBatchedTokens,
    MaxNumSeqs,
    OneLineBadValues,
    OutputOption,
    PrefillBuckets,
    fail,
    load_config,
    out,
)
from neuronfleet.engine.cli.fleet import fleet_app
from neuronfleet.engine.cli.options import CompileOptions, ServeOptions, command
from neuronfleet.engine.cli.recommend import recommend_buckets
from neuronfleet.engine.cli.serve import compile_artifact, serve
from neuronfleet.engine.offline.scenarios import SCENARIOS

# rich_markup_mode=None: help is shown as written. Typer's default reads it as rich markup, where
# `s3://BUCKET[/PREFIX]` is a closing tag and `--help` crashed; no help text can do that again.
app = typer.Typer(
    cls=OneLineBadValues,
    help="The neuronfleet serving engine.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
buckets_app = typer.Typer(help="Validate and inspect compiled bucket sets.", no_args_is_help=True)
app.add_typer(buckets_app, name="buckets")
app.add_typer(fleet_app, name="fleet")


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
    output: OutputOption = "table",
) -> None:
    """Print the effective buckets, and with ``--length N`` the padding a prompt of N tokens gets."""
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
    async_scheduling: AsyncSchedulingOption = True,
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
    from neuronfleet.engine.offline.driver import run_scenario
    from neuronfleet.engine.offline.trace import format_step

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


@app.command("adapter-digest")
def adapter_digest_command(
    folder: Annotated[Path, typer.Argument(help="A LoRA adapter's folder: adapter_config.json and its weights.")],
) -> None:
    """Print a LoRA adapter's digest, for spec.lora.adapters[].sha256 (or --lora-adapter NAME=SOURCE@DIGEST)."""
    from neuronfleet.engine.artifacts.adapters import AdapterError, adapter_digest, check_adapter_folder

    try:
        check_adapter_folder(folder, str(folder))
    except AdapterError as error:
        fail(str(error))
    out.print(adapter_digest(folder))


buckets_app.command("recommend")(recommend_buckets)
app.command("compile")(command(CompileOptions, compile_artifact))
app.command("serve", context_settings={"allow_extra_args": True})(command(ServeOptions, serve))
