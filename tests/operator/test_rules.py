"""The admission rules, each declared once: the models check them, the CRDs carry them, every one has examples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from neuronfleet.operator import crdgen
from neuronfleet.operator.api import DrainSettings, describe_errors, is_bucket_error, parse_service_spec, rules
from neuronfleet.operator.api.rule import Rule

MODEL = {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"}
EXAMPLES = [(rule, example) for rule in rules.SERVICE_SPEC_RULES for example in rule.examples]


def cel_rules(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    # An int-or-string's bounds are its type, as a schema's minimum is, not an admission rule.
    if not schema.get("x-kubernetes-int-or-string"):
        yield from schema.get("x-kubernetes-validations", [])
    for child in (schema.get("properties") or {}).values():
        yield from cel_rules(child)
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from cel_rules(schema[key])


def test_every_rule_of_a_service_spec_has_an_example_for_the_parity_test() -> None:
    assert [rule.name for rule in rules.SERVICE_SPEC_RULES if not rule.examples] == []
    names = [rule.name for rule in rules.ALL]
    assert len(names) == len(set(names))


def test_the_crds_carry_every_rule_and_no_other() -> None:
    carried = [
        rule
        for crd in (crdgen.crd(kind) for kind in crdgen.KINDS)
        for rule in cel_rules(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    ]
    declared = [rule.cel_rule() for rule in rules.ALL]
    assert all(rule in carried for rule in declared)
    assert all(rule in declared for rule in carried)


@pytest.mark.parametrize(
    ("rule", "example"),
    EXAMPLES,
    ids=[f"{rule.name}-{rule.examples.index(example)}" for rule, example in EXAMPLES],
)
def test_each_example_breaks_its_rule_alone_in_the_models(rule: Rule[Any], example: dict[str, Any]) -> None:
    if rule.checked_by == "admission":
        # Only the API server sees the old object: the operator takes what it let through.
        parse_service_spec({"model": MODEL, **example})
        return
    with pytest.raises(ValidationError) as caught:
        parse_service_spec({"model": MODEL, **example})
    (error,) = describe_errors(caught.value).split("; ")
    field, message = error.split(": ", 1)
    assert field.endswith(f".{rule.loc[-1]}" if rule.loc else "")
    assert rule.pattern().match(message), message
    assert is_bucket_error(caught.value) == (rule.checked_by == "engine")


def test_a_rule_with_values_fills_the_same_template_in_cel_and_python() -> None:
    (drain,) = rules.DRAIN
    assert drain.cel_rule()["messageExpression"] == (
        "'drain.terminationGracePeriodSeconds (%d) must exceed preStopSeconds + drainTimeoutSeconds (%d)'"
        ".format([self.terminationGracePeriodSeconds, self.preStopSeconds + self.drainTimeoutSeconds])"
    )
    # Built without validation, as an object that slipped past admission would be.
    too_short = DrainSettings.model_construct(
        pre_stop_seconds=10, drain_timeout_seconds=60, termination_grace_period_seconds=30
    )
    assert drain.violation(too_short) == (
        "drain.terminationGracePeriodSeconds (30) must exceed preStopSeconds + drainTimeoutSeconds (70)"
    )
    assert (
        drain.violation(
            DrainSettings(pre_stop_seconds=10, drain_timeout_seconds=60, termination_grace_period_seconds=71)
        )
        is None
    )


def test_a_python_check_is_only_for_rules_the_operator_checks() -> None:
    with pytest.raises(ValueError, match="a Python check is for rules the operator checks"):
        Rule(name="x", field="", cel="true", message="m", checked_by="admission", check=lambda _: None)


@pytest.mark.parametrize(
    ("engine", "named"),
    [
        ({"max_model_len": 4096, "num_batched_tokens_buckets": [1024, 8192]}, "max_model_len (4096)"),
        ({"max_num_batched_tokens": 2048, "num_batched_tokens_buckets": [1024, 4096]}, "max_num_batched_tokens (2048)"),
    ],
)
def test_the_last_prefill_bucket_message_names_the_field_that_set_the_limit(engine: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_service_spec({"model": MODEL, "engine": engine})
    assert f"must equal {named}, got" in describe_errors(caught.value)
    (rule,) = [r for r in rules.ENGINE if r.name == "last-prefill"]
    assert "'max_model_len'" in rule.cel_rule()["messageExpression"]
