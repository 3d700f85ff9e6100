"""A word-level tokenizer built locally, so a simulated engine needs no download.

Every whitespace- or punctuation-separated word is one token, which makes token
counts easy to predict: a prompt of N words is N tokens. The vocabulary is the
special tokens, then generated pronounceable words (``bada``, ``bade``, ...) up
to the model's ``vocab_size``; words outside it become ``<unk>``. The chat
template wraps each message in role markers that are single special tokens.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
END_OF_MESSAGE = "<|end|>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
#: Ids 0.. in this order; the pad token is id 0, as the padding contract's ``PAD_TOKEN_ID``.
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, END_OF_MESSAGE, *ROLE_TOKENS)
#: The first id of an ordinary word: the simulated device samples from here up.
FIRST_WORD_ID = len(SPECIAL_TOKENS)

#: ``<|role|> content <|end|>`` per message, then ``<|assistant|>`` when a reply is wanted.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def words() -> Iterator[str]:
    """Distinct lowercase words: two syllables, then three, and so on."""
    syllables = [c + v for c, v in itertools.product(_CONSONANTS, _VOWELS)]
    for length in itertools.count(2):
        for parts in itertools.product(syllables, repeat=length):
            yield "".join(parts)


def vocabulary(vocab_size: int) -> dict[str, int]:
    """Token -> id for a vocabulary of exactly ``vocab_size`` entries."""
    if vocab_size <= FIRST_WORD_ID:
        raise ValueError(f"vocab_size must exceed the {FIRST_WORD_ID} special tokens, got {vocab_size}")
    tokens = [*SPECIAL_TOKENS, *itertools.islice(words(), vocab_size - FIRST_WORD_ID)]
    return {token: index for index, token in enumerate(tokens)}


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """The word-level tokenizer for a model of ``vocab_size`` tokens."""
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(vocab_size), unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    # Words are separated by single spaces when decoded.
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def tokenizer_config() -> dict[str, object]:
    """``tokenizer_config.json``: the class transformers loads, special tokens and the chat template."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_048_576,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(directory: Path, vocab_size: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory``."""
    build_tokenizer(vocab_size).save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))
