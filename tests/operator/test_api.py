"""The API models: defaults, derived Neuron resources, identity, and the messages of invalid specs."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from neuronfleet.operator.api import (
    CompileSettings,
    NeuronInferenceServiceSpec,
    describe_errors,
    is_bucket_error,
    parse_service_spec,
)

MODEL = {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"}


def spec(**fields: Any) -> NeuronInferenceServiceSpec:
    return parse_service_spec({"model": MODEL, **fields})


def error_of(**fields: Any) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    return caught.value


def test_defaults_surge_first_and_drain_within_the_grace() -> None:
    s = spec()
    assert (s.instance_type, s.desired_replicas, s.neuron_devices) == ("trn2.48xlarge", 1, 1)
    assert (s.rollout.max_surge, s.rollout.max_unavailable) == (1, 0)
    assert s.drain.grace_seconds > s.drain.pre_stop_seconds + s.drain.drain_timeout_seconds
    assert s.compile.store_kind == "pvc"


@pytest.mark.parametrize(
    ("instance", "tp", "devices"),
    [
        ("trn2.48xlarge", 1, 1),
        ("trn2.48xlarge", 4, 1),
        ("trn2.48xlarge", 8, 2),
        ("trn2.48xlarge", 32, 8),
        ("trn2.48xlarge", 64, 16),
        ("inf2.48xlarge", 2, 1),
        ("inf2.48xlarge", 24, 12),
        ("trn1.32xlarge", 32, 16),
    ],
)
def test_neuron_devices_follow_tensor_parallelism(instance: str, tp: int, devices: int) -> None:
    assert spec(instanceType=instance, engine={"tensor_parallel_size": tp}).neuron_devices == devices


def test_given_neuron_devices_win() -> None:
    assert spec(engine={"tensor_parallel_size": 4}, resources={"neuronDevices": 4}).neuron_devices == 4


def test_snake_case_names_are_accepted_too() -> None:
    assert spec(instance_type="inf2.48xlarge").instance_type == "inf2.48xlarge"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"engine": {"max_num_seqs": 8, "num_seqs_buckets": [1, 2, 4]}},
            "spec.engine.num_seqs_buckets: Last bucket in num_seqs_buckets must equal max_num_seqs (8), got 4",
        ),
        (
            {"engine": {"num_batched_tokens_buckets": [512, 256, 8192]}},
            "spec.engine.num_batched_tokens_buckets: num_batched_tokens_buckets must be in strictly ascending order, "
            "got [512, 256, 8192]",
        ),
        (
            {"engine": {"num_seqs_buckets": []}},
            "spec.engine.num_seqs_buckets: num_seqs_buckets cannot be empty",
        ),
    ],
)
def test_bucket_errors_keep_the_engines_messages(fields: dict[str, Any], message: str) -> None:
    error = error_of(**fields)
    assert describe_errors(error) == message
    assert is_bucket_error(error)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"engine": {"tensor_parallel_size": 8}, "resources": {"neuronDevices": 1}},
            "spec.resources.neuronDevices: resources.neuronDevices (1) holds 4 logical NeuronCores on trn2.48xlarge, "
            "fewer than engine.tensor_parallel_size (8)",
        ),
        (
            {"instanceType": "inf2.48xlarge", "resources": {"neuronDevices": 16}},
            "spec.resources.neuronDevices: resources.neuronDevices (16) exceeds the 12 Neuron devices of one "
            "inf2.48xlarge",
        ),
        (
            {"instanceType": "inf2.24xlarge", "engine": {"tensor_parallel_size": 16}},
            "spec.engine.tensor_parallel_size: engine.tensor_parallel_size (16) exceeds the 12 logical NeuronCores "
            "of one inf2.24xlarge",
        ),
        (
            {"rollout": {"maxSurge": 0, "maxUnavailable": 0}},
            "spec.rollout: rollout.maxSurge and rollout.maxUnavailable cannot both be 0",
        ),
        (
            {"drain": {"preStopSeconds": 10, "drainTimeoutSeconds": 60, "terminationGracePeriodSeconds": 70}},
            "spec.drain: drain.terminationGracePeriodSeconds (70) must exceed "
            "preStopSeconds + drainTimeoutSeconds (70)",
        ),
    ],
)
def test_resource_and_rollout_errors_name_the_field(fields: dict[str, Any], message: str) -> None:
    error = error_of(**fields)
    assert describe_errors(error) == message
    assert not is_bucket_error(error)


@pytest.mark.parametrize(
    "fields",
    [
        {"instanceType": "p5.48xlarge"},
        {"replicas": -1},
        {"image": "Not An Image"},
        {"compile": {"artifactStore": "file:///tmp"}},
        {"typo": 1},
    ],
)
def test_other_invalid_fields_are_rejected(fields: dict[str, Any]) -> None:
    name = next(iter(fields))
    assert describe_errors(error_of(**fields)).startswith(f"spec.{name}")


def test_replicas_resources_and_rollout_never_change_the_identity() -> None:
    base = spec().identity().hash()
    changed = spec(
        replicas=5,
        resources={"neuronDevices": 2, "cpu": "8", "memory": "64Gi"},
        rollout={"maxSurge": 2},
        drain={"preStopSeconds": 5},
        compile={"artifactStore": "s3://bucket/prefix", "backoffLimit": 0},
        podAnnotations={"a": "b"},
    )
    assert changed.identity().hash() == base


def test_instance_family_and_image_change_the_identity() -> None:
    base = spec().identity().hash()
    assert spec(instanceType="trn2.3xlarge").identity().hash() == base  # same family, same graphs
    assert spec(instanceType="inf2.48xlarge").identity().hash() != base
    assert spec(image="neuronfleet/engine:9").identity().hash() != base


@pytest.mark.parametrize(
    ("store", "kind", "claim", "subpath"),
    [
        ("pvc://cache", "pvc", "cache", ""),
        ("pvc://cache/neff/prod/", "pvc", "cache", "neff/prod"),
        ("s3://bucket/prefix", "s3", None, ""),
    ],
)
def test_artifact_store_forms(store: str, kind: str, claim: str | None, subpath: str) -> None:
    settings = CompileSettings(artifact_store=store)
    assert (settings.store_kind, settings.store_claim) == (kind, claim)
    if kind == "pvc":
        assert settings.store_subpath == subpath


@pytest.mark.parametrize(
    ("node_cache", "field"),
    [
        ({"hostPath": "/"}, "hostPath"),
        ({"hostPath": "/var/../etc"}, "hostPath"),
        ({"hostPath": "relative/dir"}, "hostPath"),
        ({"hostPath": "/var/cache/neuronfleet", "sizeLimit": "0"}, "sizeLimit"),
        ({"hostPath": "/var/cache/neuronfleet", "sizeLimit": "-1Gi"}, "sizeLimit"),
    ],
)
def test_a_node_cache_is_a_real_directory_with_room(node_cache: dict[str, str], field: str) -> None:
    """Not the node's root nor a path that climbs out, and a bound above zero (the engine refuses 0 bytes)."""
    error = error_of(compile={"artifactStore": "s3://bucket/p", "s3": {"nodeCache": node_cache}})
    assert [e["loc"][-1] for e in error.errors()] == [field]
    cache = {"nodeCache": {"hostPath": "/root/.cache/neuronfleet"}}
    fine = spec(compile={"artifactStore": "s3://bucket/p", "s3": cache})
    assert fine.compile.s3 is not None
    assert fine.compile.s3.node_cache is not None
    assert fine.compile.s3.node_cache.size_limit == "200Gi"
