"""A small JSON client for the API calls the rig itself makes (readiness, nodes, the demo's objects).

The rig avoids the ``kubernetes`` package so ``neuronfleet-dev`` starts fast; tests use the full client
through :meth:`LocalCluster.api_client`. Objects are plain dicts, and custom resources are found by kind
through API discovery, so nothing here depends on the operator's package.
"""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from neuronfleet.devcluster.errors import RigError

Obj = dict[str, Any]


class ApiError(RigError):
    """The API server answered with an error status (``status`` holds the HTTP code)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Api:
    """JSON over HTTPS to one API server, authenticated with a client certificate; close it when done."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(cert), str(key))
        self._client = httpx.Client(base_url=server, verify=context, headers={"Accept": "application/json"})
        self._plurals: dict[tuple[str, str], str] = {}

    def __enter__(self) -> Api:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close its connections."""
        self._client.close()

    def request(
        self, method: str, path: str, body: object = None, *, timeout: float = 10.0, content_type: str | None = None
    ) -> Any:
        """Send one request; return the decoded JSON answer (or the text, for non-JSON endpoints).

        ``content_type`` names a patch's kind (``application/merge-patch+json``). An error status raises
        :class:`ApiError`; no connection raises ``httpx.TransportError``.
        """
        headers = None if content_type is None else {"Content-Type": content_type}
        response = self._client.request(method, path, json=body, timeout=timeout, headers=headers)
        if response.is_error:
            detail = response.text
            with contextlib.suppress(ValueError, AttributeError):  # a Status object names the problem
                detail = response.json().get("message", detail)
            raise ApiError(response.status_code, detail)
        try:
            return response.json()
        except ValueError:
            return response.text

    def get(self, path: str) -> Obj | None:
        """GET an object; None when it does not exist."""
        try:
            found: Obj = self.request("GET", path)
        except ApiError as error:
            if error.status == httpx.codes.NOT_FOUND:
                return None
            raise
        return found

    def path(self, api_version: str, kind: str, namespace: str, name: str | None = None) -> str:
        """The URL path of the ``kind`` objects of ``api_version`` in ``namespace`` (of one, given ``name``)."""
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        key = (api_version, kind)
        if key not in self._plurals:
            resources = self.request("GET", base)["resources"]
            self._plurals.update(
                {(api_version, r["kind"]): r["name"] for r in resources if "/" not in r["name"]}  # no subresources
            )
        if key not in self._plurals:
            raise ApiError(httpx.codes.NOT_FOUND, f"the API server serves no {kind} in {api_version}")
        collection = f"{base}/namespaces/{namespace}/{self._plurals[key]}"
        return collection if name is None else f"{collection}/{name}"
