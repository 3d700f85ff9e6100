"""How far each Neuron chip's steps fall short of its peak figures: the cost model's fitted constants.

The hardware catalogue gives each chip's peak dense BF16 FLOP/s and HBM bandwidth. Neuron's
published latencies (:mod:`neuronfleet.engine.sim.published`) show how much of them a prefill or a
decode step reaches, and what each step costs beyond its FLOPs and bytes. Each :class:`Calibration`
holds those constants for one chip, fitted on the rows it names (``published.fit`` reproduces them;
``bench/calibration.py`` prints the fit and every row's prediction), and ``docs/engine.md``
("Calibration") gives them with their sources.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

#: Host time to launch one step: the vLLM Neuron plugin's async-execution design measures 0.44 ms a step
#: (vllm-neuron/docs/design/vllm/async-execution.md). Not fitted: the published rows cannot separate it
#: from the per-layer costs.
HOST_DISPATCH_S = 0.00044


@dataclass(frozen=True)
class Calibration:
    """The fitted constants of one chip: shares of peak reached, and fixed costs per layer and step."""

    #: The chip (``hardware.Chip.name``) the constants were fitted for.
    chip: str
    #: Share of peak dense BF16 FLOP/s a prefill step's matrix multiplications reach.
    dense_efficiency: float
    #: Share of peak a prefill step's attention (causal, over its context) reaches.
    attention_efficiency: float
    #: Share of peak HBM bandwidth a decode step reaches reading the weights.
    weight_read_efficiency: float
    #: Share of peak HBM bandwidth a decode step reaches reading the KV cache of its compiled context.
    kv_read_efficiency: float
    #: Fixed on-device seconds per layer of a prefill step (collectives, kernel launches, norms).
    prefill_layer_s: float
    #: Fixed on-device seconds per layer of a decode step.
    decode_layer_s: float
    #: Ids of the published rows the constants were fitted on.
    fitted_on: tuple[str, ...]
    host_dispatch_s: float = HOST_DISPATCH_S

    def scaled(self, name: str, factor: float) -> Calibration:
        """The same constants with ``name`` multiplied by ``factor`` (the benchmarks' sensitivity band)."""
        if name not in FITTED_CONSTANTS:
            raise ValueError(f"unknown constant {name!r}; fitted: {', '.join(FITTED_CONSTANTS)}")
        return replace(self, **{name: getattr(self, name) * factor})


#: The constants a fit sets, in their order (every float field).
FITTED_CONSTANTS: tuple[str, ...] = tuple(
    f.name for f in fields(Calibration) if f.type == "float" and f.name != "host_dispatch_s"
)

_INF2_FIT = (
    "inf2-lat-07", "inf2-lat-14", "inf2-lat-15", "inf2-lat-06", "inf2-lat-08", "inf2-lat-10", "inf2-lat-13",
    "inf2-lat-17", "inf2-lat-18", "inf2-lat-19", "inf2-lat-21", "inf2-lat-22", "inf2-lat-25", "inf2-lat-27",
)  # fmt: skip
_TRN1_FIT = (
    "trn1-lat-04", "trn1-lat-07", "trn1-lat-10", "trn1-lat-12", "trn1-lat-13", "trn1-lat-15", "trn1-thr-05",
)  # fmt: skip

#: Inferentia2 (NeuronCore-v2): fitted on its own 14 rows, every constant free.
INFERENTIA2 = Calibration(
    chip="Inferentia2",
    dense_efficiency=0.265,
    attention_efficiency=0.0232,
    weight_read_efficiency=0.51,
    kv_read_efficiency=0.333,
    prefill_layer_s=0.000567,
    decode_layer_s=8.24e-05,
    fitted_on=_INF2_FIT,
)
#: Trainium (NeuronCore-v2, as Inferentia2, on a faster interconnect): its fixed costs and efficiencies fitted
#: on its 7 rows, with Inferentia2's ratios of attention to dense and of KV to weight reads.
TRAINIUM = Calibration(
    chip="Trainium",
    dense_efficiency=0.216,
    attention_efficiency=0.0189,
    weight_read_efficiency=0.648,
    kv_read_efficiency=0.423,
    prefill_layer_s=0.000329,
    decode_layer_s=0.000127,
    fitted_on=_TRN1_FIT,
)
#: Trainium2 (NeuronCore-v3): three published rows, so two constants each for prefill and decode, with
#: Inferentia2's ratios as for Trainium; the weight read efficiency is held at the fit's ceiling (0.8), since
#: three rows would put it above the HBM's peak.
TRAINIUM2 = Calibration(
    chip="Trainium2",
    dense_efficiency=0.529,
    attention_efficiency=0.0463,
    weight_read_efficiency=0.8,
    kv_read_efficiency=0.522,
    prefill_layer_s=0.00123,
    decode_layer_s=0.000163,
    fitted_on=("A", "B", "C"),
)
#: Trainium3 (NeuronCore-v4): nothing is published yet, so Trainium2's constants on Trainium3's peak figures.
TRAINIUM3 = replace(TRAINIUM2, chip="Trainium3")

CALIBRATIONS: dict[str, Calibration] = {c.chip: c for c in (INFERENTIA2, TRAINIUM, TRAINIUM2, TRAINIUM3)}


def calibration_for(chip: str) -> Calibration:
    """The constants of the chip named ``chip``; a ``ValueError`` naming the calibrated chips otherwise."""
    calibration = CALIBRATIONS.get(chip)
    if calibration is None:
        raise ValueError(f"no calibration for chip {chip!r}; calibrated: {', '.join(CALIBRATIONS)}")
    return calibration
