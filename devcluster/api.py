"""A minimal HTTPS client for the few API calls the rig itself makes (readiness, nodes).

The rig avoids the ``kubernetes`` package so ``neuronfleet-dev`` starts fast and needs only the standard
library here; tests and the operator use the full client through :meth:`LocalCluster.api_client`.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    """The API server answered with an error status (``status`` holds the HTTP code)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Api:
    """JSON over HTTPS to one API server, authenticated with a client certificate."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server
        self._context = ssl.create_default_context(cafile=str(ca))
        self._context.load_cert_chain(str(cert), str(key))

    def request(self, method: str, path: str, body: object = None, *, timeout: float = 10.0) -> Any:
        """Send one request; return the decoded JSON answer (or the text, for non-JSON endpoints)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, context=self._context, timeout=timeout) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):  # a Status object names the problem
                detail = json.loads(detail).get("message", detail)
            raise ApiError(error.code, detail) from None
        try:
            return json.loads(text)
        except ValueError:
            return text
