"""Neuron devices through DRA: the claim a replica makes of the Neuron driver, and how pods reference it."""

from __future__ import annotations

from typing import Any

import pytest

from neuronfleet.contract import dra
from neuronfleet.contract.hardware import INSTANCE_TYPES, NEURON_DEVICE_RESOURCE, get_instance_type
from neuronfleet.operator import api, plan
from neuronfleet.operator.policy import rollout
from neuronfleet.operator.reconcilers.devices import NeuronDevices

OWNER = plan.Owner(api.API_VERSION, "NeuronInferenceService", "llama", "uid-1")
NS = "serving"
MODEL = {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"}


def spec(**fields: Any) -> api.NeuronInferenceServiceSpec:
    return api.parse_service_spec({"model": MODEL, **fields})


def serving(s: api.NeuronInferenceServiceSpec, devices: api.DeviceAllocation = "dra") -> plan.ServingPlan:
    identity = s.identity()
    served = plan.ServedArtifact(plan.artifact_name(identity), identity.hash(), s.compile)
    return plan.serving_plan(OWNER, NS, s, served, devices)


def claim_of(planned: plan.ServingPlan) -> dict[str, Any]:
    assert planned.claim_template is not None
    devices: dict[str, Any] = planned.claim_template["spec"]["spec"]["devices"]
    return devices


def template_name(planned: plan.ServingPlan) -> str:
    assert planned.claim_template is not None
    return str(planned.claim_template["metadata"]["name"])


@pytest.mark.parametrize(
    ("devices", "group"),
    [(1, None), (2, 4), (3, 4), (4, 4), (5, 8), (8, 8), (9, 16), (16, 16)],
)
def test_a_claim_keeps_its_devices_in_the_smallest_connected_group_that_holds_them(
    devices: int, group: int | None
) -> None:
    assert dra.connected_group(get_instance_type("trn2.48xlarge"), devices) == group


def test_instances_without_named_groups_claim_devices_of_one_node_alone() -> None:
    assert dra.connected_group(get_instance_type("inf2.48xlarge"), 12) is None
    assert all(
        max(instance.connected_groups, default=instance.devices) == instance.devices
        for instance in INSTANCE_TYPES.values()
    ), "a node's largest group is all its devices"


def test_a_dra_replica_claims_connected_devices_at_its_lnc_instead_of_requesting_the_device_plugins() -> None:
    planned = serving(spec(engine={"tensor_parallel_size": 16}, instanceType="trn2.48xlarge"))
    (request,) = claim_of(planned)["requests"]
    exactly = request["exactly"]
    assert (exactly["deviceClassName"], exactly["allocationMode"], exactly["count"]) == (
        "neuron.aws.com",
        "ExactCount",
        4,
    )
    (selector,) = exactly["selectors"]
    assert "instanceType == 'trn2.48xlarge'" in selector["cel"]["expression"]
    assert claim_of(planned)["constraints"] == [
        {"requests": [plan.NEURON_CLAIM], "matchAttribute": "resource.aws.com/devicegroup4_id"}
    ]
    (config,) = claim_of(planned)["config"]
    assert config["opaque"]["driver"] == dra.DRIVER
    assert config["opaque"]["parameters"] == {
        "apiVersion": "neuron.aws.com/v1",
        "kind": "NeuronConfig",
        "logicalNeuronCore": 2,
    }

    pod = planned.deployment["spec"]["template"]["spec"]
    template = planned.claim_template
    assert template is not None
    assert pod["resourceClaims"] == [
        {"name": plan.NEURON_CLAIM, "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    (container,) = pod["containers"]
    assert container["resources"]["claims"] == [{"name": plan.NEURON_CLAIM}]
    assert NEURON_DEVICE_RESOURCE not in container["resources"]["requests"]
    assert NEURON_DEVICE_RESOURCE not in container["resources"]["limits"]
    assert planned.pod_inputs == {planned.configmap_name, template["metadata"]["name"]}


def test_lnc_1_doubles_the_logical_cores_so_the_same_tensor_parallelism_claims_half_the_devices() -> None:
    paired = serving(spec(engine={"tensor_parallel_size": 32}))
    alone = serving(spec(engine={"tensor_parallel_size": 32}, placement={"logicalNeuronCores": 1}))
    assert claim_of(paired)["requests"][0]["exactly"]["count"] == 8
    assert claim_of(alone)["requests"][0]["exactly"]["count"] == 4
    assert claim_of(alone)["config"][0]["opaque"]["parameters"]["logicalNeuronCore"] == 1
    # A new setting is a new claim template and, since the graphs differ, a new artifact.
    assert paired.claim_template != alone.claim_template
    assert (
        alone.deployment["spec"]["template"]["metadata"]["labels"]
        != paired.deployment["spec"]["template"]["metadata"]["labels"]
    )


def test_a_bucket_change_keeps_the_claim_template_a_device_change_replaces_it() -> None:
    base = serving(spec(engine={"tensor_parallel_size": 8}))
    buckets = serving(spec(engine={"tensor_parallel_size": 8, "max_num_seqs": 4}))
    wider = serving(spec(engine={"tensor_parallel_size": 16}))
    assert template_name(base) == template_name(buckets)
    assert template_name(base) != template_name(wider)
    assert template_name(base).startswith("llama-neuron-")


def test_the_device_plugin_way_is_unchanged_and_sets_the_runtimes_lnc_only_when_asked() -> None:
    planned = serving(spec(engine={"tensor_parallel_size": 8}), "devicePlugin")
    assert planned.claim_template is None
    pod = planned.deployment["spec"]["template"]["spec"]
    assert "resourceClaims" not in pod
    (container,) = pod["containers"]
    assert container["resources"]["limits"][NEURON_DEVICE_RESOURCE] == "2"
    assert dra.LNC_ENV not in {e["name"] for e in container["env"]}
    alone = serving(spec(engine={"tensor_parallel_size": 8}, placement={"logicalNeuronCores": 1}), "devicePlugin")
    (container,) = alone.deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": dra.LNC_ENV, "value": "1"} in container["env"]
    assert container["resources"]["limits"][NEURON_DEVICE_RESOURCE] == "1"


def test_the_spec_chooses_the_way_and_a_simulated_replica_claims_devices_only_when_it_says_dra() -> None:
    assert serving(spec(device="sim")).claim_template is None
    rehearsed = serving(spec(device="sim", placement={"devices": "dra"}), "devicePlugin")
    assert claim_of(rehearsed)["requests"][0]["exactly"]["count"] == 1
    (container,) = rehearsed.deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["claims"] == [{"name": plan.NEURON_CLAIM}]
    assert container["resources"]["requests"]["cpu"] == plan.SIM_CPU
    chosen = spec(placement={"devices": "devicePlugin"})
    assert NeuronDevices("dra").allocation(chosen) == "devicePlugin"
    assert NeuronDevices("dra").allocation(spec()) == "dra"


def test_a_deployments_claim_template_is_kept_with_its_config_map() -> None:
    planned = serving(spec(engine={"tensor_parallel_size": 8}))
    applied = {**planned.deployment, "status": {}}
    view = rollout.DeploymentView.of(applied, plan.CONFIG_VOLUME)
    assert view.pod_inputs == planned.pod_inputs
