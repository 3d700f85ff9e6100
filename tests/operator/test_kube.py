"""The thin client: REST paths, and requests that get no answer raise ApiError like refused ones.

The failures are real: loopback sockets that never answer, hang up, or are closed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import kubernetes
import pytest
from prometheus_client import generate_latest

from neuronfleet.devcluster.addons.metrics import parse_samples
from neuronfleet.operator.cluster.kube import (
    ARTIFACTS,
    CONFIGMAPS,
    CONNECTION_FAILED,
    DEPLOYMENTS,
    NO_RESPONSE,
    SERVICES_NIS,
    TIMEOUT,
    ApiError,
    EventRecorder,
    Kube,
)
from neuronfleet.operator.policy.conditions import Event
from neuronfleet.operator.reconcilers import Manager

TOKEN = "s3cr3t-token"


def test_core_and_group_paths() -> None:
    assert CONFIGMAPS.path("ns", "cm") == "/api/v1/namespaces/ns/configmaps/cm"
    assert DEPLOYMENTS.path("ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert SERVICES_NIS.path("ns", "svc", "status") == (
        "/apis/neuronfleet.io/v1alpha1/namespaces/ns/neuroninferenceservices/svc/status"
    )


def test_all_namespaces() -> None:
    assert ARTIFACTS.path(None) == "/apis/neuronfleet.io/v1alpha1/neuroncompiledartifacts"
    assert CONFIGMAPS.api_version == "v1"
    assert DEPLOYMENTS.api_version == "apps/v1"


def client_for(port: int, timeout: float = 0.3) -> Kube:
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    configuration.api_key = {"BearerToken": f"Bearer {TOKEN}"}
    return Kube(kubernetes.client.ApiClient(configuration), timeout=timeout)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose listener completes connections (the kernel's backlog) and never answers."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield int(server.getsockname()[1])


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def hanging_up_port() -> Iterator[int]:
    """A port whose listener accepts each connection and closes it without a word."""
    server = socket.create_server(("127.0.0.1", 0))

    def hang_up() -> None:
        with contextlib.suppress(OSError):  # the listener closed: done
            while True:
                connection, _ = server.accept()
                connection.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(timeout=5)


def failure(kube: Kube) -> ApiError:
    with pytest.raises(ApiError) as caught:
        kube.get(SERVICES_NIS, "ns", "llama")
    error = caught.value
    assert TOKEN not in str(error)
    return error


def test_a_server_that_never_answers_is_a_timeout(silent_port: int) -> None:
    start = time.monotonic()
    error = failure(client_for(silent_port))
    assert (error.status, error.reason) == (NO_RESPONSE, TIMEOUT)
    assert error.message == f"GET {SERVICES_NIS.path('ns', 'llama')}: no answer within 0.3 s"
    # Bounded by the timeout (and urllib3's own retries of a GET), not by the server.
    assert time.monotonic() - start < 10


def test_a_refused_connection_is_a_connection_failure(closed_port: int) -> None:
    error = failure(client_for(closed_port))
    assert (error.status, error.reason) == (NO_RESPONSE, CONNECTION_FAILED)
    assert "Connection refused" in error.message
    assert str(closed_port) not in error.message


def test_a_server_that_hangs_up_is_a_connection_failure(hanging_up_port: int) -> None:
    error = failure(client_for(hanging_up_port))
    assert (error.status, error.reason) == (NO_RESPONSE, CONNECTION_FAILED)
    assert error.message.startswith(f"GET {SERVICES_NIS.path('ns', 'llama')}: ")


def test_the_event_recorder_survives_an_unreachable_server(closed_port: int, caplog: pytest.LogCaptureFixture) -> None:
    body = {
        "apiVersion": "neuronfleet.io/v1alpha1",
        "kind": "NeuronInferenceService",
        "metadata": {"name": "llama", "namespace": "ns", "uid": "uid-1"},
    }
    with caplog.at_level(logging.WARNING):
        EventRecorder(client_for(closed_port))(body, Event("Normal", "Ready", "2/2 replicas ready"))
    assert "could not post event Ready on ns/llama" in caplog.text
    assert CONNECTION_FAILED in caplog.text


def test_a_resync_that_cannot_list_fails_as_an_api_error_and_is_counted(closed_port: int) -> None:
    reconciler = Manager(client_for(closed_port), lambda body, event: None)
    with pytest.raises(ApiError) as caught:
        reconciler.resync(["ns"])
    assert caught.value.reason == CONNECTION_FAILED
    samples = parse_samples(generate_latest(reconciler.metrics.registry).decode())
    assert samples[("neuronfleet_operator_resyncs_total", (("outcome", "error"),))] == 1
    assert samples[("neuronfleet_operator_resyncs_total", (("outcome", "ok"),))] == 0
