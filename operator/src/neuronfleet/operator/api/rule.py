"""What an admission rule is: its field, its CEL, its message and its Python check, and how the CEL gets into
a model's JSON Schema. Every rule itself is in :mod:`neuronfleet.operator.api.rules`.

A message is a ``printf`` template: CEL fills it with ``'...'.format([...])``
from the rule's ``args`` (concatenating ``string(int)`` exceeds the API server's
cost estimate), Python with ``%`` from what the check returns.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

Schema = dict[str, Any]


M = TypeVar("M")


#: Who checks a rule besides the API server: the operator's models, the engine's ``EngineConfig``
#: (the bucket rules), or nobody (a transition rule or metadata, which only the API server sees).
CheckedBy = Literal["operator", "engine", "admission"]


@dataclass(frozen=True)
class Rule(Generic[M]):
    """One admission rule on a model ``M``."""

    #: A short name: the parity test's case id and part of its objects' names.
    name: str
    #: The field the rule is about, from the model: ``.resources.neuronDevices``; "" for the model itself.
    field: str
    #: The CEL that holds for a valid object (``self`` is the model, or the field with ``on_field``).
    cel: str
    #: The message, a template with ``%d`` and ``%s`` placeholders.
    message: str
    #: CEL expressions for the placeholders, in order.
    args: tuple[str, ...] = ()
    #: The Python check: None when the rule holds, else the placeholders' values. Only for ``operator``.
    check: Callable[[M], tuple[object, ...] | None] | None = None
    checked_by: CheckedBy = "operator"
    #: Service specs (without ``model``) that break this rule alone, for the parity test.
    examples: tuple[Mapping[str, Any], ...] = ()
    #: The CEL sits on the field's own schema (``self`` is the field) instead of the model's.
    on_field: bool = False
    #: A transition rule that also runs on create (``oldSelf`` is an optional).
    optional_old_self: bool = False
    #: The API server's reason for a refusal (its default is FieldValueInvalid).
    reason: str | None = None

    def __post_init__(self) -> None:
        if (self.check is not None) != (self.checked_by == "operator"):
            raise ValueError(f"rule {self.name}: a Python check is for rules the operator checks, and only those")
        if self.args and "'" in self.message:
            raise ValueError(f"rule {self.name}: a quote would end the CEL string of the message")

    @property
    def loc(self) -> tuple[str, ...]:
        """The field as a pydantic error location (wire names)."""
        return tuple(self.field.removeprefix(".").split(".")) if self.field else ()

    def cel_rule(self) -> Schema:
        """The rule as an ``x-kubernetes-validations`` entry."""
        rule: Schema = {"rule": self.cel}
        if self.optional_old_self:
            rule["optionalOldSelf"] = True
        if self.args:
            rule["messageExpression"] = f"'{self.message}'.format([{', '.join(self.args)}])"
        else:
            rule["message"] = self.message
        if self.field and not self.on_field:
            rule["fieldPath"] = self.field
        if self.reason:
            rule["reason"] = self.reason
        return rule

    def violation(self, model: M) -> str | None:
        """The message when ``model`` breaks the rule, else None (always None unless the operator checks it)."""
        values = None if self.check is None else self.check(model)
        if values is None:
            return None
        return self.message % values if values else self.message

    def pattern(self) -> re.Pattern[str]:
        """A regular expression for the message with any values filled in."""
        placeholders = {"%d": r"-?\d+", "%s": r"[^\s,;]+"}
        parts = re.split(r"(%[ds])", self.message)
        return re.compile("".join(placeholders.get(part) or re.escape(part) for part in parts))


def cel_schema(rules: Sequence[Rule[Any]]) -> Schema:
    """The rules' CEL as a schema fragment: on the model, or on a field's own schema."""
    schema: Schema = {}
    for rule in rules:
        if rule.on_field:
            field = schema.setdefault("properties", {}).setdefault(rule.field.removeprefix("."), {})
            field.setdefault("x-kubernetes-validations", []).append(rule.cel_rule())
        else:
            schema.setdefault("x-kubernetes-validations", []).append(rule.cel_rule())
    return schema


def add_cel(schema: dict[str, Any], model: type[Any]) -> None:
    """pydantic's ``json_schema_extra`` hook: a model's ``admission_rules`` as CEL in its JSON Schema."""
    extra = cel_schema(model.admission_rules)
    for name, field in extra.get("properties", {}).items():
        schema["properties"][name].setdefault("x-kubernetes-validations", []).extend(field["x-kubernetes-validations"])
    if "x-kubernetes-validations" in extra:
        schema.setdefault("x-kubernetes-validations", []).extend(extra["x-kubernetes-validations"])
