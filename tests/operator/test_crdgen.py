"""The generated CRDs: in sync with the models, structural, and carrying the admission rules."""

from __future__ import annotations

import ast
import re
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.hardware import DEFAULT_INSTANCE_TYPE, INSTANCE_TYPES
from neuronfleet.operator import api, crdgen
from neuronfleet.operator.cluster.kube import BY_KIND

ROOT = Path(__file__).resolve().parents[2]
RunCli = Callable[..., subprocess.CompletedProcess[str]]


def schema_of(kind: str) -> dict[str, Any]:
    (crd,) = [c for c in (crdgen.crd(k) for k in crdgen.KINDS) if c["spec"]["names"]["kind"] == kind]
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from nodes(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from nodes(schema["additionalProperties"], f"{path}{{}}")


def test_checked_in_crds_match_the_models() -> None:
    for name, text in crdgen.files().items():
        path = ROOT / "crds" / name
        assert path.read_text() == text, f"{path} is stale: run `make crds`"


@pytest.mark.parametrize("kind", ["NeuronInferenceService", "NeuronCompiledArtifact"])
def test_schemas_are_structural_and_bounded(kind: str) -> None:
    for path, node in nodes(schema_of(kind)):
        if node.get("x-kubernetes-int-or-string"):
            # An integer or a word: bounded by its CEL, the one untyped node a structural schema allows.
            assert [r["rule"] for r in node["x-kubernetes-validations"]], path
            continue
        assert "type" in node, f"{path} has no type"
        for banned in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "const", "title", "uniqueItems"):
            assert banned not in node, f"{path} has {banned}"
        assert node.get("additionalProperties") is not False, path
        if path.startswith(".spec") and node["type"] == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path} is an unbounded string (CEL cost)"
        if node["type"] == "array":
            assert "maxItems" in node, f"{path} is an unbounded list (CEL cost)"
        if path.startswith(".spec.") and path.count(".") >= 2 and not path.endswith(("[]", "{}")):
            assert node.get("description"), f"{path} has no description for kubectl explain"


def test_an_optional_object_whose_presence_matters_gets_no_default_however_deep() -> None:
    """``spec.routing`` (present: a picker runs) and ``spec.autoscaling.warmFloor`` (present: a trigger, one
    optional object deeper) stay absent unless written, their fields keep their defaults, and no marker reaches
    the CRD."""
    found = dict(nodes(schema_of("NeuronInferenceService")))
    for path in (".spec.routing", ".spec.autoscaling.warmFloor"):
        assert "default" not in found[path], path
    assert found[".spec.autoscaling.warmFloor.stepPercent"]["default"] == 100
    assert [path for path, node in found.items() if api.PRESENCE_MATTERS in node] == []


def test_bucket_rules_are_cel_with_the_engines_messages() -> None:
    engine = schema_of("NeuronInferenceService")["properties"]["spec"]["properties"]["engine"]
    for name in ("num_batched_tokens_buckets", "num_seqs_buckets", "decode_context_length_buckets"):
        bucket_list = engine["properties"][name]
        assert bucket_list["x-kubernetes-list-type"] == "set"
        assert bucket_list["items"] == {"type": "integer", "minimum": 1}
        assert [r["message"] for r in bucket_list["x-kubernetes-validations"]] == [
            f"{name} cannot be empty",
            f"{name} must be in strictly ascending order",
        ]
    paths = {r["fieldPath"] for r in engine["x-kubernetes-validations"]}
    assert paths == {".num_batched_tokens_buckets", ".num_seqs_buckets", ".decode_context_length_buckets"}
    # Defaults written out in full (the API server checks them against the rules as they are).
    assert engine["default"] == EngineConfig().model_dump(mode="json", exclude_none=True)


def test_the_auto_prefill_cap_is_an_int_or_string_bounded_by_cel() -> None:
    scheduler = schema_of("NeuronInferenceService")["properties"]["spec"]["properties"]["engine"]["properties"]
    cap = scheduler["scheduler"]["properties"]["max_prefill_tokens_while_decoding"]
    assert cap["x-kubernetes-int-or-string"] is True
    assert cap["default"] == "auto"
    assert cap["x-kubernetes-validations"] == [
        {
            "rule": "type(self) == string ? self in ['auto'] : self >= 1 && self <= 1048576",
            "message": "must be auto, or an integer from 1 to 1048576",
        }
    ]


def test_the_artifact_is_immutable_and_carries_the_same_bucket_rules() -> None:
    spec = schema_of("NeuronCompiledArtifact")["properties"]["spec"]
    assert {"rule": "self == oldSelf", "message": "a compiled artifact is immutable: its name is its content hash"} in (
        spec["x-kubernetes-validations"]
    )
    assert (
        spec["properties"]["engine"]["x-kubernetes-validations"]
        == (
            schema_of("NeuronInferenceService")["properties"]["spec"]["properties"]["engine"][
                "x-kubernetes-validations"
            ]
        )
    )


def test_the_instance_type_enum_and_cel_maps_are_the_hardware_catalogue() -> None:
    spec = schema_of("NeuronInferenceService")["properties"]["spec"]
    assert spec["properties"]["instanceType"]["enum"] == list(INSTANCE_TYPES)
    assert spec["properties"]["instanceType"]["default"] == DEFAULT_INSTANCE_TYPE
    cel = " ".join(str(text) for rule in spec["x-kubernetes-validations"] for text in rule.values())
    maps = [ast.literal_eval(literal) for literal in re.findall(r"(\{[^{}]*\})\[self\.instanceType\]", cel)]
    catalogue = [
        {name: instance.devices for name, instance in INSTANCE_TYPES.items()},
        {name: instance.cores_per_device for name, instance in INSTANCE_TYPES.items()},
        {name: instance.chip.physical_cores for name, instance in INSTANCE_TYPES.items()},
        {name: max(instance.chip.lnc_settings) for name, instance in INSTANCE_TYPES.items()},
    ]
    # Every map the rules index by instance type is one of the catalogue's, and each is used.
    assert all(m in catalogue for m in maps)
    assert all(m in maps for m in catalogue)


def test_service_crd_has_scale_columns_and_names() -> None:
    (crd,) = [crdgen.crd(k) for k in crdgen.KINDS if k.kind == "NeuronInferenceService"]
    names = crd["spec"]["names"]
    assert (names["shortNames"], names["categories"]) == (["nis"], ["neuron"])
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Model", "Phase", "Ready", "Desired", "Age"}


def test_conditions_are_a_map_keyed_by_type() -> None:
    conditions = schema_of("NeuronInferenceService")["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) >= {"type", "status", "reason", "lastTransitionTime"}


def test_crds_command_writes_then_checks(run_cli: RunCli, tmp_path: Path) -> None:
    stale = run_cli("neuronfleet-operator", "crds", "--check", "--output", str(tmp_path))
    assert stale.returncode == 2
    assert stale.stderr.startswith("error: out of date")
    written = run_cli("neuronfleet-operator", "crds", "--output", str(tmp_path))
    assert written.returncode == 0, written.stderr
    for path in tmp_path.iterdir():
        assert yaml.safe_load(path.read_text())["kind"] == "CustomResourceDefinition"
    fresh = run_cli("neuronfleet-operator", "crds", "--check", "--output", str(tmp_path))
    assert (fresh.returncode, fresh.stdout, fresh.stderr) == (0, "", "")


def test_run_with_a_missing_kubeconfig_is_refused_naming_it(run_cli: RunCli, tmp_path: Path) -> None:
    # Relative, so typer's boxed message has room for it on one line.
    result = run_cli("neuronfleet-operator", "run", "--kubeconfig", "missing", cwd=tmp_path)
    assert result.returncode == 2
    assert "Invalid value for '--kubeconfig': file 'missing' does not exist." in result.stderr
    assert "Traceback" not in result.stderr


def test_run_with_bad_credentials_is_one_clear_line(run_cli: RunCli, tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
    result = run_cli("neuronfleet-operator", "run", "--kubeconfig", "kubeconfig", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot load Kubernetes credentials: ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_run_with_the_metrics_port_taken_is_one_clear_line(run_cli: RunCli, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "neuronfleet-operator",
            "run",
            "--kubeconfig",
            str(kubeconfig),
            "--metrics-port",
            str(port),
            "--metrics-address",
            "127.0.0.1",
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"


@pytest.mark.parametrize("kind", crdgen.KINDS, ids=lambda k: k.kind)
def test_the_crds_and_the_client_name_each_kind_alike(kind: crdgen.Kind) -> None:
    spec = crdgen.crd(kind)["spec"]
    resource = BY_KIND[kind.kind]
    assert (spec["group"], spec["versions"][0]["name"], spec["names"]["plural"]) == (
        resource.group,
        resource.version,
        resource.plural,
    )
