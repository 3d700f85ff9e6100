"""Model shapes the engine can stand up offline, as Hugging Face ``config.json`` contents."""

from __future__ import annotations

from typing import Any

#: Vocabulary of the tiny test shape.
TINY_VOCAB_SIZE = 1024


def tiny_llama_config(max_model_len: int) -> dict[str, Any]:
    """A 2-layer Llama small enough that vLLM builds its configuration in moments."""
    return {
        "architectures": ["LlamaForCausalLM"],
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
