"""CustomResourceDefinitions generated from the pydantic models in ``api``.

Pydantic writes JSON Schema; Kubernetes wants a *structural* OpenAPI v3 schema.
The rewrite inlines ``$ref``s, turns ``X | None`` into ``X`` (the API server
prunes nulls), ``const`` into ``enum``, drops ``title`` and
``additionalProperties: false`` (unknown fields are pruned, and rejected by
``kubectl``'s strict field validation), and gives optional objects their
defaults written out, so CEL rules can rely on every defaulted field.

The CEL rules come from ``api.rules``, where each is declared once: the
operator's models put theirs in their JSON Schema, and the engine's model gets
its bucket rules from an overlay here, so the API server rejects invalid
buckets before any operator code runs, with the engine's messages.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from neuronfleet.contract.buckets import NUM_BATCHED_TOKENS_BUCKETS, NUM_SEQS_BUCKETS
from neuronfleet.contract.names import GROUP
from neuronfleet.operator import api
from neuronfleet.operator.api import rules
from neuronfleet.operator.api.rule import Rule

Schema = dict[str, Any]

#: Extra schema merged into a model's definition, by model name: the engine's model carries no
#: Kubernetes markers of its own, so its bucket rules are added here, from ``api.rules``.
OVERLAYS: dict[str, Schema] = {"EngineConfig": rules.ENGINE_SCHEMA}


@dataclass(frozen=True)
class Kind:
    """One custom resource kind and how kubectl shows it."""

    names: api.KindNames
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    columns: list[Schema]
    root_rules: tuple[Rule[Any], ...] = ()
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
            _column(
                "Health",
                '.status.conditions[?(@.type=="Degraded")].reason',
                description="Healthy, or the Neuron fault holding a replica out of service.",
            ),
            _column("Artifact", ".status.artifact.name", description="The artifact the spec asks for."),
            _column("Revision", ".status.currentRevision", description="The artifact fully rolled out.", priority=1),
            _AGE,
        ],
        root_rules=rules.SERVICE_OBJECT,
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


def _int_or_string(branches: list[Schema]) -> Schema:
    """A bounded integer or one of some words (``auto``): Kubernetes' int-or-string, its bounds as CEL."""
    number = next(b for b in branches if b["type"] == "integer")
    word = next(b for b in branches if b["type"] == "string")
    words = [word["const"]] if "const" in word else list(word["enum"])
    low, high = number.get("minimum"), number.get("maximum")
    bounds = " && ".join(
        [*([f"self >= {low}"] if low is not None else []), *([f"self <= {high}"] if high is not None else [])]
    )
    quoted = ", ".join(f"'{w}'" for w in words)
    return {
        "x-kubernetes-int-or-string": True,
        "x-kubernetes-validations": [
            {
                "rule": f"type(self) == string ? self in [{quoted}] : {bounds or 'true'}",
                "message": f"must be {' or '.join(words)}, or an integer from {low} to {high}",
            }
        ],
    }


def structural(node: Schema, defs: Mapping[str, Schema]) -> Schema:
    """Rewrite one pydantic JSON Schema node (and everything under it) into a structural schema."""
    node = dict(node)
    if "$ref" in node:
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        node = _merge(_definition(defs, node["$ref"]), siblings)
    if "anyOf" in node:
        branches = [b for b in node.pop("anyOf") if b.get("type") != "null"]
        if sorted(b.get("type", "") for b in branches) == ["integer", "string"]:
            node = _merge(_int_or_string(branches), node)
        elif len(branches) != 1:
            raise SchemaError(f"a union of several types has no structural schema: {branches}")
        else:
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
            # An absent optional object still gets its inner defaults, so rules can read them; unless its
            # presence is what it says (spec.routing: present, the operator runs a picker).
            if child.get(api.PRESENCE_MATTERS, False):
                # Kept until the schema is whole: an optional parent's properties come through here twice.
                continue
            optional_object = name not in required and child.get("type") == "object" and "default" not in child
            if optional_object and "properties" in child and not child.get("required"):
                # Written out in full: the API server checks a default against the object's own
                # rules without filling in the defaults inside it.
                child["default"] = {k: v["default"] for k, v in child["properties"].items() if "default" in v}
    if isinstance(node.get("items"), dict):
        node["items"] = structural(node["items"], defs)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = structural(node["additionalProperties"], defs)
    if "type" not in node and not node.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"untyped schema node: {sorted(node)}")
    # Type and description first: the YAML reads like `kubectl explain`.
    return {key: node[key] for key in sorted(node, key=lambda k: (_KEY_ORDER.get(k, len(_KEY_ORDER)), k))}


_KEY_ORDER = {
    key: i
    for i, key in enumerate(
        ["type", "x-kubernetes-int-or-string", "description", "default", "enum", "properties", "required"]
    )
}


def model_schema(model: type[BaseModel]) -> Schema:
    """The structural schema of one model, in its wire (alias) names."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: Schema = _without_markers(structural(raw, raw.get("$defs", {})))
    return schema


def _without_markers(node: Any) -> Any:
    """``node`` with every :data:`api.PRESENCE_MATTERS` marker gone (they are for :func:`structural` alone)."""
    if isinstance(node, dict):
        return {key: _without_markers(value) for key, value in node.items() if key != api.PRESENCE_MATTERS}
    if isinstance(node, list):
        return [_without_markers(item) for item in node]
    return node


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
        root["x-kubernetes-validations"] = [rule.cel_rule() for rule in kind.root_rules]
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
