"""Model shapes the engine can stand up offline, as Hugging Face ``config.json`` contents.

A shape is what vLLM reads from a model directory (architecture, sizes, limits)
and what the simulated device's cost model needs (parameter count, KV bytes per
token). No weights: the simulated device never reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The architecture every shape's ``config.json`` names: vLLM's Llama model class.
ARCHITECTURE = "LlamaForCausalLM"
#: Vocabulary of the tiny test shape.
TINY_VOCAB_SIZE = 1024
#: Vocabulary of Llama 3.1 (config.json ``vocab_size``).
LLAMA_3_VOCAB_SIZE = 128256
#: Vocabulary of Llama 2 and Mistral 7B v0.2.
LLAMA_2_VOCAB_SIZE = 32000


def tiny_llama_config(max_model_len: int) -> dict[str, Any]:
    """A 2-layer Llama small enough that vLLM builds its configuration in moments."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": TINY_VOCAB_SIZE,
        "max_position_embeddings": max_model_len,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
    }


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers of a Llama-style decoder."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    vocab_size: int
    #: The longest context the architecture supports (``max_position_embeddings``).
    max_position_embeddings: int
    #: Extra ``config.json`` keys (RoPE settings): copied as given.
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def head_dim(self) -> int:
        """Size of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def layer_parameters(self) -> int:
        """Weights of one decoder layer: attention and MLP projections, norms."""
        kv_width = self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (2 * self.hidden_size + 2 * kv_width)
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
        return attention + mlp + norms

    @property
    def num_parameters(self) -> int:
        """Weights: embeddings, every layer, the final norm, and the untied output head."""
        embeddings = 2 * self.vocab_size * self.hidden_size
        return self.num_hidden_layers * self.layer_parameters + embeddings + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV cache bytes one token takes over all layers (keys and values)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * dtype_bytes

    def config(self, max_model_len: int) -> dict[str, Any]:
        """The ``config.json`` of this shape, for an engine serving up to ``max_model_len``."""
        if max_model_len > self.max_position_embeddings:
            raise ValueError(
                f"max_model_len {max_model_len} exceeds what {self.name} supports ({self.max_position_embeddings})"
            )
        if self.name == "tiny":
            # The tiny shape's context is whatever the engine asks for.
            return tiny_llama_config(max_model_len)
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-5,
            "hidden_act": "silu",
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            **dict(self.extra),
        }


#: Llama 3.1's RoPE: its config.json on the Hugging Face Hub.
_LLAMA_3_1_ROPE = (
    ("rope_theta", 500000.0),
    (
        "rope_scaling",
        {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    ),
)

#: Named shapes, from each model's config.json on the Hugging Face Hub: meta-llama/Llama-3.1-8B, -70B and
#: -405B; meta-llama/Llama-2-7b-hf, -13b-hf and -70b-hf; mistralai/Mistral-7B-Instruct-v0.2. Beyond the two
#: Llama 3.1 shapes served most, the others are the models Neuron publishes latencies for (the cost model's
#: calibration, ``neuronfleet.engine.sim.calibration``).
SHAPES: dict[str, ModelShape] = {
    "tiny": ModelShape(
        name="tiny",
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        vocab_size=TINY_VOCAB_SIZE,
        max_position_embeddings=1_048_576,
    ),
    "llama-3.1-8b": ModelShape(
        name="llama-3.1-8b",
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=32,
        vocab_size=LLAMA_3_VOCAB_SIZE,
        max_position_embeddings=131072,
        extra=_LLAMA_3_1_ROPE,
    ),
    "llama-3.1-70b": ModelShape(
        name="llama-3.1-70b",
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        num_hidden_layers=80,
        vocab_size=LLAMA_3_VOCAB_SIZE,
        max_position_embeddings=131072,
        extra=_LLAMA_3_1_ROPE,
    ),
    "llama-3.1-405b": ModelShape(
        name="llama-3.1-405b",
        hidden_size=16384,
        intermediate_size=53248,
        num_attention_heads=128,
        num_key_value_heads=8,
        num_hidden_layers=126,
        vocab_size=LLAMA_3_VOCAB_SIZE,
        max_position_embeddings=131072,
        extra=_LLAMA_3_1_ROPE,
    ),
    "llama-2-7b": ModelShape(
        name="llama-2-7b",
        hidden_size=4096,
        intermediate_size=11008,
        num_attention_heads=32,
        num_key_value_heads=32,
        num_hidden_layers=32,
        vocab_size=LLAMA_2_VOCAB_SIZE,
        max_position_embeddings=4096,
    ),
    "llama-2-13b": ModelShape(
        name="llama-2-13b",
        hidden_size=5120,
        intermediate_size=13824,
        num_attention_heads=40,
        num_key_value_heads=40,
        num_hidden_layers=40,
        vocab_size=LLAMA_2_VOCAB_SIZE,
        max_position_embeddings=4096,
    ),
    "llama-2-70b": ModelShape(
        name="llama-2-70b",
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
        num_hidden_layers=80,
        vocab_size=LLAMA_2_VOCAB_SIZE,
        max_position_embeddings=4096,
    ),
    "mistral-7b": ModelShape(
        name="mistral-7b",
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=32,
        vocab_size=LLAMA_2_VOCAB_SIZE,
        max_position_embeddings=32768,
        extra=(("rope_theta", 1000000.0),),
    ),
}


def get_shape(name: str) -> ModelShape:
    """The named shape; a ``ValueError`` naming the known ones otherwise."""
    shape = SHAPES.get(name)
    if shape is None:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    return shape


def served_name(model_uri: str) -> str:
    """The model name clients use: ``org/name`` of an ``hf://`` URI, the last path part of others."""
    if model_uri.startswith("hf://"):
        return model_uri.removeprefix("hf://")
    return model_uri.rstrip("/").rsplit("/", 1)[-1]


def shape_for_model(model_uri: str) -> str:
    """The simulated shape that stands for a model: a named shape its name starts with, else the tiny shape."""
    name = served_name(model_uri).rsplit("/", 1)[-1].lower()
    # Longest first: "llama-3.1-405b" before a shorter name it starts with.
    for shape in sorted((s for s in SHAPES if s != "tiny"), key=len, reverse=True):
        if name.startswith(shape) or name.startswith(f"meta-{shape}"):
            return shape
    return "tiny"
