"""One completion through a Kubernetes Service, from the real node's network: the demo's ``curl`` (pure).

The node's network namespace holds kube-proxy's rules, so a client there reaches a Service's ClusterIP as
a pod does: kube-proxy sends it to one of the Service's ready endpoints. The demo prints the command it
builds here and runs the same one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from neuronfleet.devcluster.errors import RigError

Obj = dict[str, Any]

#: The prompt of the demo's completion.
PROMPT = "The capital of France is"
MAX_TOKENS = 16
#: Seconds curl waits for the whole answer.
CURL_TIMEOUT_S = 60
#: curl's exit status when it could not connect: nothing was sent, so sending again is safe.
CURL_COULD_NOT_CONNECT = 7


def served_model(uri: str) -> str:
    """The model name clients ask for: the engine serves ``hf://org/name`` as ``org/name``."""
    return uri.split("://", 1)[-1]


def completion_request(model: str, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> Obj:
    """The OpenAI completion request."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens}


def curl_argv(netns: str, url: str, document: Obj) -> list[str]:
    """``curl -si`` POSTing ``document`` to ``url`` from inside ``netns`` (status line and headers shown)."""
    return [
        "ip",
        "netns",
        "exec",
        netns,
        "curl",
        "-sSi",
        "--max-time",
        str(CURL_TIMEOUT_S),
        url,
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps(document),
    ]


@dataclass(frozen=True)
class Response:
    """An HTTP response as ``curl -i`` printed it."""

    status: int
    #: Header names lower-cased.
    headers: dict[str, str]
    body: str


class ResponseError(RigError, ValueError):
    """curl's output is not an HTTP response."""


def parse_response(text: str) -> Response:
    """The final response in ``curl -i`` output (after any interim ``1xx`` ones)."""
    rest = text.replace("\r\n", "\n")
    while True:
        head, separator, rest = rest.partition("\n\n")
        lines = head.split("\n")
        words = lines[0].split()
        if not separator or len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
            raise ResponseError(f"not an HTTP response: {text[:200]!r}")
        if not words[1].startswith("1"):
            break
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Response(int(words[1]), headers, rest)


def completion_text(response: Response) -> str:
    """The generated text of a successful completion response."""
    try:
        return str(json.loads(response.body)["choices"][0]["text"])
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise ResponseError(f"not a completion ({error}): {response.body[:200]!r}") from None


def ready_endpoints(slices: list[Obj]) -> list[tuple[str, str]]:
    """(pod, node) of every ready endpoint in a Service's EndpointSlices."""
    found = []
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or []:
            if (endpoint.get("conditions") or {}).get("ready") and endpoint.get("targetRef"):
                found.append((str(endpoint["targetRef"]["name"]), str(endpoint.get("nodeName", "?"))))
    return sorted(found)
