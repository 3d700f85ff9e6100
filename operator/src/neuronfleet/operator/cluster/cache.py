"""The operator's view of the cluster: what its watches delivered, read instead of GETs and LISTs.

An informer cache, as controller-runtime's: kopf's watches feed :class:`ObjectCache` (the handlers
register an index per watched kind, so kopf holds every handler back until each kind's first list is
in), and :class:`CachedKube` answers the reconcilers' reads of those kinds from it. Writes still go to
the API server, and only when they would change something; their answers go into the cache too.

Why a stale read cannot do harm:

- The cache never goes back: per object it keeps the highest ``resourceVersion`` it saw (etcd's
  revision, which only grows), from the watch, a write's answer or a fresh read. So a reconcile never
  sees an older object than one before it did, and a status computed from it never flaps back.
- What a stale read could duplicate, it cannot: the compile Job and the artifact have deterministic
  names (a second create is a 409, after which the reconciler reads the server, :meth:`Kube.fresh`),
  and owner-reference changes and unowned deletions carry ``resourceVersion`` preconditions (409).
- A child is applied unless the cache shows it as the operator would apply it (:func:`would_change`):
  a stale view can only cause a write, never skip one the operator has not made. What the operator last
  applied is stamped on the object itself (:data:`APPLIED_ANNOTATION`), so a restarted operator (or a new
  leader) re-applies nothing its predecessor applied.
- Objects deleted during a watch gap (no DELETED event comes for them) leave at the next full
  resync, which lists every watched kind again (:meth:`CachedKube.relist`).

The kinds only routing makes (the InferencePool, the picker's ServiceAccount, Role and RoleBinding) are
cached but not watched (:data:`LISTED`): they come from the full resync's lists and the operator's own
writes. Nobody else changes them, so a watch would cost more than it tells; one deleted by hand comes
back at the next resync. The InferencePool's CRD is optional: whether the cluster serves it is what the
last list found (:meth:`CachedKube.serves`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any

import kubernetes

from neuronfleet.contract.names import LABEL_ARTIFACT, LABEL_INSTANCE, LABEL_SERVICE, MANAGED_BY_LABEL
from neuronfleet.operator.cluster.kube import (
    ARTIFACTS,
    BY_KIND,
    CONFIGMAPS,
    DEPLOYMENTS,
    INFERENCE_POOLS,
    JOB_NAME_LABEL,
    JOBS,
    NOT_FOUND,
    PDBS,
    PODS,
    ROLE_BINDINGS,
    ROLES,
    SERVICE_ACCOUNTS,
    SERVICES,
    SERVICES_NIS,
    ApiError,
    Kube,
    Resource,
)

Obj = dict[str, Any]

#: The digest of what the operator last applied to an object (:func:`stamped`), on the object.
APPLIED_ANNOTATION = "neuronfleet.io/applied"

#: Every kind the operator reads, with the label selector its watch and its lists use (``None``: all).
#: Serving and compile pods both carry the artifact label; every other child the managed-by one.
WATCHED: dict[Resource, str | None] = {
    SERVICES_NIS: None,
    ARTIFACTS: None,
    DEPLOYMENTS: LABEL_SERVICE,
    JOBS: LABEL_ARTIFACT,
    PODS: LABEL_ARTIFACT,
    CONFIGMAPS: MANAGED_BY_LABEL,
    SERVICES: MANAGED_BY_LABEL,
    PDBS: MANAGED_BY_LABEL,
}
#: Kinds read from the full resync's lists and the operator's writes, never watched (see above).
LISTED: dict[Resource, str | None] = {
    INFERENCE_POOLS: MANAGED_BY_LABEL,
    SERVICE_ACCOUNTS: MANAGED_BY_LABEL,
    ROLES: MANAGED_BY_LABEL,
    ROLE_BINDINGS: MANAGED_BY_LABEL,
}
#: Objects per page of a resync's lists.
RELIST_PAGE = 500
#: Kinds a cluster may not serve (an optional CRD): a list that finds none is no error.
OPTIONAL = frozenset({INFERENCE_POOLS})
CACHED = {**WATCHED, **LISTED}
_BY_PLURAL = {resource.plural: resource for resource in CACHED}


def _version(body: Obj) -> int | None:
    value = body["metadata"].get("resourceVersion")
    return int(value) if isinstance(value, str) and value.isdigit() else None


def parse_selector(selector: str | None) -> dict[str, str | None]:
    """An equality label selector (``a=b,c``) as a mapping; ``None`` as the value means "present"."""
    parsed: dict[str, str | None] = {}
    for term in (selector or "").split(","):
        if term:
            key, _, value = term.partition("=")
            parsed[key.strip()] = value.strip() if "=" in term else None
    return parsed


def digest(intent: Obj) -> str:
    """A fingerprint of an object as the operator applies it."""
    return hashlib.sha256(json.dumps(intent, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def contains(live: object, intent: object) -> bool:
    """Whether ``live`` holds every field of ``intent`` with the same value (the server may add others)."""
    if isinstance(intent, dict):
        return isinstance(live, dict) and all(key in live and contains(live[key], v) for key, v in intent.items())
    if isinstance(intent, list):
        return (
            isinstance(live, list)
            and len(live) == len(intent)
            and all(contains(a, b) for a, b in zip(live, intent, strict=True))
        )
    return live == intent


def stamped(intent: Obj) -> Obj:
    """``intent`` as the operator applies it: its :func:`digest` in :data:`APPLIED_ANNOTATION`."""
    metadata = intent["metadata"]
    annotations = {**(metadata.get("annotations") or {}), APPLIED_ANNOTATION: digest(intent)}
    return {**intent, "metadata": {**metadata, "annotations": annotations}}


def would_change(intent: Obj, live: Obj | None) -> bool:
    """Whether server-side applying ``intent`` (:func:`stamped`) over ``live`` could change it.

    It could unless ``live`` already holds every field of ``intent`` (nobody changed what the operator
    set) and its annotation says ``intent`` is what the operator last applied to it: a field the operator
    stops setting is removed by the apply, and the fields alone cannot tell that.
    """
    return live is None or not contains(live, stamped(intent))


#: Labels whose values the cache indexes: the reconcilers list a service's (or a Job's) objects by one of them,
#: which would otherwise scan every pod of the namespace on every reconcile.
INDEXED_LABELS = (LABEL_SERVICE, LABEL_INSTANCE, JOB_NAME_LABEL)

#: Kinds kept as compact JSON text and decoded on each read: a service's children, several per service and each
#: read only by its own service's reconcile. A decoded object takes about seven times its JSON's size, so at
#: thousands of services they would be most of the operator's memory. The operator's own kinds stay decoded: a
#: fleet's few artifacts are read by every reconcile, and the services by every canary pass.
ENCODED = frozenset({DEPLOYMENTS, PODS, CONFIGMAPS, SERVICES, PDBS})


@dataclass(frozen=True, slots=True)
class _Entry:
    """One cached object: what the cache itself reads of it, and the object, decoded or as compact JSON."""

    version: int | None
    uid: str | None
    labels: Mapping[str, str]
    stored: Obj | str

    @classmethod
    def of(cls, body: Obj, *, encoded: bool) -> _Entry:
        meta = body["metadata"]
        stored = json.dumps(body, separators=(",", ":")) if encoded else body
        return cls(_version(body), meta.get("uid"), meta.get("labels") or {}, stored)

    def read(self) -> Obj:
        """The object: for an encoded kind, a copy of its own."""
        return json.loads(self.stored) if isinstance(self.stored, str) else self.stored

    def newer_than(self, version: int | None) -> bool:
        # An unparseable version is taken as newer: a watch never goes wrong by being believed.
        return self.version is not None and version is not None and self.version > version

    def indexed_terms(self) -> list[tuple[str, str]]:
        return [(key, self.labels[key]) for key in INDEXED_LABELS if key in self.labels]

    def matches(self, selector: Mapping[str, str | None]) -> bool:
        return all(
            key in self.labels if value is None else self.labels.get(key) == value for key, value in selector.items()
        )


class _Shelf:
    """The objects of one kind in one namespace, by name and by the values of :data:`INDEXED_LABELS`, each in the
    order first seen."""

    def __init__(self, *, encoded: bool) -> None:
        self.encoded = encoded
        self.entries: dict[str, _Entry] = {}
        # Ordered sets of names (a dict's keys).
        self._named: dict[tuple[str, str], dict[str, None]] = {}

    def put(self, body: Obj) -> None:
        """Keep ``body``, unless the shelf holds a newer version of it."""
        entry = _Entry.of(body, encoded=self.encoded)
        name = body["metadata"]["name"]
        current = self.entries.get(name)
        if current is not None and current.newer_than(entry.version):
            return
        terms = entry.indexed_terms()
        if current is not None and current.indexed_terms() != terms:
            self._unindex(name, current)
            current = None
        self.entries[name] = entry
        if current is None:
            for term in terms:
                self._named.setdefault(term, {})[name] = None

    def pop(self, name: str) -> None:
        entry = self.entries.pop(name, None)
        if entry is not None:
            self._unindex(name, entry)

    def select(self, selector: Mapping[str, str | None]) -> list[_Entry]:
        terms = [(key, value) for key, value in selector.items() if key in INDEXED_LABELS and value is not None]
        names = min((self._named.get(term, {}) for term in terms), key=len) if terms else self.entries
        return [entry for name in names if (entry := self.entries[name]).matches(selector)]

    def _unindex(self, name: str, entry: _Entry) -> None:
        for term in entry.indexed_terms():
            names = self._named[term]
            del names[name]
            if not names:
                del self._named[term]


class ObjectCache:
    """The watched objects by kind, namespace and name; safe from kopf's loop and the worker threads at once.

    Objects of the :data:`ENCODED` kinds are read as copies of their own; the others are shared, never copied:
    readers must change neither.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._shelves: dict[tuple[str, str], _Shelf] = {}

    def observe(self, body: Obj) -> None:
        """Keep an object as a watch, a write or a read returned it, unless the cache already holds a newer one."""
        resource = _BY_PLURAL.get(_plural(body))
        if resource is None:
            return
        body = _without_managed_fields(body)
        with self._lock:
            key = (resource.plural, body["metadata"]["namespace"])
            shelf = self._shelves.get(key) or self._shelves.setdefault(key, _Shelf(encoded=resource in ENCODED))
            shelf.put(body)

    def forget(self, body: Obj) -> None:
        """Drop a deleted object (unless a newer one of the same name took its place)."""
        resource = _BY_PLURAL.get(_plural(body))
        if resource is None:
            return
        meta = body["metadata"]
        with self._lock:
            shelf = self._shelves.get((resource.plural, meta["namespace"]))
            current = shelf.entries.get(meta["name"]) if shelf is not None else None
            if shelf is not None and current is not None and current.uid == meta.get("uid"):
                shelf.pop(meta["name"])

    def replace(self, resource: Resource, namespace: str | None, items: Sequence[Obj], version: str) -> None:
        """A fresh list at ``version``: objects missing from it that are no newer were deleted unseen."""
        for item in items:
            self.observe(item)
        self.prune(
            resource, namespace, {(item["metadata"]["namespace"], item["metadata"]["name"]) for item in items}, version
        )

    def prune(self, resource: Resource, namespace: str | None, listed: Set[tuple[str, str]], version: str) -> None:
        """Drop the objects a fresh list at ``version`` did not hold, (namespace, name) ``listed``, unless newer."""
        at = int(version) if version.isdigit() else None
        with self._lock:
            for (plural, ns), shelf in self._shelves.items():
                if plural != resource.plural or namespace not in (None, ns):
                    continue
                gone = [n for n, entry in shelf.entries.items() if (ns, n) not in listed and not entry.newer_than(at)]
                for name in gone:
                    shelf.pop(name)

    def get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """The object, or ``None``."""
        with self._lock:
            shelf = self._shelves.get((resource.plural, namespace))
            entry = shelf.entries.get(name) if shelf is not None else None
        return entry.read() if entry is not None else None

    def list(self, resource: Resource, namespace: str | None, labels: str | None = None) -> list[Obj]:
        """Objects of a kind in a namespace (all for ``None``) whose labels match an equality selector."""
        selector = parse_selector(labels)
        with self._lock:
            found = [
                entry
                for (plural, ns), shelf in self._shelves.items()
                if plural == resource.plural and namespace in (None, ns)
                for entry in shelf.select(selector)
            ]
        return [entry.read() for entry in found]


def _without_managed_fields(body: Obj) -> Obj:
    # Server-side apply's record of who set each field: nearly half of a Deployment's or a pod's JSON, and no
    # reconciler reads it (controller-runtime's caches drop it too).
    meta = body["metadata"]
    if "managedFields" not in meta:
        return body
    return {**body, "metadata": {key: value for key, value in meta.items() if key != "managedFields"}}


def _plural(body: Obj) -> str:
    kind = body.get("kind")
    return next((r.plural for r in CACHED if r.kind == kind), "")


class CachedKube(Kube):
    """:class:`Kube` whose reads of the watched kinds come from an :class:`ObjectCache`, and whose writes
    skip what would change nothing and feed the cache what they return."""

    def __init__(self, client: kubernetes.client.ApiClient, cache: ObjectCache, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self.cache = cache
        # What the last lists found of the optional kinds; unknown before the first.
        self._served: dict[Resource, bool] = {}

    def get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """From the cache for a cached kind."""
        if resource in CACHED:
            return self.cache.get(resource, namespace, name)
        return super().get(resource, namespace, name)

    def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete; an object of an unwatched kind leaves the cache at once, since no watch event will say so."""
        cached = self.cache.get(resource, namespace, name) if resource in LISTED else None
        deleted = super().delete(resource, namespace, name)
        if cached is not None:
            self.cache.forget(cached)
        return deleted

    def fresh(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """From the API server, into the cache."""
        body = super().get(resource, namespace, name)
        if body is not None:
            self.cache.observe(body)
        return body

    def list(
        self, resource: Resource, namespace: str | None, labels: str | None = None, fields: str | None = None
    ) -> list[Obj]:
        """From the cache for a cached kind (field selectors go to the API server)."""
        if resource in CACHED and fields is None:
            return self.cache.list(resource, namespace, labels)
        return super().list(resource, namespace, labels, fields)

    def relist(self, namespace: str | None) -> None:
        """List every cached kind again, dropping objects deleted while a watch was down."""
        for resource in WATCHED:
            self._relist(resource, namespace)
        self.relist_unwatched(namespace)

    def relist_unwatched(self, namespace: str | None) -> None:
        """List the kinds no watch brings (:data:`LISTED`), and learn which optional ones the cluster serves."""
        for resource in LISTED:
            try:
                self._relist(resource, namespace)
            except ApiError as error:
                if resource not in OPTIONAL or error.status != NOT_FOUND:
                    raise
                self._served[resource] = False
                # Nothing of a kind the cluster does not serve is left: an empty version is no older than any.
                self.cache.replace(resource, namespace, [], "")
            else:
                self._served[resource] = True

    def serves(self, resource: Resource) -> bool:
        """Whether the cluster served an optional kind at the last list (``False`` before the first)."""
        return self._served.get(resource, False)

    def _relist(self, resource: Resource, namespace: str | None) -> None:
        # By pages: at thousands of services one list of pods would be tens of megabytes of JSON, and seven times
        # that decoded, at every resync. Every page comes from the first one's snapshot (its resourceVersion).
        selector = CACHED[resource]
        listed: set[tuple[str, str]] = set()
        token = ""
        while True:
            query = [("labelSelector", selector)] if selector else []
            query += [("limit", str(RELIST_PAGE)), *([("continue", token)] if token else [])]
            answer = self.request("GET", resource.path(namespace), query=query)
            for item in answer["items"]:
                self.cache.observe({**item, "apiVersion": resource.api_version, "kind": resource.kind})
                listed.add((item["metadata"]["namespace"], item["metadata"]["name"]))
            token = answer["metadata"].get("continue") or ""
            if not token:
                break
        self.cache.prune(resource, namespace, listed, answer["metadata"]["resourceVersion"])

    def create(self, body: Obj) -> Obj:
        """Create, and keep what the server made."""
        return self._observed(super().create(body))

    def apply(self, body: Obj) -> Obj:
        """Server-side apply only what would change the object (:func:`would_change`); else the cached object."""
        resource, meta = _resource(body), body["metadata"]
        if resource not in CACHED:
            return super().apply(body)
        live = self.cache.get(resource, meta["namespace"], meta["name"])
        if live is not None and not would_change(body, live):
            return live
        return self._observed(super().apply(stamped(body)))

    def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: Obj, subresource: str | None = None
    ) -> Obj:
        """Patch, and keep the object as patched (a scale subresource's answer is no object of the kind)."""
        answer = super().merge_patch(resource, namespace, name, patch, subresource)
        return self._observed(answer) if answer.get("kind") == resource.kind else answer

    def _observed(self, body: Obj) -> Obj:
        self.cache.observe(body)
        return body


def _resource(body: Obj) -> Resource:
    return BY_KIND[body["kind"]]
