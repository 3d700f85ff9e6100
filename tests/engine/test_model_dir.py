"""Offline model shapes and the locally built tokenizer: what vLLM loads for the simulated device."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from neuronfleet.contract.model_shapes import SHAPES, get_shape
from neuronfleet.engine.scheduler.padding import PAD_TOKEN_ID
from neuronfleet.engine.sim.model_dir import model_dir
from neuronfleet.engine.sim.tokenizer import FIRST_WORD_ID, PAD_TOKEN, vocabulary, words


def test_llama_shapes_have_the_published_sizes() -> None:
    assert get_shape("llama-3.1-8b").num_parameters == pytest.approx(8.03e9, rel=0.001)
    assert get_shape("llama-3.1-70b").num_parameters == pytest.approx(70.55e9, rel=0.001)
    # 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes.
    assert get_shape("llama-3.1-8b").kv_bytes_per_token(2) == 131_072


def test_config_json_of_a_named_shape() -> None:
    config = get_shape("llama-3.1-70b").config(8192)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (8192, 80, 8)
    assert config["vocab_size"] == 128256
    assert config["rope_scaling"]["rope_type"] == "llama3"
    with pytest.raises(ValueError, match=re.escape("max_model_len 200000 exceeds what llama-3.1-8b supports")):
        get_shape("llama-3.1-8b").config(200_000)
    with pytest.raises(
        ValueError, match=re.escape("unknown model shape 'gpt-5'; known: tiny, llama-3.1-8b, llama-3.1-70b")
    ):
        get_shape("gpt-5")


def test_vocabulary_has_exactly_vocab_size_tokens_and_pad_first() -> None:
    vocab = vocabulary(1024)
    assert len(vocab) == len(set(vocab.values())) == 1024
    assert vocab[PAD_TOKEN] == PAD_TOKEN_ID == 0
    assert min(index for token, index in vocab.items() if token.isalpha()) == FIRST_WORD_ID


def test_model_dir_loads_in_transformers_one_token_per_word(tmp_path: Path) -> None:
    path = model_dir("tiny", 512, root=tmp_path)
    assert json.loads((path / "config.json").read_text()) == SHAPES["tiny"].config(512)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    text = " ".join(itertools.islice(words(), 20))
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == 20
    assert all(token_id >= FIRST_WORD_ID for token_id in ids)
    assert tokenizer.decode(ids) == text
    # Words outside the vocabulary are still one token each.
    assert tokenizer("hello wonderful world")["input_ids"] == [tokenizer.unk_token_id] * 3


def test_chat_template_wraps_messages_in_single_token_markers(tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir("tiny", 512, root=tmp_path)))
    messages = [{"role": "system", "content": "bada"}, {"role": "user", "content": "bade badi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|system|> bada <|end|> <|user|> bade badi <|end|> <|assistant|>"
    # <|system|> bada <|end|>, <|user|> bade badi <|end|>, <|assistant|>.
    assert len(tokenizer(text)["input_ids"]) == 3 + 4 + 1


def test_model_dir_is_written_once(tmp_path: Path) -> None:
    first = model_dir("tiny", 512, root=tmp_path)
    written = (first / "tokenizer.json").stat().st_mtime_ns
    assert model_dir("tiny", 512, root=tmp_path) == first
    assert (first / "tokenizer.json").stat().st_mtime_ns == written
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]
