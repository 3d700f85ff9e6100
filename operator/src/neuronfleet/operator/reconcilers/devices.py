"""How Neuron replicas get their devices where a spec does not say: the operator's default, resolved once.

``auto`` asks the cluster at start: the Neuron DRA driver's DeviceClass present means DRA claims, else the
device plugin's ``aws.amazon.com/neuron``. The two are not mixed on a node (the Neuron documentation: install
one or the other), so a cluster that moves from one to the other restarts the operator, whose next pass rolls
the services that follow its default onto the new way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from neuronfleet.contract import dra
from neuronfleet.operator import api
from neuronfleet.operator.cluster.kube import DEVICE_CLASSES, FORBIDDEN, NOT_FOUND, ApiError, Kube

log = logging.getLogger(__name__)

#: The operator's ``--neuron-devices``: a way, or ``auto`` (what the cluster offers).
NeuronDevicesSetting = Literal["auto", "dra", "devicePlugin"]


@dataclass(frozen=True)
class NeuronDevices:
    """The way Neuron replicas get devices when their ``spec.placement.devices`` is unset."""

    default: api.DeviceAllocation

    def allocation(self, spec: api.NeuronInferenceServiceSpec) -> api.DeviceAllocation:
        """The way in force for ``spec``."""
        return spec.placement.devices or self.default

    @classmethod
    def resolve(cls, setting: NeuronDevicesSetting, kube: Kube) -> NeuronDevices:
        """``setting``, with ``auto`` decided by whether the cluster has the Neuron DRA driver's DeviceClass."""
        if setting != "auto":
            return cls(setting)
        try:
            kube.request("GET", DEVICE_CLASSES.path(None, dra.DEVICE_CLASS))
        except ApiError as error:
            if error.status == FORBIDDEN:
                log.warning(
                    "may not read DeviceClass %s (grant get on it, or set --neuron-devices): Neuron devices through "
                    "the device plugin",
                    dra.DEVICE_CLASS,
                )
                return cls("devicePlugin")
            if error.status != NOT_FOUND:
                raise
            log.info("no DeviceClass %s: Neuron devices through the device plugin", dra.DEVICE_CLASS)
            return cls("devicePlugin")
        log.info("DeviceClass %s found: Neuron devices through DRA claims", dra.DEVICE_CLASS)
        return cls("dra")
