"""Every ``--help`` of every command of every console script works, and shows its help text as written.

The commands are found by walking the click tree typer builds from each script's app, nested groups
included, so a command added later is covered without being listed here.
"""

from __future__ import annotations

import pkgutil
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.main import get_command
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
RunCli = Callable[..., subprocess.CompletedProcess[str]]
#: The packages' metadata, which name the console scripts.
PYPROJECTS = (ROOT / "pyproject.toml", ROOT / "devcluster" / "pyproject.toml")


def console_scripts() -> dict[str, typer.Typer]:
    """Every console script the packages install, and the typer app it runs."""
    scripts: dict[str, typer.Typer] = {}
    for pyproject in PYPROJECTS:
        for name, target in tomllib.loads(pyproject.read_text())["project"]["scripts"].items():
            app = pkgutil.resolve_name(target)
            assert isinstance(app, typer.Typer), f"{name} runs {target}, not a typer app"
            scripts[name] = app
    return scripts


#: A command of typer's click tree (typer ships its own copy of click, so click's classes are not these).
Command = TyperGroup | TyperCommand


def walk(command: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Command]]:
    """``command`` and every command below it, hidden ones included, each with its path from the root."""
    yield path, command
    if isinstance(command, TyperGroup):
        for name, child in sorted(command.commands.items()):
            assert isinstance(child, Command), f"{name}: {type(child).__name__} is not a typer command"
            yield from walk(child, (*path, name))


def unspaced(text: str) -> str:
    # Help is rewrapped to the terminal's width (hyphenated words too): compare without any whitespace.
    return "".join(text.split())


def written_help(command: Command) -> list[str]:
    """The help texts a command's ``--help`` must show as written: its own, and each visible parameter's."""
    texts = [(command.help or "").split("\f")[0]]
    for param in command.params:
        if isinstance(param, TyperOption | TyperArgument) and not param.hidden:
            texts.append(param.help or "")
    return [text for text in texts if text]


def test_every_help_of_every_command_works() -> None:
    runner = CliRunner()
    checked: set[tuple[str, ...]] = set()
    failures: dict[str, str] = {}
    for script, app in console_scripts().items():
        root = get_command(app)
        assert isinstance(root, Command)
        for path, command in walk(root):
            line = " ".join((script, *path))
            checked.add((script, *path))
            result = runner.invoke(app, [*path, "--help"], prog_name=script, env={"COLUMNS": "80"})
            if result.exception is not None or result.exit_code != 0:
                failures[line] = f"exit {result.exit_code}: {result.exception!r}"
                continue
            usage = next((text.strip() for text in result.output.splitlines() if text.strip()), "")
            if not usage.startswith(f"Usage: {line} [OPTIONS]"):
                failures[line] = f"usage line {usage!r}"
                continue
            shown = unspaced(result.output)
            for text in written_help(command):
                if unspaced(text) not in shown:
                    failures[line] = f"help not shown as written: {text!r}"
    assert failures == {}
    # The walk reaches every script, nested groups and the commands a new user reads first.
    assert {("neuronfleet-engine", "serve"), ("neuronfleet-engine", "compile")} <= checked
    assert {("neuronfleet-engine", "buckets", "show"), ("neuronfleet-dev", "cluster", "up")} <= checked
    assert {("neuronfleet-operator", "run"), ("neuronfleet-dev", "images", "build")} <= checked


def test_the_installed_script_shows_brackets_literally(run_cli: RunCli) -> None:
    # Once through the real entry point: the help text that used to crash it, as written.
    shown = run_cli("neuronfleet-engine", "serve", "--help")
    assert (shown.returncode, shown.stderr) == (0, "")
    assert shown.stdout.startswith("Usage: neuronfleet-engine serve [OPTIONS]")
    assert "a directory or s3://BUCKET[/PREFIX]." in shown.stdout
