"""The compiled-artifact identity: what changes the hash, what does not, and that it is stable."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from pydantic import BaseModel

from neuronfleet.contract.buckets import DECODE_CONTEXT_LENGTH_BUCKETS, NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.contract.config import REFERENCE_SCHEDULER, EngineConfig
from neuronfleet.contract.identity import (
    BUCKET_FIELDS,
    COMPILE_FIELDS,
    IDENTITY_HASH_LENGTH,
    SERVING_FIELDS,
    CompileIdentity,
    ModelSource,
)
from neuronfleet.contract.lora import LoraSlots

MODEL = ModelSource(uri="hf://meta-llama/Llama-3.1-8B", revision="0e9e39f")


def identity(**engine: Any) -> CompileIdentity:
    return CompileIdentity.of(MODEL, EngineConfig(**engine), "trn2", "neuronfleet/engine:0.1.0")


def test_hash_is_stable_across_releases() -> None:
    # A changed hash recompiles every artifact in every cluster: this must only change on purpose
    # (and then IDENTITY_SCHEMA is bumped). The document is canonical JSON: sorted keys, no spaces.
    canonical = (
        '{"engine":{"block_size":32,"dtype":"bfloat16","max_model_len":8192,"max_num_batched_tokens":8192,'
        '"max_num_seqs":8,"num_batched_tokens_buckets":[128,256,512,1024,2048,4096,8192],'
        '"num_seqs_buckets":[1,2,4,8],"tensor_parallel_size":1},"image":"neuronfleet/engine:0.1.0",'
        '"model":{"revision":"0e9e39f","uri":"hf://meta-llama/Llama-3.1-8B"},"schema":1,"target":"trn2"}'
    )
    assert identity().hash() == hashlib.sha256(canonical.encode()).hexdigest()[:IDENTITY_HASH_LENGTH]
    assert identity().hash() == "51068632ce0177ca"


def test_omitted_buckets_and_the_same_buckets_written_out_are_one_artifact() -> None:
    written = identity(
        num_batched_tokens_buckets=[128, 256, 512, 1024, 2048, 4096, 8192], num_seqs_buckets=[1, 2, 4, 8]
    )
    assert written.hash() == identity().hash()
    assert identity().engine.num_seqs_buckets == [1, 2, 4, 8]


@pytest.mark.parametrize(
    "change",
    [
        {"max_num_seqs": 16},
        {"max_num_batched_tokens": 4096},
        {"max_model_len": 16384},
        {"block_size": 64},
        {"tensor_parallel_size": 8},
        {"dtype": "float16"},
        {"num_seqs_buckets": [2, 8]},
        {"num_batched_tokens_buckets": [1024, 8192]},
        {"decode_context_length_buckets": [4096]},
    ],
)
def test_every_compile_relevant_engine_field_changes_the_hash(change: dict[str, Any]) -> None:
    assert identity(**change).hash() != identity().hash()


def test_model_revision_target_and_image_change_the_hash() -> None:
    base = identity()
    others = [
        base.model_copy(update={"model": ModelSource(uri="hf://meta-llama/Llama-3.1-70B", revision="0e9e39f")}),
        base.model_copy(update={"model": ModelSource(uri=MODEL.uri, revision="main")}),
        base.model_copy(update={"target": "inf2"}),
        base.model_copy(update={"image": "neuronfleet/engine:0.2.0"}),
    ]
    assert len({base.hash(), *(o.hash() for o in others)}) == 5


def test_every_engine_field_is_declared_compile_relevant_or_serving_only() -> None:
    # A new EngineConfig field must be declared: hashed (it changes a graph) or not (serving only).
    compile_relevant = {*COMPILE_FIELDS, *BUCKET_FIELDS}
    serving_only = set(SERVING_FIELDS)
    assert not compile_relevant & serving_only, "declared both compile-relevant and serving-only"
    undeclared = set(EngineConfig.model_fields) - compile_relevant - serving_only
    assert not undeclared, f"declare {sorted(undeclared)} in identity.COMPILE_FIELDS or identity.SERVING_FIELDS"
    assert compile_relevant | serving_only == set(EngineConfig.model_fields), "declared fields that do not exist"
    # A nested model is declared as a whole; the hashed fields are plain values.
    for name in compile_relevant:
        annotation = EngineConfig.model_fields[name].annotation
        assert not (isinstance(annotation, type) and issubclass(annotation, BaseModel)), name


def test_serving_only_fields_are_not_hashed() -> None:
    reference = identity(scheduler=REFERENCE_SCHEDULER)
    assert reference.hash() == identity().hash()
    assert set(reference.document()["engine"]) == {*COMPILE_FIELDS, NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS}


def test_decode_context_buckets_are_hashed_only_when_set() -> None:
    # Unset, the document is what it was before the option existed: every artifact keeps its name.
    assert DECODE_CONTEXT_LENGTH_BUCKETS not in identity().document()["engine"]
    with_contexts = identity(decode_context_length_buckets=[1024, 4096])
    assert with_contexts.document()["engine"][DECODE_CONTEXT_LENGTH_BUCKETS] == [1024, 4096]
    assert len({identity().hash(), with_contexts.hash(), identity(decode_context_length_buckets=[1024]).hash()}) == 3


@pytest.mark.parametrize(
    "uri", ["hf://meta-llama/Llama-3.1-8B", "hf://gpt2", "s3://my-models/llama/3.1-8b", "s3://a.b-c/x"]
)
def test_model_uris_accepted(uri: str) -> None:
    assert ModelSource(uri=uri).uri == uri


@pytest.mark.parametrize(
    "uri", ["meta-llama/Llama-3.1-8B", "https://huggingface.co/x", "s3://bucket", "hf://", "s3://UPPER/x", "hf://a b"]
)
def test_model_uris_rejected(uri: str) -> None:
    with pytest.raises(ValueError, match="uri"):
        ModelSource(uri=uri)


def test_a_simulated_artifact_never_shares_a_neuron_ones_hash() -> None:
    neuron = identity()
    simulated = CompileIdentity.of(MODEL, EngineConfig(), "trn2", "neuronfleet/engine:0.1.0", "sim")
    # The Neuron document is unchanged (no device key), so artifacts compiled before keep their names.
    assert "device" not in neuron.document()
    assert simulated.document() == {**neuron.document(), "device": "sim"}
    assert simulated.hash() != neuron.hash()


def test_a_logical_neuron_core_setting_other_than_the_targets_default_is_a_new_artifact() -> None:
    engine = EngineConfig()
    paired = CompileIdentity.of(MODEL, engine, "trn2", "neuronfleet/engine:0.1.0", logical_neuron_cores=2)
    alone = CompileIdentity.of(MODEL, engine, "trn2", "neuronfleet/engine:0.1.0", logical_neuron_cores=1)
    # The default written out or not is one artifact, the one hashed before the setting existed.
    assert paired.logical_neuron_cores is None
    assert paired.hash() == identity().hash() == "51068632ce0177ca"
    assert alone.hash() != paired.hash()
    assert alone.document()["logical_neuron_cores"] == 1
    # inf2's only setting is 1: its default, so no new artifact either.
    on_inf2 = CompileIdentity.of(MODEL, engine, "inf2", "neuronfleet/engine:0.1.0", logical_neuron_cores=1)
    assert "logical_neuron_cores" not in on_inf2.document()


def test_a_setting_the_target_does_not_take_is_refused() -> None:
    with pytest.raises(ValueError, match="logical NeuronCores 2 is not a setting of inf2: 1"):
        CompileIdentity.of(MODEL, EngineConfig(), "inf2", "neuronfleet/engine:0.1.0", logical_neuron_cores=2)


def test_lora_slots_are_a_new_artifact_and_none_keeps_the_hash_of_before() -> None:
    engine = EngineConfig()
    two = CompileIdentity.of(MODEL, engine, "trn2", "neuronfleet/engine:0.1.0", lora=LoraSlots(max_loras=2))
    four = CompileIdentity.of(MODEL, engine, "trn2", "neuronfleet/engine:0.1.0", lora=LoraSlots(max_loras=4))
    ranked = CompileIdentity.of(
        MODEL, engine, "trn2", "neuronfleet/engine:0.1.0", lora=LoraSlots(max_loras=2, max_lora_rank=64)
    )
    assert identity().hash() == "51068632ce0177ca"
    assert "lora" not in identity().document()
    assert two.document() == {**identity().document(), "lora": {"max_loras": 2, "max_lora_rank": 16}}
    assert len({identity().hash(), two.hash(), four.hash(), ranked.hash()}) == 4
