"""How a serving pod gets its Neuron devices: from the device plugin (a resource count, and the runtime's LNC in
its environment), or through DRA (a ResourceClaimTemplate of the Neuron DRA driver: the devices its tensor
parallelism needs, in one NeuronLink-connected group, at its logical-NeuronCore setting).
"""

from __future__ import annotations

import hashlib
import json

from neuronfleet.contract import dra
from neuronfleet.operator import api
from neuronfleet.operator.plan.shared import MANAGED_BY, Obj, Owner, service_labels

#: The name of a serving pod's Neuron claim (and of the request in it) when DRA hands out its devices.
NEURON_CLAIM = "neuron"


#: Hex digits of a claim template's content hash in its name.
CLAIM_HASH_LENGTH = 10


def neuron_claim(spec: api.NeuronInferenceServiceSpec) -> Obj:
    """What one replica claims of the Neuron DRA driver: the devices its tensor parallelism needs, on its instance
    type, all in one NeuronLink-connected group, configured at its logical-NeuronCore setting."""
    instance = spec.instance
    attributes = f"device.attributes['{dra.DRIVER}']"
    selector = (
        f"{attributes}.{dra.RESOURCE_TYPE} == '{dra.NEURON_DEVICE}'"
        f" && {attributes}.{dra.INSTANCE_TYPE} == '{instance.name}'"
    )
    devices: Obj = {
        "requests": [
            {
                "name": NEURON_CLAIM,
                "exactly": {
                    "deviceClassName": dra.DEVICE_CLASS,
                    "allocationMode": "ExactCount",
                    "count": spec.neuron_devices,
                    "selectors": [{"cel": {"expression": selector}}],
                },
            }
        ]
    }
    group = dra.connected_group(instance, spec.neuron_devices)
    if group is not None:
        devices["constraints"] = [{"requests": [NEURON_CLAIM], "matchAttribute": dra.connected_group_attribute(group)}]
    lnc = spec.placement.logical_neuron_cores or instance.chip.default_lnc
    parameters = {"apiVersion": dra.CONFIG_API_VERSION, "kind": dra.CONFIG_KIND, "logicalNeuronCore": lnc}
    devices["config"] = [{"requests": [NEURON_CLAIM], "opaque": {"driver": dra.DRIVER, "parameters": parameters}}]
    return {"devices": devices}


def claims_devices(spec: api.NeuronInferenceServiceSpec, devices: api.DeviceAllocation) -> bool:
    """Whether replicas claim their devices through DRA: Neuron ones by the way in force (``devices``), simulated
    ones only when their spec says ``dra`` (a rehearsal of placement against a driver publishing simulated devices)."""
    if spec.device == "sim":
        return spec.placement.devices == "dra"
    return devices == "dra"


def claim_template(owner: Owner, namespace: str, spec: api.NeuronInferenceServiceSpec) -> Obj:
    """The ResourceClaimTemplate each serving pod's claim is made from. Named by content, like the engine
    ConfigMap: a changed claim is a new template, and old pods' replacements keep theirs during a rollout."""
    claim = neuron_claim(spec)
    digest = hashlib.sha256(json.dumps(claim, sort_keys=True).encode()).hexdigest()[:CLAIM_HASH_LENGTH]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": owner.child_metadata(
            f"{owner.name}-neuron-{digest}", namespace, {**service_labels(owner.name), **MANAGED_BY}
        ),
        "spec": {"metadata": {"labels": service_labels(owner.name)}, "spec": claim},
    }


def pod_claims(claim: Obj | None) -> Obj:
    """The pod spec's claim of its Neuron devices, made from ``claim`` (a template); nothing without one."""
    if claim is None:
        return {}
    return {"resourceClaims": [{"name": NEURON_CLAIM, "resourceClaimTemplateName": claim["metadata"]["name"]}]}


def lnc_env(spec: api.NeuronInferenceServiceSpec, claim: Obj | None) -> list[Obj]:
    """The runtime's LNC, set where the device plugin gives the devices (a DRA claim's config sets it otherwise)."""
    lnc = spec.placement.logical_neuron_cores
    if spec.device != "neuron" or claim is not None or lnc is None:
        return []
    return [{"name": dra.LNC_ENV, "value": str(lnc)}]
