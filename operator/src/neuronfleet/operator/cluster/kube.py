"""A thin, dict-in dict-out Kubernetes client over the official client's transport.

The plan builds plain dicts; this sends them as they are (including server-side
apply) and returns plain dicts, so no model classes stand between the plan and
the API server. Authentication and TLS are the official client's.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3

from neuronfleet.contract.names import FIELD_MANAGER, GROUP
from neuronfleet.operator import __version__, api
from neuronfleet.operator.policy.conditions import Event

Obj = dict[str, Any]

log = logging.getLogger(__name__)

#: Seconds to wait for one API request.
REQUEST_TIMEOUT = 30
#: Kubernetes' label on a Job's pods: the Job's name.
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


@dataclass(frozen=True)
class Resource:
    """A namespaced API resource."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        """``group/version``, or ``v1`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        """The REST path of a collection (all namespaces for ``None``), or of one object (and a subresource)."""
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{root}/namespaces/{namespace}/{self.plural}" if namespace is not None else f"{root}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SERVICES = Resource("", "v1", "services", "Service")
PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
JOBS = Resource("batch", "v1", "jobs", "Job")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
SERVICES_NIS = Resource(GROUP, api.VERSION, api.SERVICE_KIND.plural, api.SERVICE_KIND.kind)
ARTIFACTS = Resource(GROUP, api.VERSION, api.ARTIFACT_KIND.plural, api.ARTIFACT_KIND.kind)
#: KEDA's, served only where KEDA is installed.
SCALED_OBJECTS = Resource("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")
#: The Gateway API Inference Extension's, served only where its CRD is installed.
INFERENCE_POOLS = Resource("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool")
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
#: Dynamic Resource Allocation's, served from Kubernetes 1.34.
RESOURCE_CLAIM_TEMPLATES = Resource("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate")
DEVICE_CLASSES = Resource("resource.k8s.io", "v1", "deviceclasses", "DeviceClass")

BY_KIND = {
    r.kind: r
    for r in (
        CONFIGMAPS,
        SERVICES,
        PODS,
        DEPLOYMENTS,
        JOBS,
        PDBS,
        SERVICES_NIS,
        ARTIFACTS,
        SCALED_OBJECTS,
        INFERENCE_POOLS,
        SERVICE_ACCOUNTS,
        ROLES,
        ROLE_BINDINGS,
        RESOURCE_CLAIM_TEMPLATES,
        DEVICE_CLASSES,
    )
}


class ApiError(Exception):
    """A request the API server refused, or one that got no answer (``status`` :data:`NO_RESPONSE`)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


FORBIDDEN, NOT_FOUND, CONFLICT = 403, 404, 409
#: ``ApiError.status`` when no HTTP response came back.
NO_RESPONSE = 0
#: ``ApiError.reason`` for no answer within the request timeout, and for a connection that failed
#: (refused, reset, closed mid-response, TLS).
TIMEOUT, CONNECTION_FAILED = "Timeout", "ConnectionFailed"


def named_client(configuration: kubernetes.client.Configuration, identity: str) -> kubernetes.client.ApiClient:
    """A client whose every request names this operator process in its ``User-Agent``: where several run (one
    leads, the others stand by), the API server's audit log says which one wrote what."""
    client = kubernetes.client.ApiClient(configuration)
    client.user_agent = f"neuronfleet-operator/{__version__} ({identity})"
    return client


class Kube:
    """Requests to one API server, as plain dicts."""

    def __init__(self, client: kubernetes.client.ApiClient, timeout: float = REQUEST_TIMEOUT) -> None:
        self._client = client
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One request; raises :class:`ApiError` unless it succeeds (no answer in time is one too)."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, payload, _ = self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self._client.call_api(
                method, url, header_params=headers, body=payload, _request_timeout=self.timeout
            )
            # The body is streamed: reading it can time out or break too.
            data: bytes = response.read()
        except kubernetes.client.ApiException as error:
            if not error.status:  # the client's wrapping of a TLS failure
                first = str(error.reason or "").replace("\n", ": ")
                raise ApiError(NO_RESPONSE, CONNECTION_FAILED, f"{method} {path}: {first}") from None
            raise _api_error(int(error.status), error.body) from None
        except urllib3.exceptions.HTTPError as error:
            raise _no_response(method, path, error, self.timeout) from None
        if not 200 <= response.status <= 299:
            raise _api_error(response.status, data)
        return json.loads(data) if data else {}

    def get(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """The object, or ``None`` when it does not exist."""
        try:
            return self.request("GET", resource.path(namespace, name))
        except ApiError as error:
            if error.status == NOT_FOUND:
                return None
            raise

    def fresh(self, resource: Resource, namespace: str, name: str) -> Obj | None:
        """The object as the API server has it now, past any cache (a retry after a conflict reads this)."""
        return Kube.get(self, resource, namespace, name)

    def relist(self, namespace: str | None) -> None:
        """Read again whatever a cache holds of ``namespace`` (all for ``None``); this client holds nothing."""

    def serves(self, resource: Resource) -> bool:
        """Whether the cluster serves a kind (an optional CRD is installed): asked each time."""
        try:
            self.request("GET", resource.path(None), query=[("limit", "1")])
        except ApiError as error:
            if error.status == NOT_FOUND:
                return False
            raise
        return True

    def list(
        self, resource: Resource, namespace: str | None, labels: str | None = None, fields: str | None = None
    ) -> list[Obj]:
        """Objects in a namespace (all for ``None``), optionally by label and field selector."""
        query = [("labelSelector", labels)] if labels else []
        if fields:
            query.append(("fieldSelector", fields))
        items: list[Obj] = self.request("GET", resource.path(namespace), query=query).get("items", [])
        return items

    def create(self, body: Obj) -> Obj:
        """Create an object; :class:`ApiError` 409 when it exists."""
        resource = BY_KIND[body["kind"]]
        return self.request("POST", resource.path(body["metadata"]["namespace"]), body=body)

    def apply(self, body: Obj) -> Obj:
        """Server-side apply as the operator's field manager: the same intent twice changes nothing."""
        resource = BY_KIND[body["kind"]]
        meta = body["metadata"]
        return self.request(
            "PATCH",
            resource.path(meta["namespace"], meta["name"]),
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=body,
            content_type="application/apply-patch+yaml",
        )

    def merge_patch(
        self, resource: Resource, namespace: str, name: str, patch: Obj, subresource: str | None = None
    ) -> Obj:
        """A JSON merge patch (with ``metadata.resourceVersion`` in it, an optimistic-locked one)."""
        return self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            body=patch,
            content_type="application/merge-patch+json",
        )

    def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        """Delete with background propagation; ``False`` when it was already gone."""
        try:
            self.request(
                "DELETE",
                resource.path(namespace, name),
                body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
            )
        except ApiError as error:
            if error.status == NOT_FOUND:
                return False
            raise
        return True


class EventRecorder:
    """Posts core/v1 Events (what ``kubectl describe`` shows); best effort, never raises."""

    def __init__(self, kube: Kube, component: str = FIELD_MANAGER) -> None:
        self.kube = kube
        self.component = component
        self.instance = socket.gethostname()

    def __call__(self, body: Obj, event: Event) -> None:
        """Record ``event`` (type, reason, message) about ``body``."""
        meta = body["metadata"]
        at = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": at,
            "lastTimestamp": at,
            "count": 1,
        }
        try:
            self.kube.request("POST", EVENTS.path(meta["namespace"]), body=record)
        except ApiError as error:
            log.warning("could not post event %s on %s/%s: %s", event.reason, meta["namespace"], meta["name"], error)


def _api_error(status: int, data: str | bytes | None) -> ApiError:
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        parsed = {}
    if not isinstance(parsed, dict):
        parsed = {}
    return ApiError(status, str(parsed.get("reason", "")), str(parsed.get("message", data or "")))


def _no_response(method: str, path: str, error: urllib3.exceptions.HTTPError, timeout: float) -> ApiError:
    """A timeout or a failed connection as an :class:`ApiError`; the message names no host, header or body."""
    cause = error.reason if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason else error
    # A refused connection is a ConnectTimeoutError too, in urllib3's hierarchy.
    if isinstance(cause, urllib3.exceptions.TimeoutError) and not isinstance(
        cause, urllib3.exceptions.NewConnectionError
    ):
        return ApiError(NO_RESPONSE, TIMEOUT, f"{method} {path}: no answer within {timeout:g} s")
    detail = next((e.strerror for e in _chain(cause) if isinstance(e, OSError) and e.strerror), None)
    return ApiError(
        NO_RESPONSE, CONNECTION_FAILED, f"{method} {path}: {type(cause).__name__}" + (f" ({detail})" if detail else "")
    )


def _chain(error: BaseException) -> list[BaseException]:
    """``error``, what caused it, and exceptions among its arguments (urllib3 nests them there), breadth first."""
    seen: list[BaseException] = []
    queue = [error]
    while queue and len(seen) < 16:
        current = queue.pop(0)
        if any(current is s for s in seen):
            continue
        seen.append(current)
        queue += [e for e in (current.__cause__, current.__context__, *current.args) if isinstance(e, BaseException)]
    return seen
