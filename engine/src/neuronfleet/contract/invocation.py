"""The engine's command lines as types: what the operator's pods run, rendered one way.

The flags cross a process boundary as strings. Each invocation is a frozen record of one command's
options, named as the engine's CLI names them (``artifact_store`` is ``--artifact-store``); the operator's
plan builds these and renders them, and a test parses every list it can render with the engine's own
parser. An option left at its default is not written, so a pod spec written before an option existed
stays the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class _Invocation:
    #: The engine's subcommand.
    command: ClassVar[str]

    def args(self) -> list[str]:
        """``[command, --option, value, ...]``, in field order, options at their default left out."""
        rendered = [self.command]
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.default is not dataclasses.MISSING and value == field.default:
                continue
            option = f"--{field.name.replace('_', '-')}"
            # A tuple is an option given once per value.
            for item in value if isinstance(value, tuple) else (value,):
                rendered += [option, str(item)]
        return rendered


@dataclass(frozen=True)
class CompileInvocation(_Invocation):
    """``neuronfleet-engine compile``: compile an artifact into a store; it recomputes the hash and refuses a
    mismatch."""

    command: ClassVar[str] = "compile"

    config: str
    model: str
    revision: str
    target: str
    engine_image: str
    artifact_store: str
    artifact_hash: str
    device: str = "neuron"
    logical_neuron_cores: int | None = None
    max_loras: int | None = None
    max_lora_rank: int | None = None


@dataclass(frozen=True)
class ServeInvocation(_Invocation):
    """``neuronfleet-engine serve``: serve one artifact (checked, and downloaded from ``s3://``, first)."""

    command: ClassVar[str] = "serve"

    config: str
    model: str
    revision: str
    artifact_store: str
    artifact_hash: str
    port: int
    drain_timeout: int
    device: str = "neuron"
    instance_type: str | None = None
    logical_neuron_cores: int | None = None
    max_loras: int | None = None
    max_lora_rank: int | None = None
    #: ``NAME=SOURCE[@SHA256]`` of each LoRA adapter served.
    lora_adapter: tuple[str, ...] = ()
    kv_events_port: int | None = None
