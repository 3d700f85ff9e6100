"""LoRA slots and adapters: parsed and checked as the CLI and the CRD take them, provisioned before serving,
and what an adapter costs the simulated device."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from harness.s3_fixtures import Bucket
from pydantic import ValidationError

from neuronfleet.contract.hardware import get_instance_type
from neuronfleet.contract.lora import LoraAdapter, LoraSlots
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.artifacts.adapters import AdapterError, adapter_digest, provision_adapter
from neuronfleet.engine.sim.cost_model import CostModel


def write_adapter(directory: Path, rank: int = 8) -> Path:
    directory.mkdir(parents=True)
    config = {"r": rank, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA"}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    (directory / "adapter_model.safetensors").write_bytes(b"\x01" * 1000)
    return directory


def test_an_adapter_value_is_name_equals_source_with_an_optional_digest() -> None:
    digest = "ab" * 32
    assert LoraAdapter.parse("fr=s3://bucket/adapters/fr") == LoraAdapter(name="fr", source="s3://bucket/adapters/fr")
    assert LoraAdapter.parse(f"fr=/data/fr@{digest}") == LoraAdapter(name="fr", source="/data/fr", sha256=digest)
    assert LoraAdapter.parse(LoraAdapter(name="de", source="/d", sha256=digest).cli_value()).sha256 == digest
    with pytest.raises(ValueError, match="is not NAME=SOURCE"):
        LoraAdapter.parse("fr")
    with pytest.raises(ValidationError, match="source"):
        LoraAdapter.parse("fr=https://example.com/fr")
    with pytest.raises(ValidationError, match="name"):
        LoraAdapter.parse("fr/x=/data/fr")


def test_slots_take_vllms_ranks_only() -> None:
    assert LoraSlots(max_loras=2).vllm_serve_args() == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "16"]
    with pytest.raises(ValidationError, match="max_lora_rank"):
        LoraSlots.model_validate({"max_loras": 2, "max_lora_rank": 12})


def test_an_adapter_costs_more_the_higher_its_rank() -> None:
    cost = CostModel(get_instance_type("trn2.48xlarge"), get_shape("llama-3.1-8b"), tensor_parallel_size=4)
    decode = [cost.lora_seconds([(rank, 8)]) for rank in (8, 16, 64)]
    assert 0 < decode[0] < decode[1] < decode[2]
    # A decode step reads the adapter's weights: four times the rank, four times the bytes.
    assert decode[2] / decode[1] == pytest.approx(4.0)
    # Beside the step itself it is small: the point of LoRA.
    assert decode[1] < 0.05 * cost.decode_seconds(8, 8192)
    # A long prefill is compute: it grows with the tokens too.
    assert cost.lora_seconds([(16, 4096)]) > cost.lora_seconds([(16, 8)])
    assert cost.lora_seconds([]) == 0.0


def test_a_local_adapter_is_served_in_place_and_a_declared_digest_is_checked(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "fr")
    digest = adapter_digest(folder)
    ready = provision_adapter(LoraAdapter(name="fr", source=str(folder), sha256=digest), tmp_path / "cache")
    assert (ready.directory, ready.digest) == (folder, digest)
    (folder / "adapter_model.safetensors").write_bytes(b"\x02" * 1000)
    with pytest.raises(AdapterError, match=r"LoRA adapter fr \(.*\) has digest .* but .* was declared"):
        provision_adapter(LoraAdapter(name="fr", source=str(folder), sha256=digest), tmp_path / "cache")
    with pytest.raises(AdapterError, match=r"has no adapter_config\.json"):
        provision_adapter(LoraAdapter(name="x", source=str(tmp_path / "missing")), tmp_path / "cache")
    # What vLLM would refuse at start-up, after the model loaded, is refused here in one line.
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    with pytest.raises(AdapterError, match=r"adapter_config\.json lacks target_modules, which vLLM needs"):
        provision_adapter(LoraAdapter(name="fr", source=str(folder)), tmp_path / "cache")


def test_the_digest_command_prints_what_provisioning_checks_and_refuses_what_vllm_could_not_load(
    tmp_path: Path, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    folder = write_adapter(tmp_path / "fr")
    printed = run_cli("neuronfleet-engine", "adapter-digest", str(folder))
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == adapter_digest(folder)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "target_modules": ["q_proj"]}))
    refused = run_cli("neuronfleet-engine", "adapter-digest", str(folder))
    assert refused.returncode != 0
    assert "adapter_config.json lacks lora_alpha, which vLLM needs" in refused.stderr
    assert refused.stdout == ""


def test_an_s3_adapter_is_copied_whole_checked_and_replaces_the_last_copy(
    s3_bucket: Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in s3_bucket.env.items():
        monkeypatch.setenv(key, value)
    folder = write_adapter(tmp_path / "fr")
    s3 = boto3.client("s3")
    for path in folder.iterdir():
        s3.upload_file(str(path), s3_bucket.name, f"adapters/fr/{path.name}")
    source = f"s3://{s3_bucket.name}/adapters/fr"
    ready = provision_adapter(LoraAdapter(name="fr", source=source, sha256=adapter_digest(folder)), tmp_path / "c")
    assert ready.directory == tmp_path / "c" / "adapters" / "fr"
    assert ready.digest == adapter_digest(folder)
    # A changed object is copied again, in place of the old copy, and refused when its metadata says otherwise.
    s3.put_object(Bucket=s3_bucket.name, Key="adapters/fr/extra.json", Body=b"{}", Metadata={"sha256": "0" * 64})
    with pytest.raises(AdapterError, match=r"extra\.json is not the file its sha256 metadata records"):
        provision_adapter(LoraAdapter(name="fr", source=source), tmp_path / "c")
    assert ready.digest == adapter_digest(ready.directory), "a refused copy replaced the last good one"
    with pytest.raises(AdapterError, match="no objects under it"):
        provision_adapter(LoraAdapter(name="de", source=f"s3://{s3_bucket.name}/adapters/de"), tmp_path / "c")
