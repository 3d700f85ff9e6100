"""Fake nodes carry what real Neuron nodes advertise."""

from __future__ import annotations

import pytest

from neuronfleet.contract import dra
from neuronfleet.contract.hardware import INSTANCE_TYPES, NEURON_CORE_RESOURCE, NEURON_DEVICE_RESOURCE, NEURON_TAINT_KEY
from neuronfleet.devcluster.controlplane import devices
from neuronfleet.devcluster.controlplane.fleet import (
    DEFAULT_FLEET,
    INF2_48XLARGE,
    M7I_8XLARGE,
    TRN2_48XLARGE,
    InstanceShape,
    NodePool,
    fleet_nodes,
)


def test_trn2_node_has_sixteen_devices_sixty_four_cores_and_the_neuron_taint() -> None:
    node = NodePool("trn2", TRN2_48XLARGE, count=1).nodes()[0]

    assert node["status"]["capacity"][NEURON_DEVICE_RESOURCE] == "16"
    assert node["status"]["allocatable"][NEURON_CORE_RESOURCE] == "64"
    assert node["spec"]["taints"] == [{"key": NEURON_TAINT_KEY, "effect": "NoSchedule"}]
    assert node["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "trn2.48xlarge"
    assert node["metadata"]["labels"]["topology.kubernetes.io/zone"] == "us-east-2a"
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}


def test_cpu_nodes_have_no_neuron_resources_or_taint() -> None:
    node = NodePool("cpu", M7I_8XLARGE, count=1).nodes()[0]

    assert NEURON_DEVICE_RESOURCE not in node["status"]["capacity"]
    assert node["spec"]["taints"] == []


def test_pools_spread_over_zones_with_distinct_names() -> None:
    nodes = NodePool("inf2", INF2_48XLARGE, count=3).nodes()

    assert [n["metadata"]["name"] for n in nodes] == ["inf2-0", "inf2-1", "inf2-2"]
    assert [n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes] == [
        "us-east-2a",
        "us-east-2b",
        "us-east-2a",
    ]


def test_default_fleet_has_trn2_inf2_and_cpu_pools_with_distinct_addresses() -> None:
    nodes = fleet_nodes(DEFAULT_FLEET)

    assert {pool.shape.instance_type for pool in DEFAULT_FLEET} == {"trn2.48xlarge", "inf2.48xlarge", "m7i.8xlarge"}
    addresses = [n["status"]["addresses"][0] for n in nodes]
    assert all(a["type"] == "InternalIP" for a in addresses)
    assert len({a["address"] for a in addresses}) == len(nodes) == 5


@pytest.mark.parametrize("name", list(INSTANCE_TYPES))
def test_a_neuron_node_advertises_the_catalogued_devices_cores_and_host(name: str) -> None:
    instance = INSTANCE_TYPES[name]
    capacity = NodePool("pool", InstanceShape.neuron(name), count=1).nodes()[0]["status"]["capacity"]

    assert capacity[NEURON_DEVICE_RESOURCE] == str(instance.devices)
    assert capacity[NEURON_CORE_RESOURCE] == str(instance.devices * instance.cores_per_device)
    assert (capacity["cpu"], capacity["memory"]) == (str(instance.vcpus), f"{instance.memory_gib}Gi")


def test_a_fake_nodes_devices_are_published_as_the_neuron_dra_driver_does() -> None:
    published = devices.resource_slice("trn2-0", "trn2.48xlarge")
    spec = published["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (dra.DRIVER, "trn2-0", "trn2-0")
    assert [d["name"] for d in spec["devices"]] == [f"neurondevice{i}" for i in range(16)]
    for size in (4, 8, 16):
        attribute = dra.connected_group_attribute(size)
        groups = [d["attributes"][attribute]["string"] for d in spec["devices"]]
        # Consecutive devices share a group, ``size`` to a group, and no two groups share an id.
        assert groups == [g for g in dict.fromkeys(groups) for _ in range(size)]
        assert len(set(groups)) == 16 // size
    # Another node's groups are its own.
    other = devices.resource_slice("trn2-1", "trn2.48xlarge")["spec"]["devices"][0]["attributes"]
    assert other[dra.connected_group_attribute(4)] != spec["devices"][0]["attributes"][dra.connected_group_attribute(4)]
    # Inferentia2 names no groups: its devices are only a node's.
    inf2 = devices.resource_slice("inf2-0", "inf2.48xlarge")["spec"]["devices"]
    assert len(inf2) == 12
    assert not [a for a in inf2[0]["attributes"] if a.startswith("resource.aws.com/")]
