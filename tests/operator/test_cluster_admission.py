"""Invalid specs are rejected by the API server itself (CEL and schema), naming the field and the rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from neuronfleet.operator.api import describe_errors, parse_service_spec, rules
from neuronfleet.operator.api.rule import Rule
from neuronfleet.operator.cluster.kube import ARTIFACTS, SERVICES_NIS, ApiError, Kube

# The operator's fixtures (`api`, `operator`, `services`), for the modules that run it alone.
pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]
MODEL = {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"}


def service(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "neuronfleet.io/v1alpha1",
        "kind": "NeuronInferenceService",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"model": MODEL, **spec},
    }


def rejection(api: Kube, body: Obj) -> str:
    with pytest.raises(ApiError) as caught:
        api.create(body)
    assert caught.value.status == 422, caught.value
    return caught.value.message


INVALID: list[tuple[str, Obj, str]] = [
    (
        "duplicate",
        {"engine": {"num_seqs_buckets": [1, 2, 2, 8]}},
        "spec.engine.num_seqs_buckets[2]: Duplicate value: 2",
    ),
    ("zero", {"engine": {"num_seqs_buckets": [0, 8]}}, "spec.engine.num_seqs_buckets[0]: Invalid value: 0"),
    (
        "negative",
        {"engine": {"num_batched_tokens_buckets": [-128, 8192]}},
        "spec.engine.num_batched_tokens_buckets[0]: Invalid value: -128",
    ),
    (
        "string-items",
        {"engine": {"num_seqs_buckets": ["1", "8"]}},
        'spec.engine.num_seqs_buckets[0]: Invalid value: "string"',
    ),
    ("not-a-list", {"engine": {"num_seqs_buckets": "1,2,4,8"}}, "spec.engine.num_seqs_buckets: Invalid value"),
    ("zero-max-seqs", {"engine": {"max_num_seqs": 0}}, "spec.engine.max_num_seqs: Invalid value: 0"),
    (
        "prefill-cap-word",
        {"engine": {"scheduler": {"max_prefill_tokens_while_decoding": "fast"}}},
        'spec.engine.scheduler.max_prefill_tokens_while_decoding: Invalid value: "fast": must be auto, or an '
        "integer from 1 to 1048576",
    ),
    (
        "prefill-cap-zero",
        {"engine": {"scheduler": {"max_prefill_tokens_while_decoding": 0}}},
        "spec.engine.scheduler.max_prefill_tokens_while_decoding: Invalid value: 0: must be auto, or an "
        "integer from 1 to 1048576",
    ),
    ("device", {"device": "gpu"}, 'spec.device: Unsupported value: "gpu"'),
    ("instance-type", {"instanceType": "p5.48xlarge"}, 'spec.instanceType: Unsupported value: "p5.48xlarge"'),
    ("model-uri", {"model": {"uri": "meta-llama/Llama-3.1-8B"}}, "spec.model.uri: Invalid value"),
    (
        "autoscaling-max",
        {"autoscaling": {"maxReplicas": 500}},
        "spec.autoscaling.maxReplicas: Invalid value: 500: spec.autoscaling.maxReplicas in body should be less "
        "than or equal to 100",
    ),
    ("autoscaling-no-max", {"autoscaling": {"minReplicas": 1}}, "spec.autoscaling.maxReplicas: Required value"),
    (
        "autoscaling-kv",
        {"autoscaling": {"maxReplicas": 4, "kvCacheUsage": 0}},
        "spec.autoscaling.kvCacheUsage: Invalid value: 0: spec.autoscaling.kvCacheUsage in body should be greater "
        "than 0",
    ),
]


@pytest.mark.parametrize(("case", "spec", "message"), INVALID, ids=[case for case, _, _ in INVALID])
def test_invalid_spec_is_rejected_at_admission(api: Kube, case: str, spec: Obj, message: str) -> None:
    assert message in rejection(api, service(f"invalid-{case}", **spec))


#: Each example of each admission rule a service's spec is held to: a new rule is tested once declared.
EXAMPLES = [(rule, example) for rule in rules.SERVICE_SPEC_RULES for example in rule.examples]


@pytest.mark.parametrize(
    ("rule", "example"),
    EXAMPLES,
    ids=[f"{rule.name}-{rule.examples.index(example)}" for rule, example in EXAMPLES],
)
def test_admission_and_the_operator_say_the_same_thing(api: Kube, rule: Rule[Any], example: Obj) -> None:
    # One declaration, two checks: the API server's CEL and the models' Python (what a spec that slipped
    # past admission shows in its status) refuse the same spec on the same field with the same message.
    name = f"same-{rule.name}-{rule.examples.index(example)}"
    rejected = rejection(api, service(name, **example))
    admission = rule.pattern().search(rejected)
    assert admission is not None, rejected
    if rule.checked_by == "admission":
        # Only the API server sees the old object: the operator takes what it let through.
        parse_service_spec({"model": MODEL, **example})
        assert f"spec{rule.field}: Invalid value: " in rejected
        return
    with pytest.raises(ValidationError) as caught:
        parse_service_spec({"model": MODEL, **example})
    field, operator_message = describe_errors(caught.value).split(": ", 1)
    assert f"{field}: " in rejected
    # The engine adds the list to its ascending-order message; the rule's own words are the same.
    operator = rule.pattern().match(operator_message)
    assert operator is not None, operator_message
    assert operator.group() == admission.group()


def test_invalid_metadata_name_is_rejected(api: Kube) -> None:
    assert "metadata.name must be a DNS-1035 label" in rejection(api, service("7b-model"))


def test_a_valid_spec_is_accepted_with_defaults_filled_in(api: Kube) -> None:
    created = api.create(service("valid-defaults", engine={"max_num_seqs": 6}))
    try:
        spec = created["spec"]
        assert spec["engine"]["max_num_batched_tokens"] == 8192
        assert spec["rollout"] == {"maxSurge": 1, "maxUnavailable": 0, "startupTimeoutSeconds": 1800}
        assert parse_service_spec(spec).engine.max_num_seqs == 6
    finally:
        api.delete(SERVICES_NIS, "default", "valid-defaults")


def test_the_scaler_writes_replicas_of_an_autoscaled_service_but_a_manifest_cannot(api: Kube) -> None:
    # KEDA's HPA scales through the scale subresource, which writes spec.replicas: that passes the
    # exclusivity rule on a service already autoscaled, while a manifest naming both never does.
    name = "autoscaled"
    created = api.create(service(name, autoscaling={"minReplicas": 1, "maxReplicas": 4}))
    try:
        assert "replicas" not in created["spec"]
        api.merge_patch(SERVICES_NIS, "default", name, {"spec": {"replicas": 3}}, subresource="scale")
        scaled = api.get(SERVICES_NIS, "default", name)
        assert scaled is not None
        assert (scaled["spec"]["replicas"], parse_service_spec(scaled["spec"]).desired_replicas) == (3, 3)
        # Turning autoscaling on for a service that names replicas needs them gone in the same change.
        plain = api.create(service("plain", replicas=2))
        assert plain["spec"]["replicas"] == 2
        with pytest.raises(ApiError) as caught:
            api.merge_patch(SERVICES_NIS, "default", "plain", {"spec": {"autoscaling": {"maxReplicas": 4}}})
        assert "replicas and autoscaling are exclusive" in caught.value.message
        patched = api.merge_patch(
            SERVICES_NIS, "default", "plain", {"spec": {"replicas": None, "autoscaling": {"maxReplicas": 4}}}
        )
        assert "replicas" not in patched["spec"]
        assert patched["spec"]["autoscaling"]["maxReplicas"] == 4
    finally:
        api.delete(SERVICES_NIS, "default", name)
        api.delete(SERVICES_NIS, "default", "plain")


def test_an_artifact_is_immutable(api: Kube) -> None:
    artifact = {
        "apiVersion": "neuronfleet.io/v1alpha1",
        "kind": "NeuronCompiledArtifact",
        "metadata": {"name": "immutable-test", "namespace": "default"},
        "spec": {
            "model": MODEL,
            "engine": {"num_seqs_buckets": [1, 2, 4, 8]},
            "target": "trn2",
            "image": "neuronfleet/engine:0.1.0",
        },
    }
    api.create(copy.deepcopy(artifact))
    try:
        with pytest.raises(ApiError) as caught:
            api.merge_patch(ARTIFACTS, "default", "immutable-test", {"spec": {"engine": {"num_seqs_buckets": [8]}}})
        assert caught.value.status == 422
        assert "a compiled artifact is immutable" in caught.value.message
    finally:
        api.delete(ARTIFACTS, "default", "immutable-test")


def test_lnc_1_admits_twice_the_tensor_parallelism_a_node_holds_at_the_default(api: Kube) -> None:
    # 128 logical NeuronCores: a trn2.48xlarge's 16 devices at LNC=1; refused at the default (tp-beyond-node).
    created = api.create(service("lnc-one", engine={"tensor_parallel_size": 128}, placement={"logicalNeuronCores": 1}))
    try:
        assert parse_service_spec(created["spec"]).neuron_devices == 16
    finally:
        api.delete(SERVICES_NIS, "default", "lnc-one")
