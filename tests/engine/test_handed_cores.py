"""The simulated runtime starts on the NeuronCores its container was handed, or refuses as Neuron's runtime would."""

from __future__ import annotations

import pytest

from neuronfleet.contract import dra
from neuronfleet.engine.sim.handed_cores import check_handed_cores, parse_cores


def test_the_runtimes_core_ranges_are_read_as_it_writes_them() -> None:
    assert parse_cores("0-3") == (0, 1, 2, 3)
    assert parse_cores("4-7,12") == (4, 5, 6, 7, 12)
    assert parse_cores(" 8 ") == (8,)


@pytest.mark.parametrize("text", ["", "a-3", "3-1", "0-3,", "-1"])
def test_text_that_names_no_cores_is_refused_with_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=dra.VISIBLE_CORES_ENV):
        parse_cores(text)


def test_a_container_handed_no_devices_is_not_checked() -> None:
    assert check_handed_cores({}, tensor_parallel_size=64, lnc=2) is None


def test_a_claim_that_hands_enough_cores_at_the_compiled_setting_starts_on_them() -> None:
    environ = {dra.VISIBLE_CORES_ENV: "4-7", dra.LNC_ENV: "2"}
    assert check_handed_cores(environ, tensor_parallel_size=4, lnc=2) == (4, 5, 6, 7)


def test_fewer_cores_than_the_tensor_parallelism_is_refused_naming_both() -> None:
    with pytest.raises(ValueError, match=r"handed 4 logical NeuronCores \(NEURON_RT_VISIBLE_CORES=0-3\).* needs 8"):
        check_handed_cores({dra.VISIBLE_CORES_ENV: "0-3"}, tensor_parallel_size=8, lnc=2)


def test_a_setting_other_than_the_graphs_were_compiled_for_is_refused() -> None:
    with pytest.raises(ValueError, match=r"NEURON_LOGICAL_NC_CONFIG=1, but the replica's graphs are compiled for .* 2"):
        check_handed_cores({dra.VISIBLE_CORES_ENV: "0-7", dra.LNC_ENV: "1"}, tensor_parallel_size=4, lnc=2)
