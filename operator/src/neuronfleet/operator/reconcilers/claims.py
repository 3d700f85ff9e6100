"""A service's claims: on the artifacts it needs (their owner references) and on its engine ConfigMaps.

Services share an artifact by each owning it, and keep owning the ones in their artifact
history (:func:`neuronfleet.operator.policy.rollout.revision_history`); an artifact no service owns any
more is deleted (its files stay in the store, so compiling the same identity again finds them).
Each step observes the objects, decides from what it read, then acts, and a write that
raced another service's (409) is read again.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from neuronfleet.contract.names import LABEL_ARTIFACT, LABEL_SERVICE
from neuronfleet.operator.cluster.kube import (
    ARTIFACTS,
    CONFIGMAPS,
    CONFLICT,
    NOT_FOUND,
    RESOURCE_CLAIM_TEMPLATES,
    ApiError,
    Kube,
)
from neuronfleet.operator.policy.conditions import Event, Reason
from neuronfleet.operator.reconcilers.common import Emit, Obj, RetryLater

log = logging.getLogger(__name__)

#: Optimistic-concurrency retries for ownerReference updates racing another service.
CONFLICT_RETRIES = 5


class ArtifactClaims:
    """Claims artifacts for services and releases what they no longer need."""

    def __init__(self, kube: Kube, emit: Emit) -> None:
        self.kube = kube
        self.emit = emit

    def claim(self, service: Obj, desired: Obj) -> Obj:
        """The artifact, created or with this service added to its owners (services share it)."""
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        uid = service["metadata"]["uid"]
        for attempt in range(CONFLICT_RETRIES):
            # A conflict means the view was stale: read the server from then on.
            existing = (self.kube.fresh if attempt else self.kube.get)(ARTIFACTS, namespace, name)
            if existing is None:
                try:
                    created = self.kube.create(desired)
                except ApiError as error:
                    if error.status == CONFLICT:
                        continue
                    raise
                self.emit(service, Event("Normal", Reason.ARTIFACT_CREATED, f"created {name} to compile"))
                return created
            if existing["metadata"].get("deletionTimestamp"):
                raise RetryLater(f"{name} is being deleted")
            refs = existing["metadata"].get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                return existing
            patch = {
                "metadata": {
                    "resourceVersion": existing["metadata"]["resourceVersion"],
                    "ownerReferences": [*refs, *desired["metadata"]["ownerReferences"]],
                }
            }
            try:
                shared = self.kube.merge_patch(ARTIFACTS, namespace, name, patch)
            except ApiError as error:
                if error.status == CONFLICT:
                    continue
                raise
            self.emit(service, Event("Normal", Reason.ARTIFACT_SHARED, f"using existing artifact {name}"))
            return shared
        raise RetryLater(f"{name} kept changing under concurrent updates")

    def release(
        self,
        service: Obj,
        keep: frozenset[str],
        keep_pod_inputs: Collection[str],
        *,
        deleted: bool = False,
        claim_templates: bool = False,
    ) -> None:
        """Drop this service's claim on artifacts (and engine ConfigMaps) it no longer needs.

        ``keep``: the artifact hashes it still needs; ``keep_pod_inputs``: the ConfigMaps (and, with
        ``claim_templates``, the Neuron ResourceClaimTemplates) its pods still read. A ``deleted`` service posts no
        events and leaves those to the garbage collector.
        """
        meta = service["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        for artifact in self.kube.list(ARTIFACTS, namespace):
            remaining = _owners_left(artifact, uid, keep)
            if remaining is None:
                continue
            art_meta = artifact["metadata"]
            try:
                if remaining:
                    patch = {"metadata": {"resourceVersion": art_meta["resourceVersion"], "ownerReferences": remaining}}
                    self.kube.merge_patch(ARTIFACTS, namespace, art_meta["name"], patch)
                    event = Event("Normal", Reason.ARTIFACT_RELEASED, f"no longer uses {art_meta['name']}")
                else:
                    self._delete_unowned(artifact)
                    event = Event("Normal", Reason.ARTIFACT_DELETED, f"deleted {art_meta['name']}: no service uses it")
                if not deleted:
                    self.emit(service, event)
            except ApiError as error:
                if error.status == NOT_FOUND:
                    continue  # the garbage collector deleted it first: nothing left to release
                if error.status != CONFLICT:
                    raise
                log.info(
                    "artifact %s/%s changed while releasing it; the next pass retries", namespace, art_meta["name"]
                )
        if deleted:
            return
        # Its engine ConfigMaps only (they name an artifact): the router's stays.
        for configmap in self.kube.list(CONFIGMAPS, namespace, f"{LABEL_SERVICE}={name},{LABEL_ARTIFACT}"):
            if configmap["metadata"]["name"] not in keep_pod_inputs:
                self.kube.delete(CONFIGMAPS, namespace, configmap["metadata"]["name"])
        if claim_templates:
            for template in self.kube.list(RESOURCE_CLAIM_TEMPLATES, namespace, f"{LABEL_SERVICE}={name}"):
                if template["metadata"]["name"] not in keep_pod_inputs:
                    self.kube.delete(RESOURCE_CLAIM_TEMPLATES, namespace, template["metadata"]["name"])

    def _delete_unowned(self, artifact: Obj) -> None:
        # The precondition fails (409) if another service claimed it meanwhile.
        meta = artifact["metadata"]
        self.kube.request(
            "DELETE",
            ARTIFACTS.path(meta["namespace"], meta["name"]),
            body={
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "propagationPolicy": "Background",
                "preconditions": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
            },
        )


def _owners_left(artifact: Obj, uid: str, keep: frozenset[str]) -> list[Obj] | None:
    """The owner references an artifact keeps once service ``uid`` lets go; ``None``: it keeps its claim."""
    meta = artifact["metadata"]
    refs = meta.get("ownerReferences") or []
    if (meta.get("labels") or {}).get(LABEL_ARTIFACT) in keep or all(r.get("uid") != uid for r in refs):
        return None
    return [r for r in refs if r.get("uid") != uid]
