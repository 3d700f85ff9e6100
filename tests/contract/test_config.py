"""EngineConfig: defaults, errors per field, and what vLLM is told."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from neuronfleet.contract.config import ASYNC_SCHEDULER_CLS, SYNC_SCHEDULER_CLS, EngineConfig


def messages(error: ValidationError) -> dict[str, str]:
    return {str(e["loc"][0]): e["msg"] for e in error.errors()}


def test_defaults_follow_the_effective_prefill_budget() -> None:
    config = EngineConfig(max_num_seqs=6, max_num_batched_tokens=16384, max_model_len=3000)
    assert config.effective_max_num_batched_tokens == 3000
    assert config.effective_num_batched_tokens_buckets == [128, 256, 512, 1024, 2048, 3000]
    assert config.effective_num_seqs_buckets == [1, 2, 4, 6]


def test_last_prefill_bucket_is_checked_against_the_effective_budget() -> None:
    with pytest.raises(ValidationError) as caught:
        EngineConfig(max_num_batched_tokens=8192, max_model_len=4096, num_batched_tokens_buckets=[512, 8192])
    assert messages(caught.value) == {
        "num_batched_tokens_buckets": "Last bucket in num_batched_tokens_buckets must equal "
        "max_model_len (4096), got 8192"
    }


def test_both_bucket_errors_are_reported_with_their_fields() -> None:
    with pytest.raises(ValidationError) as caught:
        EngineConfig(
            max_num_seqs=8,
            max_num_batched_tokens=8192,
            num_batched_tokens_buckets=[512, 1024, 2048],
            num_seqs_buckets=[1, 2, 4],
        )
    assert messages(caught.value) == {
        "num_batched_tokens_buckets": "Last bucket in num_batched_tokens_buckets must equal "
        "max_num_batched_tokens (8192), got 2048",
        "num_seqs_buckets": "Last bucket in num_seqs_buckets must equal max_num_seqs (8), got 4",
    }


def test_shape_errors_keep_the_contract_message_not_pydantics() -> None:
    with pytest.raises(ValidationError) as caught:
        EngineConfig(num_seqs_buckets=[1, "2", 8])
    assert messages(caught.value) == {"num_seqs_buckets": "num_seqs_buckets[1] must be an integer, got 2"}


def test_empty_list_is_not_the_same_as_absent() -> None:
    with pytest.raises(ValidationError) as caught:
        EngineConfig(num_seqs_buckets=[])
    assert messages(caught.value) == {"num_seqs_buckets": "num_seqs_buckets cannot be empty"}


@pytest.mark.parametrize(
    ("buckets", "message"),
    [
        ([], "decode_context_length_buckets cannot be empty"),
        ([4096, 1024], "decode_context_length_buckets must be in strictly ascending order, got [4096, 1024]"),
        ([0, 1024], "decode_context_length_buckets[0] must be positive, got 0"),
        (
            [1024, 8192],
            "Every bucket in decode_context_length_buckets must be less than max_model_len (8192), got 8192: "
            "the max_model_len graph is always compiled",
        ),
        (
            [1000],
            "Every bucket in decode_context_length_buckets must be a multiple of 128 (the NKI attention tile), "
            "got 1000",
        ),
    ],
)
def test_decode_context_buckets_follow_vllm_neurons_rules(buckets: list[int], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        EngineConfig(max_model_len=8192, decode_context_length_buckets=buckets)
    assert messages(caught.value) == {"decode_context_length_buckets": message}


def test_decode_context_buckets_end_on_max_model_len_and_multiply_the_decode_graphs() -> None:
    config = EngineConfig(max_num_seqs=8, max_model_len=8192, decode_context_length_buckets=[1024, 4096])
    assert config.decode_context_buckets == [1024, 4096, 8192]
    # 7 prefill buckets, and 4 decode batch buckets for each of 3 contexts.
    assert config.compiled_graph_count == 7 + 4 * 3
    assert config.neuron_config()["decode_context_length_buckets"] == [1024, 4096]
    assert EngineConfig().decode_context_buckets == [8192]
    assert "decode_context_length_buckets" not in EngineConfig().neuron_config()


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens", "max_model_len", "block_size"])
def test_limits_must_be_positive(field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        EngineConfig.model_validate({field: 0})
    assert list(messages(caught.value)) == [field]


def test_unknown_settings_are_rejected() -> None:
    with pytest.raises(ValidationError) as caught:
        EngineConfig.model_validate({"max_num_seq": 8})
    assert messages(caught.value) == {"max_num_seq": "Extra inputs are not permitted"}


def test_vllm_args_carry_limits_and_full_bucket_lists() -> None:
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=1024, max_model_len=2048, tensor_parallel_size=8)
    args = config.vllm_serve_args()
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--max-num-seqs"] == "4"
    assert flags["--max-num-batched-tokens"] == "1024"
    assert flags["--max-model-len"] == "2048"
    assert flags["--tensor-parallel-size"] == "8"
    assert flags["--scheduler-cls"] == ASYNC_SCHEDULER_CLS
    assert json.loads(flags["--additional-config"]) == {
        "neuron_config": {
            "num_batched_tokens_buckets": [128, 256, 512, 1024],
            "num_seqs_buckets": [1, 2, 4],
            "constant_cost_admission": True,
            "max_consecutive_prefill_steps": 1,
            "kv_admission": "request_bound",
            "max_prefills_per_step": 1,
            "max_prefill_tokens_while_decoding": "auto",
            "itl_target_ms": None,
        }
    }


def test_sync_scheduling_selects_the_sync_class() -> None:
    args = EngineConfig().vllm_serve_args(async_scheduling=False)
    assert args[args.index("--scheduler-cls") + 1] == SYNC_SCHEDULER_CLS
    assert args[-1] == "--no-async-scheduling"
