"""What both kinds are made of: API names, field patterns, the base model and validation errors.

Every model of the API derives from :class:`K8sModel`: camelCase on the wire,
strict, immutable, and checked against its ``admission_rules`` (see
:mod:`neuronfleet.operator.api.rules`), the same rules the CRDs carry as CEL.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from neuronfleet.contract import names
from neuronfleet.operator.api.rule import Rule, add_cel

VERSION = "v1alpha1"
API_VERSION = f"{names.GROUP}/{VERSION}"


@dataclass(frozen=True)
class KindNames:
    """How the API server names one of the operator's kinds (the CRDs and the client take them from here)."""

    kind: str
    plural: str
    short_names: tuple[str, ...]

    @property
    def singular(self) -> str:
        """The kind in lower case."""
        return self.kind.lower()


SERVICE_KIND = KindNames(names.SERVICE_KIND, names.SERVICE_PLURAL, ("nis",))
ARTIFACT_KIND = KindNames(names.ARTIFACT_KIND, names.ARTIFACT_PLURAL, ("nca",))

#: Kubernetes resource quantities ("4", "500m", "16Gi").
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
#: A container image reference: registry/path:tag or @digest, no spaces.
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/:@-]*[a-zA-Z0-9._:@-]*$"
#: Where compiled artifacts are kept: a PersistentVolumeClaim (with an optional sub-path) or an S3 prefix.
STORE_PATTERN = r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[A-Za-z0-9._/-]*)?|s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[A-Za-z0-9._/-]*)?)$"
#: A DNS-1123 subdomain: the name of a ServiceAccount or a Secret.
OBJECT_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
#: An absolute directory on a node (a hostPath volume's path), not the root: no segment is ``.`` or ``..``.
HOST_PATH_PATTERN = r"^(/\.?[A-Za-z0-9_-][A-Za-z0-9._-]*)+/?$"
#: A size in bytes as a Kubernetes quantity, more than zero ("200Gi", "1.5G").
SIZE_PATTERN = r"^[1-9][0-9]*(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
#: An http(s) endpoint for an S3-compatible service.
ENDPOINT_PATTERN = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._/-]*)?$"
#: An AWS region name.
REGION_PATTERN = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$"
#: A Kubernetes condition reason: CamelCase.
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"

#: A label value (keys are bounded by the map's size for CEL cost estimates).
LabelValue = Annotated[str, Field(max_length=63)]
AnnotationValue = Annotated[str, Field(max_length=1024)]


def field_errors(title: str, errors: list[tuple[tuple[str | int, ...], str, object]]) -> ValidationError:
    """A ``ValidationError`` with one ``(location, message, input)`` entry per broken rule."""
    return ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(type=PydanticCustomError("spec", message), loc=loc, input=value)
            for loc, message, value in errors
        ],
    )


def describe_errors(error: ValidationError, prefix: str = "spec") -> str:
    """``spec.field.path: message`` per error, joined by ``; ``: the exact validation messages."""
    parts = []
    for entry in error.errors():
        path = ".".join([prefix, *(str(p) if not isinstance(p, int) else f"[{p}]" for p in entry["loc"])])
        parts.append(f"{path.replace('.[', '[')}: {entry['msg']}")
    return "; ".join(parts)


def is_bucket_error(error: ValidationError) -> bool:
    """Whether a bucket rule is among the errors (reason InvalidBuckets, not InvalidSpec)."""
    return any(entry["type"] == "bucket" for entry in error.errors())


class K8sModel(BaseModel):
    """A Kubernetes-style object part: camelCase on the wire, strict, immutable, held to its admission rules."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        json_schema_extra=add_cel,
    )

    #: The rules the API server checks as CEL on this model's schema, and this model checks in Python.
    admission_rules: ClassVar[tuple[Rule[Any], ...]] = ()

    @model_validator(mode="after")
    def _check_admission_rules(self) -> Self:
        broken = [(rule, message) for rule in self.admission_rules if (message := rule.violation(self)) is not None]
        if broken:
            raise field_errors(type(self).__name__, [(rule.loc, message, self) for rule, message in broken])
        return self


class Toleration(K8sModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(None, max_length=316, description="The taint key; empty with operator Exists matches all.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Exists or Equal.")
    value: str | None = Field(None, max_length=63, description="The taint value for operator Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint effect matched; empty matches all."
    )
    toleration_seconds: int | None = Field(None, ge=0, description="For NoExecute: how long the pod stays bound.")


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(K8sModel):
    """A metav1.Condition."""

    type: str = Field(
        max_length=316, description="Validated, ArtifactReady, Available, Ready, Routing, Degraded or Autoscaling."
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(max_length=1024, pattern=REASON_PATTERN, description="Why, in one CamelCase word.")
    message: str = Field("", max_length=32768, description="Why, for humans.")
    last_transition_time: datetime.datetime = Field(description="When status last changed.")
    observed_generation: int | None = Field(None, ge=0, description="The spec generation this condition is about.")


CONDITIONS_SCHEMA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


#: A field's ``json_schema_extra`` key: the object's presence means something, so the CRD gives it no default.
PRESENCE_MATTERS = "x-neuronfleet-presence-matters"
