"""LoRA adapters on compiled slots: the slot shape, which the graphs are compiled for, and the adapters.

On Neuron an adapter is loaded into one of ``max_loras`` slots of rank ``max_lora_rank``, shapes the
compiled graphs take as inputs: a new slot shape is a new artifact (:class:`LoraSlots` is part of the
compile identity), a new adapter is not (:class:`LoraAdapter` is served, never compiled). It depends on
pydantic alone: the operator's CRD embeds both.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: The adapter ranks vLLM's LoRA slots are compiled for (its ``max_lora_rank`` choices).
LoraRank = Literal[8, 16, 32, 64, 128, 256]
#: What clients send as ``model`` for an adapter; no ``=`` (the CLI's NAME=SOURCE) and no ``/``.
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
#: ``s3://bucket/prefix`` (a folder of the adapter's files) or an absolute path on the node.
ADAPTER_SOURCE_PATTERN = r"^(s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/[^\s]+|/[^\s]*)$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class LoraSlots(BaseModel):
    """The LoRA slots the graphs are compiled with: how many adapters at once, and their largest rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_loras: int = Field(ge=1, le=64, description="Adapters loaded at once (slots); every adapter served needs one.")
    max_lora_rank: LoraRank = Field(16, description="The largest adapter rank a slot holds: 8, 16, 32, 64, 128 or 256.")

    def vllm_serve_args(self) -> list[str]:
        """The ``vllm serve`` arguments that enable LoRA with these slots."""
        return ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank)]


class LoraAdapter(BaseModel):
    """One LoRA adapter served beside the model: the name clients ask for, and where its files are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=ADAPTER_NAME_PATTERN,
        max_length=63,
        description="The model name clients send for this adapter (letters, digits, '.', '_', '-').",
    )
    source: str = Field(
        pattern=ADAPTER_SOURCE_PATTERN,
        max_length=1024,
        description=(
            "Where the adapter's files are (adapter_config.json and its weights): s3://bucket/prefix, read with the "
            "AWS credentials the artifact store's are read with, or an absolute path (in a pod: on the node)."
        ),
    )
    sha256: str | None = Field(
        None,
        pattern=SHA256_PATTERN,
        max_length=64,
        description=(
            "The adapter's digest (`neuronfleet-engine adapter-digest FOLDER`): a replica whose copy differs does "
            "not start. Unset: not checked."
        ),
    )

    def cli_value(self) -> str:
        """``NAME=SOURCE[@SHA256]``: the engine's ``--lora-adapter`` value."""
        return f"{self.name}={self.source}" + (f"@{self.sha256}" if self.sha256 else "")

    @classmethod
    def parse(cls, value: str) -> LoraAdapter:
        """The adapter a ``--lora-adapter NAME=SOURCE[@SHA256]`` value names (``ValueError`` when malformed)."""
        name, equals, rest = value.partition("=")
        if not equals:
            raise ValueError(f"--lora-adapter {value!r} is not NAME=SOURCE[@SHA256]")
        source, at, digest = rest.rpartition("@") if "@" in rest else (rest, "", "")
        return cls(name=name, source=source, sha256=digest if at else None)
