"""The hardware catalogue: the published figures, and every instance type the CRD accepts runs on the sim device."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
import yaml

from neuronfleet.contract.hardware import (
    DEFAULT_INSTANCE_TYPE,
    GIB,
    INSTANCE_TYPES,
    InstanceTypeName,
    get_instance_type,
    largest_instance_type,
)
from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.cli.serve import sim_settings
from neuronfleet.engine.sim.cost_model import CostModel

SERVICE_CRD = Path(__file__).resolve().parents[2] / "crds" / "neuroninferenceservices.neuronfleet.io.yaml"


def crd_instance_types() -> list[str]:
    """The ``spec.instanceType`` enum of the checked-in NeuronInferenceService CRD: what admission accepts."""
    crd = yaml.safe_load(SERVICE_CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    names: list[str] = spec["properties"]["instanceType"]["enum"]
    return names


def test_instance_totals_match_the_published_instance_figures() -> None:
    trn2 = get_instance_type("trn2.48xlarge")
    # trn2.48xlarge: 10.7 BF16 PFLOPS, 1,536 GiB of HBM at 46.4 TB/s, 64 logical NeuronCores at LNC=2.
    assert trn2.devices * trn2.chip.bf16_tflops == pytest.approx(10_672)
    assert trn2.devices * trn2.chip.hbm_bytes == 1536 * GIB
    assert trn2.devices * trn2.chip.hbm_bandwidth == pytest.approx(46.4e12)
    assert trn2.cores == 64
    inf2 = get_instance_type("inf2.48xlarge")
    # inf2.48xlarge: 2,280 BF16 TFLOPS, 384 GiB, 24 NeuronCores.
    assert inf2.devices * inf2.chip.bf16_tflops == pytest.approx(2280)
    assert inf2.devices * inf2.chip.hbm_bytes == 384 * GIB
    assert inf2.cores == 24
    trn1 = get_instance_type("trn1.32xlarge")
    # trn1.32xlarge: 3,040 BF16 TFLOPS, 512 GiB of HBM at 13,120 GiB/s, 32 NeuronCores.
    assert trn1.devices * trn1.chip.bf16_tflops == pytest.approx(3040)
    assert trn1.devices * trn1.chip.hbm_bytes == 512 * GIB
    assert trn1.devices * trn1.chip.hbm_bandwidth == 13_120 * GIB
    assert trn1.cores == 32
    # trn2.3xlarge: one Trainium2, 96 GiB of HBM.
    assert (get_instance_type("trn2.3xlarge").cores, get_instance_type("trn2.3xlarge").chip.hbm_bytes) == (4, 96 * GIB)


def test_every_figure_names_its_public_source() -> None:
    for instance in INSTANCE_TYPES.values():
        for source in (instance.source, instance.chip.source):
            assert re.match(r"https://(awsdocs-neuron\.readthedocs-hosted\.com|aws\.amazon\.com)/", source), source


def test_the_catalogue_holds_each_name_of_the_type_once() -> None:
    assert tuple(INSTANCE_TYPES) == get_args(InstanceTypeName)
    assert all(name == instance.name for name, instance in INSTANCE_TYPES.items())
    assert DEFAULT_INSTANCE_TYPE in INSTANCE_TYPES


def test_the_target_family_comes_from_the_chip() -> None:
    targets = {name: instance.target for name, instance in INSTANCE_TYPES.items()}
    assert {name for name, target in targets.items() if target == "trn1"} == {
        "trn1.2xlarge",
        "trn1.32xlarge",
        "trn1n.32xlarge",
    }
    assert targets["trn2u.48xlarge"] == targets["trn2.3xlarge"] == "trn2"
    assert [largest_instance_type(t).name for t in ("trn1", "trn2", "inf2")] == [
        "trn1.32xlarge",
        "trn2.48xlarge",
        "inf2.48xlarge",
    ]


def test_unknown_instance_type() -> None:
    with pytest.raises(ValueError, match=re.escape("unknown instance type 'p5.48xlarge'; known: trn2.3xlarge, ")):
        get_instance_type("p5.48xlarge")


@pytest.mark.parametrize("name", crd_instance_types())
def test_every_instance_type_the_crd_accepts_configures_the_simulated_device(name: str) -> None:
    catalogued = get_instance_type(name)
    settings = sim_settings("hf://neuronfleet/tiny", catalogued.target, None, catalogued.name, "virtual")
    assert (settings.instance_type, settings.shape) == (name, "tiny")
    instance = get_instance_type(settings.instance_type)
    for tensor_parallel_size in (1, instance.cores):
        cost = CostModel(instance, get_shape(settings.shape), tensor_parallel_size)
        assert cost.kv_cache_bytes(0.9) > 0
        assert cost.prefill_seconds(128, 0) >= cost.decode_seconds(1, 0) > 0


def test_lnc_1_gives_a_trainium2_node_twice_the_logical_cores_and_a_tp_half_the_devices() -> None:
    trn2 = get_instance_type("trn2.48xlarge")
    assert (trn2.chip.default_lnc, trn2.chip.lnc_settings) == (2, (2, 1))
    assert (trn2.cores_at(None), trn2.cores_at(1)) == (64, 128)
    assert (trn2.devices_for(16), trn2.devices_for(16, 1)) == (4, 2)
    inf2 = get_instance_type("inf2.48xlarge")
    assert (inf2.chip.lnc_settings, inf2.cores_at(1)) == ((1,), 24)
