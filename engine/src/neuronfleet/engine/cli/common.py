"""What every ``neuronfleet-engine`` command shares: output, errors, reading a configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from typer.core import TyperGroup

from neuronfleet.contract.config import EngineConfig

#: Exit status for input that is unreadable or breaks a rule.
EXIT_INVALID = 2

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
OutputFormat = Literal["table", "json"]
OutputOption = Annotated[OutputFormat, typer.Option("--output", "-o", help="table or json.")]
AsyncSchedulingOption = Annotated[
    bool,
    typer.Option("--async-scheduling/--no-async-scheduling", help="NeuronAsyncScheduler (default) or NeuronScheduler."),
]


class OneLineBadValues(TyperGroup):
    """Commands whose option values typer checks (types, choices, ranges).

    A value typer refuses is reported like every other bad input: one ``error:`` line
    on stderr and exit 2, where typer would print its usage panel.
    """

    def invoke(self, ctx: Any) -> Any:
        """Run the command; a refused option value exits 2 with one line."""
        try:
            return super().invoke(ctx)
        except typer.BadParameter as error:
            fail(error.format_message())


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
        fail_validation(error)


def fail_validation(error: ValidationError) -> NoReturn:
    """Print each validation error on its own line and exit with the invalid-input status."""
    for line in format_validation_errors(error):
        err.print(line, markup=False)
    raise typer.Exit(EXIT_INVALID) from None
