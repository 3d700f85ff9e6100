"""CustomResourceDefinitions generated from the pydantic models in ``api``.

Pydantic writes JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema.
The rewrite inlines ``$ref``s, turns ``X | None`` into ``X`` (the API server
prunes nulls), ``const`` into ``enum``, drops ``title`` and
``additionalProperties: false`` (unknown fields are pruned, and rejected by
``kubectl``'s strict field validation), and gives optional objects their
defaults written out, so CEL rules can rely on every defaulted field.

CEL messages use ``'...%d'.format([...])``: concatenating ``string(int)``
exceeds the API server's cost estimate.

The engine's bucket rules are added here as CEL, on the engine's own model, so
the API server rejects invalid buckets before any operator code runs, with the
engine's messages.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import BaseModel

from neuronfleet.engine.buckets import NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.engine.names import GROUP
from neuronfleet.operator import api

Schema = dict[str, Any]

# CEL for the engine's rules 1-6 (see ``neuronfleet.engine.buckets``): strictly ascending is
# isSorted() plus list-type set (no duplicates); positive is the items' minimum.
_LAST_PREFILL = f"self.{NUM_BATCHED_TOKENS_BUCKETS}[size(self.{NUM_BATCHED_TOKENS_BUCKETS}) - 1]"
_LAST_DECODE = f"self.{NUM_SEQS_BUCKETS}[size(self.{NUM_SEQS_BUCKETS}) - 1]"
_EFFECTIVE_PREFILL = (
    "(self.max_num_batched_tokens < self.max_model_len ? self.max_num_batched_tokens : self.max_model_len)"
)


def _bucket_list(name: str) -> Schema:
    return {
        "x-kubernetes-list-type": "set",
        "items": {"minimum": 1},
        "x-kubernetes-validations": [
            {"rule": "size(self) > 0", "message": f"{name} cannot be empty"},
            {"rule": "self.isSorted()", "message": f"{name} must be in strictly ascending order"},
        ],
    }


ENGINE_OVERLAY: Schema = {
    "properties": {
        NUM_BATCHED_TOKENS_BUCKETS: _bucket_list(NUM_BATCHED_TOKENS_BUCKETS),
        NUM_SEQS_BUCKETS: _bucket_list(NUM_SEQS_BUCKETS),
    },
    "x-kubernetes-validations": [
        {
            "rule": (
                f"!has(self.{NUM_BATCHED_TOKENS_BUCKETS}) || size(self.{NUM_BATCHED_TOKENS_BUCKETS}) == 0 || "
                f"{_LAST_PREFILL} == {_EFFECTIVE_PREFILL}"
            ),
            "messageExpression": (
                f"'Last bucket in {NUM_BATCHED_TOKENS_BUCKETS} must equal max_num_batched_tokens (%d), got %d'"
                f".format([{_EFFECTIVE_PREFILL}, {_LAST_PREFILL}])"
            ),
            "fieldPath": f".{NUM_BATCHED_TOKENS_BUCKETS}",
            "reason": "FieldValueInvalid",
        },
        {
            "rule": (
                f"!has(self.{NUM_SEQS_BUCKETS}) || size(self.{NUM_SEQS_BUCKETS}) == 0 || "
                f"{_LAST_DECODE} == self.max_num_seqs"
            ),
            "messageExpression": (
                f"'Last bucket in {NUM_SEQS_BUCKETS} must equal max_num_seqs (%d), got %d'"
                f".format([self.max_num_seqs, {_LAST_DECODE}])"
            ),
            "fieldPath": f".{NUM_SEQS_BUCKETS}",
            "reason": "FieldValueInvalid",
        },
    ],
}

#: Extra schema merged into a model's definition, by model name.
OVERLAYS: dict[str, Schema] = {"EngineConfig": ENGINE_OVERLAY}

#: ``metadata.name`` becomes a Service, Deployment and label value: a DNS-1035 label.
NAME_RULE = {
    "rule": "self.metadata.name.matches('^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$')",
    "message": (
        "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting with a letter, "
        "at most 63 characters): it names the Service"
    ),
}


@dataclass(frozen=True)
class Kind:
    """One custom resource kind and how kubectl shows it."""

    names: api.KindNames
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    columns: list[Schema]
    root_rules: list[Schema] = field(default_factory=list)
    scale: bool = False

    @property
    def kind(self) -> str:
        """The kind's name."""
        return self.names.kind

    @property
    def name(self) -> str:
        """The CRD's name: plural.group."""
        return f"{self.names.plural}.{GROUP}"


def _column(name: str, path: str, kind: str = "string", description: str = "", priority: int = 0) -> Schema:
    column: Schema = {"name": name, "type": kind, "jsonPath": path}
    if description:
        column["description"] = description
    if priority:
        column["priority"] = priority
    return column


_AGE = _column("Age", ".metadata.creationTimestamp", "date")

KINDS = [
    Kind(
        names=api.SERVICE_KIND,
        spec=api.NeuronInferenceServiceSpec,
        status=api.NeuronInferenceServiceStatus,
        description=(
            "A model served on AWS Neuron. The operator validates its bucket sets, compiles them once "
            "(a NeuronCompiledArtifact per distinct compile identity) and rolls out serving pods only "
            "when the artifact is ready, so a failed compile never takes down what is serving."
        ),
        columns=[
            _column("Model", ".spec.model.uri", description="The model served."),
            _column(
                "Buckets",
                f".spec.engine.{NUM_BATCHED_TOKENS_BUCKETS}",
                description="Prefill token buckets (none: the engine's defaults).",
            ),
            _column(
                "Decode",
                f".spec.engine.{NUM_SEQS_BUCKETS}",
                description="Decode batch buckets (none: the engine's defaults).",
                priority=1,
            ),
            _column("Instance", ".spec.instanceType", priority=1),
            _column("TP", ".spec.engine.tensor_parallel_size", "integer", "Tensor parallelism.", priority=1),
            _column("Phase", ".status.phase"),
            _column("Ready", ".status.readyReplicas", "integer", "Ready replicas."),
            _column(
                "Desired", ".status.desiredReplicas", "integer", "Replicas asked for (spec.replicas or the autoscaler)."
            ),
            _column("Current", ".status.replicas", "integer", "Serving pods, any revision."),
            _column("Artifact", ".status.artifact.name", description="The artifact the spec asks for."),
            _column("Revision", ".status.currentRevision", description="The artifact fully rolled out.", priority=1),
            _AGE,
        ],
        root_rules=[NAME_RULE],
        scale=True,
    ),
    Kind(
        names=api.ARTIFACT_KIND,
        spec=api.NeuronCompiledArtifactSpec,
        status=api.NeuronCompiledArtifactStatus,
        description=(
            "Compiled Neuron graphs for one compile identity (model, revision, bucket sets, limits, tensor "
            "parallelism, dtype, target, engine image), named by its hash and built once by a compile Job. "
            "Services with the same identity share it. Immutable."
        ),
        columns=[
            _column("Model", ".spec.model.uri"),
            _column("Target", ".spec.target"),
            _column("TP", ".spec.engine.tensor_parallel_size", "integer", "Tensor parallelism."),
            _column("Phase", ".status.phase"),
            _column("Attempts", ".status.attempts", "integer", "Compile pods started."),
            _column(
                "Prefill", f".spec.engine.{NUM_BATCHED_TOKENS_BUCKETS}", description="Prefill buckets.", priority=1
            ),
            _column("Decode", f".spec.engine.{NUM_SEQS_BUCKETS}", description="Decode buckets.", priority=1),
            _column("Location", ".status.location", priority=1),
            _AGE,
        ],
    ),
]


class SchemaError(ValueError):
    """A pydantic schema construct with no structural equivalent."""


def _merge(base: Schema, extra: Mapping[str, Any]) -> Schema:
    """Deep-merge ``extra`` into a copy of ``base``; validation rule lists are concatenated."""
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if key == "x-kubernetes-validations":
            merged[key] = [*merged.get(key, []), *value]
        elif isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _definition(defs: Mapping[str, Schema], ref: str) -> Schema:
    name = ref.removeprefix("#/$defs/")
    if name not in defs:
        raise SchemaError(f"unresolved reference {ref}")
    return _merge(defs[name], OVERLAYS.get(name, {}))


def structural(node: Schema, defs: Mapping[str, Schema]) -> Schema:
    """Rewrite one pydantic JSON Schema node (and everything under it) into a structural schema."""
    node = dict(node)
    if "$ref" in node:
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        node = _merge(_definition(defs, node["$ref"]), siblings)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if len(branches) != 1:
            raise SchemaError(f"a union of several types has no structural schema: {branches}")
        node = _merge(structural(branches[0], defs), node)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    # JSON Schema's numeric exclusive bounds are OpenAPI v3's bound plus a flag.
    for bound, flag in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(node.get(flag), int | float) and not isinstance(node[flag], bool):
            node[bound], node[flag] = node[flag], True
    for key in ("title", "$defs"):
        node.pop(key, None)
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if "default" in node and node["default"] is None:
        del node["default"]
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    if "properties" in node:
        node["properties"] = {name: structural(child, defs) for name, child in node["properties"].items()}
        required = set(node.get("required", []))
        for name, child in node["properties"].items():
            # An absent optional object still gets its inner defaults, so rules can read them.
            optional_object = name not in required and child.get("type") == "object" and "default" not in child
            if optional_object and "properties" in child and not child.get("required"):
                # Written out in full: the API server checks a default against the object's own
                # rules without filling in the defaults inside it.
                child["default"] = {k: v["default"] for k, v in child["properties"].items() if "default" in v}
    if isinstance(node.get("items"), dict):
        node["items"] = structural(node["items"], defs)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = structural(node["additionalProperties"], defs)
    if "type" not in node:
        raise SchemaError(f"untyped schema node: {sorted(node)}")
    # Type and description first: the YAML reads like `kubectl explain`.
    return {key: node[key] for key in sorted(node, key=lambda k: (_KEY_ORDER.get(k, len(_KEY_ORDER)), k))}


_KEY_ORDER = {key: i for i, key in enumerate(["type", "description", "default", "enum", "properties", "required"])}


def model_schema(model: type[BaseModel]) -> Schema:
    """The structural schema of one model, in its wire (alias) names."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def crd(kind: Kind) -> Schema:
    """The CustomResourceDefinition of one kind."""
    spec = model_schema(kind.spec)
    status = model_schema(kind.status)
    root: Schema = {
        "type": "object",
        "description": kind.description,
        "properties": {
            "apiVersion": {"type": "string", "description": "The API version: " + api.API_VERSION},
            "kind": {"type": "string", "description": "The kind: " + kind.kind},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "required": ["spec"],
    }
    if kind.root_rules:
        root["x-kubernetes-validations"] = kind.root_rules
    subresources: Schema = {"status": {}}
    if kind.scale:
        subresources["scale"] = {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.name},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.names.plural,
                "singular": kind.names.singular,
                "shortNames": list(kind.names.short_names),
                "categories": ["neuron"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": root},
                    "subresources": subresources,
                    "additionalPrinterColumns": kind.columns,
                }
            ],
        },
    }


HEADER = "# Generated by `neuronfleet-operator crds` from neuronfleet.operator.api: do not edit.\n"


class _Dumper(yaml.SafeDumper):
    """Writes repeated values out instead of as YAML anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(kind: Kind) -> str:
    """One CRD as the YAML file checked into ``crds/``."""
    return HEADER + yaml.dump(crd(kind), Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True)


def files() -> dict[str, str]:
    """File name -> contents, for every CRD."""
    return {f"{kind.name}.yaml": render(kind) for kind in KINDS}
