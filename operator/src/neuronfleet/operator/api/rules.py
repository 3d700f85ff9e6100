"""Every admission rule, each declared once: its field, its CEL, its message and its Python check.

The CRDs carry the CEL (``crdgen`` reads it from the models, which read it from
here), the models run the Python check when the operator reads an object, and
the parity test sends each rule's examples to the API server and to the models
and expects the same field and message from both. A spec that slips past
admission (an older CRD, a direct write to etcd) so gets the API server's words
in its status.

What a rule is, and how its message is filled in, is :mod:`neuronfleet.operator.api.rule`. The bucket rules'
messages are the engine's own (:mod:`neuronfleet.contract.buckets`), and so is
their check: ``spec.engine`` is the engine's ``EngineConfig``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from neuronfleet.contract.buckets import (
    ASCENDING_MESSAGE,
    CONTEXT_BELOW_MAX_MESSAGE,
    CONTEXT_TILE_MESSAGE,
    DECODE_CONTEXT_LENGTH_BUCKETS,
    DECODE_CONTEXT_TILE,
    EMPTY_MESSAGE,
    LAST_BUCKET_MESSAGE,
    NUM_BATCHED_TOKENS_BUCKETS,
    NUM_SEQS_BUCKETS,
)
from neuronfleet.contract.hardware import INSTANCE_TYPES
from neuronfleet.operator.api.rule import Rule, Schema, cel_schema

if TYPE_CHECKING:
    from neuronfleet.contract.config import EngineConfig
    from neuronfleet.operator.api.artifact import NeuronCompiledArtifactSpec
    from neuronfleet.operator.api.rollout import Canary, DrainSettings, RolloutSettings
    from neuronfleet.operator.api.service import Autoscaling, Lora, NeuronInferenceServiceSpec


def _cel_map(values: dict[str, int]) -> str:
    """A CEL map literal, so admission rules read the hardware catalogue the operator does."""
    return "{" + ", ".join(f"'{key}': {value}" for key, value in sorted(values.items())) + "}"


_CORES_PER_DEVICE = _cel_map({name: t.cores_per_device for name, t in INSTANCE_TYPES.items()})
_PHYSICAL_CORES = _cel_map({name: t.chip.physical_cores for name, t in INSTANCE_TYPES.items()})
_MOST_LNC = _cel_map({name: max(t.chip.lnc_settings) for name, t in INSTANCE_TYPES.items()})
_DEVICES = _cel_map({name: t.devices for name, t in INSTANCE_TYPES.items()})

# The engine's bucket rules 1-6 (see neuronfleet.contract.buckets): strictly ascending is isSorted() plus
# the list type set (no duplicates), positive is the items' minimum (both in ENGINE_SCHEMA).


def _bucket_list_rules(name: str, short: str, unsorted: list[int]) -> tuple[Rule[list[int]], ...]:
    return (
        Rule(
            name=f"empty-{short}",
            field=f".{name}",
            cel="size(self) > 0",
            message=EMPTY_MESSAGE.format(name=name),
            checked_by="engine",
            examples=({"engine": {name: []}},),
            on_field=True,
        ),
        Rule(
            name=f"unsorted-{short}",
            field=f".{name}",
            cel="self.isSorted()",
            message=ASCENDING_MESSAGE.format(name=name),
            checked_by="engine",
            examples=({"engine": {name: unsorted}},),
            on_field=True,
        ),
    )


def _last_bucket_rule(
    name: str, short: str, limit_name: str, limit: str, examples: tuple[Schema, ...]
) -> Rule[EngineConfig]:
    """``limit_name``: the field that sets the limit, or a CEL expression naming it (quoted names inside)."""
    last = f"self.{name}[size(self.{name}) - 1]"
    named = limit_name.isidentifier()
    return Rule(
        name=f"last-{short}",
        field=f".{name}",
        cel=f"!has(self.{name}) || size(self.{name}) == 0 || {last} == {limit}",
        message=LAST_BUCKET_MESSAGE.format(name=name, limit_name=limit_name if named else "%s", limit="%d", last="%d"),
        args=(limit, last) if named else (limit_name, limit, last),
        checked_by="engine",
        examples=examples,
        reason="FieldValueInvalid",
    )


def _context_rule(name: str, condition: str, message: str, limit: str, examples: tuple[Schema, ...]) -> Rule[Any]:
    """A rule every decode context bucket must keep; the message names the first that breaks it."""
    buckets = f"self.{DECODE_CONTEXT_LENGTH_BUCKETS}"
    return Rule(
        name=name,
        field=f".{DECODE_CONTEXT_LENGTH_BUCKETS}",
        cel=f"!has({buckets}) || {buckets}.all(b, {condition})",
        message=message,
        args=(limit, f"{buckets}.filter(b, !({condition}))[0]"),
        checked_by="engine",
        examples=examples,
        reason="FieldValueInvalid",
    )


#: On ``EngineConfig``, in both kinds' ``spec.engine``.
ENGINE: tuple[Rule[Any], ...] = (
    *_bucket_list_rules(NUM_BATCHED_TOKENS_BUCKETS, "prefill", [1024, 512, 8192]),
    *_bucket_list_rules(NUM_SEQS_BUCKETS, "decode", [1, 4, 2, 8]),
    _last_bucket_rule(
        NUM_BATCHED_TOKENS_BUCKETS,
        "prefill",
        # The smaller of the two sets the limit: the message names that one.
        "(self.max_num_batched_tokens <= self.max_model_len ? 'max_num_batched_tokens' : 'max_model_len')",
        "(self.max_num_batched_tokens <= self.max_model_len ? self.max_num_batched_tokens : self.max_model_len)",
        (
            {"engine": {NUM_BATCHED_TOKENS_BUCKETS: [512, 1024, 2048]}},
            {"engine": {"max_model_len": 4096, NUM_BATCHED_TOKENS_BUCKETS: [1024, 8192]}},
        ),
    ),
    _last_bucket_rule(
        NUM_SEQS_BUCKETS,
        "decode",
        "max_num_seqs",
        "self.max_num_seqs",
        ({"engine": {"max_num_seqs": 8, NUM_SEQS_BUCKETS: [1, 2, 4]}},),
    ),
    *_bucket_list_rules(DECODE_CONTEXT_LENGTH_BUCKETS, "context", [4096, 1024]),
    _context_rule(
        "context-below-max",
        "b < self.max_model_len",
        CONTEXT_BELOW_MAX_MESSAGE.format(name=DECODE_CONTEXT_LENGTH_BUCKETS, limit="%d", value="%d"),
        "self.max_model_len",
        ({"engine": {"max_model_len": 4096, DECODE_CONTEXT_LENGTH_BUCKETS: [1024, 4096]}},),
    ),
    _context_rule(
        "context-tile",
        f"b % {DECODE_CONTEXT_TILE} == 0",
        CONTEXT_TILE_MESSAGE.format(name=DECODE_CONTEXT_LENGTH_BUCKETS, tile="%d", value="%d"),
        str(DECODE_CONTEXT_TILE),
        ({"engine": {DECODE_CONTEXT_LENGTH_BUCKETS: [1000]}},),
    ),
)


def _engine_schema() -> Schema:
    schema = cel_schema(ENGINE)
    for name in (NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS, DECODE_CONTEXT_LENGTH_BUCKETS):
        # No duplicates (with isSorted(): strictly ascending), and every bucket positive.
        schema["properties"][name].update({"x-kubernetes-list-type": "set", "items": {"minimum": 1}})
    return schema


#: The engine's model carries no Kubernetes markers of its own: crdgen merges this into its schema.
ENGINE_SCHEMA: Schema = _engine_schema()


def _surge_or_unavailable(rollout: RolloutSettings) -> tuple[object, ...] | None:
    return () if rollout.max_surge + rollout.max_unavailable == 0 else None


ROLLOUT: tuple[Rule[RolloutSettings], ...] = (
    Rule(
        name="rollout",
        field="",
        cel="self.maxSurge + self.maxUnavailable > 0",
        message="rollout.maxSurge and rollout.maxUnavailable cannot both be 0",
        check=_surge_or_unavailable,
        examples=({"rollout": {"maxSurge": 0, "maxUnavailable": 0}},),
    ),
)


def _weights_ascending(canary: Canary) -> tuple[object, ...] | None:
    weights = [step.weight for step in canary.steps]
    return None if all(a < b for a, b in itertools.pairwise(weights)) else ()


CANARY: tuple[Rule[Canary], ...] = (
    Rule(
        name="canary-steps",
        field=".steps",
        # isSorted() allows equal neighbours: each weight must also be there once.
        cel=(
            "self.steps.map(s, s.weight).isSorted()"
            " && self.steps.all(a, self.steps.exists_one(b, b.weight == a.weight))"
        ),
        message="rollout.canary.steps must ascend: each weight above the one before",
        check=_weights_ascending,
        examples=({"rollout": {"canary": {"steps": [{"weight": 50}, {"weight": 10}]}}},),
    ),
)


def _grace_after_drain(drain: DrainSettings) -> tuple[object, ...] | None:
    grace, needed = drain.termination_grace_period_seconds, drain.pre_stop_seconds + drain.drain_timeout_seconds
    return (grace, needed) if grace is not None and grace <= needed else None


DRAIN: tuple[Rule[DrainSettings], ...] = (
    Rule(
        name="drain",
        field="",
        cel=(
            "!has(self.terminationGracePeriodSeconds) || "
            "self.terminationGracePeriodSeconds > self.preStopSeconds + self.drainTimeoutSeconds"
        ),
        message="drain.terminationGracePeriodSeconds (%d) must exceed preStopSeconds + drainTimeoutSeconds (%d)",
        args=("self.terminationGracePeriodSeconds", "self.preStopSeconds + self.drainTimeoutSeconds"),
        check=_grace_after_drain,
        examples=({"drain": {"preStopSeconds": 10, "drainTimeoutSeconds": 60, "terminationGracePeriodSeconds": 30}},),
    ),
)


def _bounds_in_order(autoscaling: Autoscaling) -> tuple[object, ...] | None:
    low, high = autoscaling.min_replicas, autoscaling.max_replicas
    return (low, high) if low > high else None


AUTOSCALING: tuple[Rule[Autoscaling], ...] = (
    Rule(
        name="autoscaling-bounds",
        field="",
        cel="self.minReplicas <= self.maxReplicas",
        message="autoscaling.minReplicas (%d) must not exceed autoscaling.maxReplicas (%d)",
        args=("self.minReplicas", "self.maxReplicas"),
        check=_bounds_in_order,
        examples=({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},),
    ),
)


def _adapters_fit_slots(lora: Lora) -> tuple[object, ...] | None:
    given, slots = len(lora.adapters), lora.max_loras
    return (given, slots) if given > slots else None


def _adapter_names_unique(lora: Lora) -> tuple[object, ...] | None:
    names = [adapter.name for adapter in lora.adapters]
    return () if len(set(names)) != len(names) else None


LORA: tuple[Rule[Lora], ...] = (
    Rule(
        name="lora-adapters-beyond-slots",
        field=".adapters",
        cel="!has(self.adapters) || size(self.adapters) <= self.maxLoras",
        message=(
            "lora.adapters lists %d adapters, but lora.maxLoras is %d: every adapter is loaded into a slot of the "
            "compiled graphs (more slots compile a new artifact)"
        ),
        args=("size(self.adapters)", "self.maxLoras"),
        check=_adapters_fit_slots,
        examples=(
            {
                "lora": {
                    "maxLoras": 1,
                    "adapters": [{"name": "fr", "source": "/adapters/fr"}, {"name": "de", "source": "/adapters/de"}],
                }
            },
        ),
    ),
    Rule(
        name="lora-adapter-names",
        field=".adapters",
        cel="!has(self.adapters) || self.adapters.all(a, self.adapters.exists_one(b, b.name == a.name))",
        message="lora.adapters: each adapter needs a name of its own (clients send it as the model)",
        check=_adapter_names_unique,
        examples=(
            {
                "lora": {
                    "maxLoras": 2,
                    "adapters": [{"name": "fr", "source": "/adapters/fr"}, {"name": "fr", "source": "/adapters/f2"}],
                }
            },
        ),
    ),
)


def _cores_per_device(spec: NeuronInferenceServiceSpec) -> int:
    return spec.instance.chip.logical_cores(spec.placement.logical_neuron_cores)


def _devices_hold_tp(spec: NeuronInferenceServiceSpec) -> tuple[object, ...] | None:
    given, tp, instance = spec.resources.neuron_devices, spec.engine.tensor_parallel_size, spec.instance
    if given is None or given * _cores_per_device(spec) >= tp:
        return None
    return (given, given * _cores_per_device(spec), instance.name, tp)


def _devices_fit_node(spec: NeuronInferenceServiceSpec) -> tuple[object, ...] | None:
    given, instance = spec.resources.neuron_devices, spec.instance
    return (given, instance.devices, instance.name) if given is not None and given > instance.devices else None


def _no_devices_on_sim(spec: NeuronInferenceServiceSpec) -> tuple[object, ...] | None:
    return () if spec.resources.neuron_devices is not None and spec.device == "sim" else None


def _tp_fits_node(spec: NeuronInferenceServiceSpec) -> tuple[object, ...] | None:
    tp, cores = spec.engine.tensor_parallel_size, spec.instance.devices * _cores_per_device(spec)
    return (tp, cores, spec.instance.name) if tp > cores else None


def _lnc_of_the_chip(spec: NeuronInferenceServiceSpec) -> tuple[object, ...] | None:
    lnc, most = spec.placement.logical_neuron_cores, max(spec.instance.chip.lnc_settings)
    return (lnc, spec.instance.name, most) if lnc is not None and lnc > most else None


_GIVEN = "!has(self.resources.neuronDevices) || "
_LNC_SET = "has(self.placement) && has(self.placement.logicalNeuronCores)"
_CORES_ON = (
    f"({_LNC_SET} ? {_PHYSICAL_CORES}[self.instanceType] / self.placement.logicalNeuronCores"
    f" : {_CORES_PER_DEVICE}[self.instanceType])"
)
_DEVICES_ON = f"{_DEVICES}[self.instanceType]"

#: On the service's spec: the Neuron fit, and replicas beside autoscaling.
SERVICE_SPEC: tuple[Rule[NeuronInferenceServiceSpec], ...] = (
    Rule(
        name="devices-below-tp",
        field=".resources.neuronDevices",
        cel=f"{_GIVEN}self.resources.neuronDevices * {_CORES_ON} >= self.engine.tensor_parallel_size",
        message=(
            "resources.neuronDevices (%d) holds %d logical NeuronCores on %s, fewer than "
            "engine.tensor_parallel_size (%d)"
        ),
        args=(
            "self.resources.neuronDevices",
            f"self.resources.neuronDevices * {_CORES_ON}",
            "self.instanceType",
            "self.engine.tensor_parallel_size",
        ),
        check=_devices_hold_tp,
        examples=({"engine": {"tensor_parallel_size": 8}, "resources": {"neuronDevices": 1}},),
    ),
    Rule(
        name="devices-beyond-node",
        field=".resources.neuronDevices",
        cel=f"{_GIVEN}self.resources.neuronDevices <= {_DEVICES_ON}",
        message="resources.neuronDevices (%d) exceeds the %d Neuron devices of one %s",
        args=("self.resources.neuronDevices", _DEVICES_ON, "self.instanceType"),
        check=_devices_fit_node,
        examples=({"instanceType": "inf2.xlarge", "resources": {"neuronDevices": 2}},),
    ),
    Rule(
        name="devices-on-sim",
        field=".resources.neuronDevices",
        cel="self.device != 'sim' || !has(self.resources.neuronDevices)",
        message=(
            "resources.neuronDevices is for device neuron: a sim replica requests resources.cpu and resources.memory"
        ),
        check=_no_devices_on_sim,
        examples=({"device": "sim", "resources": {"neuronDevices": 1}},),
    ),
    Rule(
        name="tp-beyond-node",
        field=".engine.tensor_parallel_size",
        cel=f"self.engine.tensor_parallel_size <= {_DEVICES_ON} * {_CORES_ON}",
        message="engine.tensor_parallel_size (%d) exceeds the %d logical NeuronCores of one %s",
        args=("self.engine.tensor_parallel_size", f"{_DEVICES_ON} * {_CORES_ON}", "self.instanceType"),
        check=_tp_fits_node,
        examples=(
            {"engine": {"tensor_parallel_size": 128}},
            {"instanceType": "trn2.3xlarge", "engine": {"tensor_parallel_size": 8}},
        ),
    ),
    Rule(
        name="lnc-of-the-chip",
        field=".placement.logicalNeuronCores",
        cel=f"!({_LNC_SET}) || self.placement.logicalNeuronCores <= {_MOST_LNC}[self.instanceType]",
        message="placement.logicalNeuronCores (%d) is not a setting of %s, whose devices take at most %d",
        args=("self.placement.logicalNeuronCores", "self.instanceType", f"{_MOST_LNC}[self.instanceType]"),
        check=_lnc_of_the_chip,
        examples=({"instanceType": "inf2.48xlarge", "placement": {"logicalNeuronCores": 2}},),
    ),
    Rule(
        name="device-plugin-on-sim",
        field=".placement.devices",
        cel=(
            "self.device != 'sim' || !has(self.placement) || !has(self.placement.devices)"
            " || self.placement.devices == 'dra'"
        ),
        message=(
            "placement.devices devicePlugin is for device neuron: a sim replica requests resources.cpu and "
            "resources.memory, and with dra also claims simulated devices"
        ),
        check=lambda spec: () if spec.device == "sim" and spec.placement.devices == "devicePlugin" else None,
        examples=({"device": "sim", "placement": {"devices": "devicePlugin"}},),
    ),
    # Only the scaler writes spec.replicas of an autoscaled service (through the scale subresource): a
    # manifest naming both is refused, while the scaler's writes to one already autoscaled pass.
    Rule(
        name="replicas-with-autoscaling",
        field=".replicas",
        cel="!has(self.autoscaling) || !has(self.replicas) || (oldSelf.hasValue() && has(oldSelf.value().autoscaling))",
        message=(
            "replicas and autoscaling are exclusive: with autoscaling, KEDA sets spec.replicas through the "
            "scale subresource; remove spec.replicas"
        ),
        checked_by="admission",
        examples=({"replicas": 2, "autoscaling": {"maxReplicas": 4}},),
        optional_old_self=True,
    ),
)

#: On the service object itself: ``metadata.name`` becomes a Service, Deployment and label value.
SERVICE_OBJECT: tuple[Rule[Any], ...] = (
    Rule(
        name="name",
        field="",
        cel="self.metadata.name.matches('^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$')",
        message=(
            "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
            "at most 63 characters): it names the Service"
        ),
        checked_by="admission",
    ),
)

#: On the artifact's spec: its name is its content hash.
ARTIFACT_SPEC: tuple[Rule[NeuronCompiledArtifactSpec], ...] = (
    Rule(
        name="artifact-immutable",
        field="",
        cel="self == oldSelf",
        message="a compiled artifact is immutable: its name is its content hash",
        checked_by="admission",
    ),
)

#: Every rule a service's spec is held to (the parity test sends each one's examples).
SERVICE_SPEC_RULES: tuple[Rule[Any], ...] = (
    *ENGINE,
    *ROLLOUT,
    *CANARY,
    *DRAIN,
    *AUTOSCALING,
    *LORA,
    *SERVICE_SPEC,
)
ALL: tuple[Rule[Any], ...] = (*SERVICE_SPEC_RULES, *SERVICE_OBJECT, *ARTIFACT_SPEC)
