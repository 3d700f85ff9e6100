"""Pure rollout decisions: what was observed in, what to apply and what to release out.

The rules:

- Serving objects are rendered for the target artifact only once it is Ready.
  Until then an existing Deployment keeps its pod template (its revision keeps
  serving) and only its replica count follows the spec.
- Artifacts a service no longer needs are released only when its Deployment is
  fully rolled out, so pods of the old revision never lose their artifact; the
  revisions it served last stay (its artifact history), so a rollback to one
  rolls out at once.

A service's reconcile asks two questions, each once: :func:`serve`, on the
Deployment it read, says what to apply; :func:`decide`, on the Deployment as it
stands once that is applied (it may have finished rolling out since the read),
says what to release and which revision is current, for the status
(:mod:`neuronfleet.operator.policy.service_status`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from neuronfleet.contract.names import LABEL_ARTIFACT
from neuronfleet.operator import api, plan

Obj = dict[str, Any]


@dataclass(frozen=True)
class ArtifactView:
    """What a service needs to know of an artifact."""

    name: str
    hash: str
    phase: api.ArtifactPhase
    reason: str | None = None
    message: str | None = None

    @classmethod
    def of(cls, body: Obj, artifact_hash: str) -> ArtifactView:
        """From a NeuronCompiledArtifact read from the API server."""
        status = api.NeuronCompiledArtifactStatus.model_validate(body.get("status") or {})
        return cls(body["metadata"]["name"], artifact_hash, status.phase, status.reason, status.message)


@dataclass(frozen=True)
class DeploymentView:
    """What a service needs to know of its Deployment."""

    artifact_hash: str | None
    #: What its pods read by name: the engine ConfigMap, and the Neuron claim template with DRA.
    pod_inputs: frozenset[str]
    replicas: int
    generation: int
    observed_generation: int
    total: int
    updated: int
    ready: int
    available: int

    @classmethod
    def of(cls, body: Obj, config_volume: str) -> DeploymentView:
        """From a Deployment read from the API server, whose pods mount their engine ConfigMap as ``config_volume``."""
        status = body.get("status") or {}
        template = body["spec"]["template"]
        labels = template["metadata"].get("labels") or {}
        volumes = template["spec"].get("volumes") or []
        configmaps = [v["configMap"]["name"] for v in volumes if v.get("name") == config_volume and "configMap" in v]
        claims = template["spec"].get("resourceClaims") or []
        templates = [c["resourceClaimTemplateName"] for c in claims if c.get("resourceClaimTemplateName")]
        return cls(
            artifact_hash=labels.get(LABEL_ARTIFACT),
            pod_inputs=frozenset([*configmaps[:1], *templates]),
            replicas=int(body["spec"].get("replicas", 1)),
            generation=int(body["metadata"].get("generation", 0)),
            observed_generation=int(status.get("observedGeneration", 0)),
            total=int(status.get("replicas") or 0),
            updated=int(status.get("updatedReplicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
            available=int(status.get("availableReplicas") or 0),
        )

    @property
    def rolled_out(self) -> bool:
        """Every replica runs the template, is available, and no old replica is left (``kubectl rollout status``)."""
        return (
            self.observed_generation >= self.generation
            and self.updated >= self.replicas
            and self.total <= self.updated
            and self.available >= self.updated
        )


def rollout_state(deployment: Obj) -> str:
    """All a service's reconcile reads of one of its Deployments (:class:`DeploymentView`, :func:`router_routes_by`):
    the spec through its generation (a new pod template or replica count bumps it) and the status's counts. Not the
    status's conditions: their times move at every step of a rollout, and nothing reads them."""
    status = {key: value for key, value in (deployment.get("status") or {}).items() if key != "conditions"}
    return json.dumps([deployment["metadata"].get("generation"), status], sort_keys=True)


class Serve(Enum):
    """What to do with the serving objects."""

    #: Apply ConfigMap, Deployment, Service and PDB for the target artifact.
    TARGET = "target"
    #: Keep the Deployment's pod template (the serving revision); only follow the replica count.
    KEEP = "keep"
    #: Nothing to serve yet.
    NOTHING = "nothing"


@dataclass(frozen=True)
class Decision:
    """What to do for a valid service."""

    serve: Serve
    #: Artifact hashes still needed; ``None`` while a rollout is in flight (release nothing).
    keep: frozenset[str] | None
    #: Engine ConfigMaps and claim templates the pods still read, when ``keep`` is not ``None``.
    keep_pod_inputs: frozenset[str]
    #: The artifact hash every replica ran at the last completed rollout.
    current_revision: str | None
    #: The artifact hashes served before it, newest first, kept for a rollback.
    previous_revisions: tuple[str, ...] = ()


def serve(target: ArtifactView, deployment: DeploymentView | None) -> Serve:
    """Serve the target when it is Ready, else keep what serves."""
    if target.phase == "Ready":
        return Serve.TARGET
    if deployment is not None:
        return Serve.KEEP
    return Serve.NOTHING


def revision_history(previous: Sequence[str], served: str | None, current: str | None, limit: int) -> tuple[str, ...]:
    """The revisions served before ``current``, newest first, at most ``limit``: ``served`` (the current
    revision until now) joins once a rollout replaced it; a revision served again leaves the history."""
    history = [served] if served is not None and served != current else []
    history += [revision for revision in previous if revision not in (served, current)]
    return tuple(history[:limit])


def decide(
    target: ArtifactView,
    deployment: DeploymentView | None,
    current_revision: str | None,
    previous_revisions: Sequence[str] = (),
    *,
    history_limit: int = 0,
) -> Decision:
    """What to serve (:func:`serve`), and what to keep: release only after a finished rollout, and never the
    ``history_limit`` revisions served last (a rollback to one of them needs no compile)."""
    serving = serve(target, deployment)
    kept = tuple(previous_revisions[:history_limit])
    if deployment is None:
        return Decision(serving, frozenset({target.hash, *kept}), frozenset(), None, kept)
    in_use = deployment.pod_inputs
    if deployment.rolled_out and deployment.artifact_hash is not None:
        history = revision_history(previous_revisions, current_revision, deployment.artifact_hash, history_limit)
        keep = frozenset({target.hash, deployment.artifact_hash, *history})
        return Decision(serving, keep, in_use, deployment.artifact_hash, history)
    return Decision(serving, None, in_use, current_revision, kept)


def router_routes_by(router: Obj | None, split: plan.RevisionSplit | None) -> bool:
    """Whether every router pod routes by ``split`` (``None``: no canary): the router Deployment's pods were
    made for it, every one rolled out and Ready, and none made for another split is still draining."""
    if router is None:
        return split is None
    annotations = router["spec"]["template"]["metadata"].get("annotations") or {}
    if annotations.get(plan.SPLIT_ANNOTATION) != (split.describe() if split is not None else None):
        return False
    status = router.get("status") or {}
    replicas = int(router["spec"].get("replicas", 1))
    return (
        int(status.get("observedGeneration", 0)) >= int(router["metadata"].get("generation", 0))
        and int(status.get("updatedReplicas") or 0) == replicas
        and int(status.get("readyReplicas") or 0) >= replicas
        and int(status.get("replicas") or 0) == replicas
        and not status.get("terminatingReplicas")
    )
