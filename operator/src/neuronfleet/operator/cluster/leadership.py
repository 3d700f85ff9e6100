"""One operator reconciles at a time: leader election on a Lease.

The election itself is the Kubernetes Python client's (``kubernetes.leaderelection``), which follows
client-go: a candidate takes the Lease only once its record has gone unchanged for a lease duration by
the candidate's own clock (no trust in another machine's), and the leader renews it every retry period.
Around it, what a controller needs that the library leaves to its caller:

- a leader that has not renewed within the renew deadline exits at once, as controller-runtime's do, so
  its reconciles stop before the Lease can expire for anyone else: a watchdog on the monotonic clock
  holds the deadline, since the library checks it only between tries, and each request is bounded
  (no retries inside, a timeout below the deadline);
- an election thread that ends for any reason takes the process with it: the kubelet restarts it as a
  candidate, rather than leaving a leader that no longer renews or a candidate that never leads;
- a leader that stops on purpose (SIGTERM: an upgrade, a drain) releases the Lease once its reconciles
  have ended, so a standby takes over within a retry period instead of a lease duration, and its own
  renewals can no longer take the Lease back;
- a standby answers its liveness probe while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import logging
import os
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import kubernetes
import urllib3
from aiohttp import web
from kubernetes.client import ApiException, CoordinationV1Api, V1Lease
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from neuronfleet.operator.cluster.kube import named_client

log = logging.getLogger(__name__)

#: The status a leader exits with when it cannot renew its Lease (or its election thread ended).
EXIT_LOST_LEASE = 3
#: How often the watchdog checks the renew deadline.
WATCHDOG_PERIOD_S = 0.1
#: The library's jitter factor: its renew deadline must exceed this many retry periods.
RENEW_JITTER = 1.2


def candidate_identity() -> str:
    """``<pod name>_<random>``: the pod (its hostname) for people, and unique per process, so a restarted
    container is a new candidate that waits out its predecessor's Lease like any other."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def holder_pod(identity: str) -> str:
    """The pod a holder identity names."""
    return identity.rsplit("_", 1)[0]


@dataclass(frozen=True)
class Election:
    """Which Lease the operators elect their leader on, and its timings (client-go's defaults)."""

    namespace: str
    lease: str = "neuronfleet-operator"
    lease_duration_s: int = 15
    renew_deadline_s: int = 10
    retry_period_s: int = 2
    identity: str = field(default_factory=candidate_identity)

    def problem(self) -> str | None:
        """Why these timings cannot elect safely, or ``None``."""
        if self.retry_period_s < 1:
            return f"the retry period must be at least 1 s, not {self.retry_period_s}"
        if self.renew_deadline_s <= RENEW_JITTER * self.retry_period_s:
            return (
                f"the renew deadline ({self.renew_deadline_s} s) must exceed {RENEW_JITTER} retry periods "
                f"({RENEW_JITTER * self.retry_period_s:g} s)"
            )
        if self.lease_duration_s <= self.renew_deadline_s:
            return (
                f"the lease duration ({self.lease_duration_s} s) must exceed the renew deadline "
                f"({self.renew_deadline_s} s): a leader must give up before others may take over"
            )
        return None


class LeaseUnavailable(Exception):
    """The Lease cannot be read with these credentials (a missing Role, a wrong namespace)."""


class Leadership:
    """This process's candidacy for the Lease: wait to lead, then lead or exit, and give the Lease up last."""

    def __init__(self, election: Election, configuration: kubernetes.client.Configuration) -> None:
        bounded = copy.copy(configuration)
        bounded.retries = False  # one try is one request, bounded by its timeout
        self.election = election
        self.lock = _BoundedLeaseLock(election, CoordinationV1Api(named_client(bounded, election.identity)))

    async def acquire(self) -> None:
        """Return once this process holds the Lease; from then on it renews it, or the process exits
        (:data:`EXIT_LOST_LEASE`) the moment it has not renewed within the renew deadline."""
        election = self.election
        await asyncio.to_thread(self._check_access)
        loop = asyncio.get_running_loop()
        leading = asyncio.Event()
        config = electionconfig.Config(
            self.lock,
            election.lease_duration_s,
            election.renew_deadline_s,
            election.retry_period_s,
            onstarted_leading=lambda: loop.call_soon_threadsafe(leading.set),
            onstopped_leading=self._stop_reconciling,
        )
        # The library logs every try at INFO (every retry period, for ever): transitions are logged here instead.
        logging.getLogger("leaderelection").setLevel(logging.WARNING)
        log.info("standing by for Lease %s/%s as %s", election.namespace, election.lease, election.identity)
        self._thread(self._elect, leaderelection.LeaderElection(config), name="leader-election")
        await leading.wait()
        self._thread(self._watch_deadline, name="lease-deadline")
        log.info("leading: Lease %s/%s held as %s", election.namespace, election.lease, election.identity)

    def release(self) -> None:
        """Give the Lease up if this process holds it, so a standby takes over at its next try. Call it once
        nothing reconciles any more: from here on the renewals fail, and nothing can take the Lease back."""
        election, api = self.election, self.lock.api_instance
        with self.lock.guard:  # waits out a renewal in flight
            self.lock.closed = True
        try:
            lease: V1Lease = api.read_namespaced_lease(election.lease, election.namespace, _request_timeout=5)
            if lease.spec is None or lease.spec.holder_identity != election.identity:
                return
            lease.spec = released(lease.spec, datetime.datetime.now(datetime.UTC))
            # Its resourceVersion makes this a compare-and-swap.
            api.replace_namespaced_lease(election.lease, election.namespace, lease, _request_timeout=5)
        except (ApiException, urllib3.exceptions.HTTPError) as error:
            log.warning("could not release Lease %s/%s: %s", election.namespace, election.lease, error)
            return
        log.info("released Lease %s/%s", election.namespace, election.lease)

    def _check_access(self) -> None:
        """Fail loudly where the library would retry a refused read for ever, in silence."""
        election = self.election
        try:
            self.lock.api_instance.read_namespaced_lease(
                election.lease, election.namespace, _request_timeout=election.renew_deadline_s
            )
        except urllib3.exceptions.HTTPError as error:
            raise LeaseUnavailable(f"cannot read Lease {election.namespace}/{election.lease}: {error}") from error
        except ApiException as error:
            if error.status != 404:  # not there yet: the first candidate creates it
                raise LeaseUnavailable(
                    f"cannot read Lease {election.namespace}/{election.lease}: {error.status} {error.reason} "
                    "(the chart's Role grants get, create and update on it in the operator's namespace)"
                ) from error

    @staticmethod
    def _thread(target: Callable[..., None], *args: object, name: str) -> None:
        threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def _elect(self, election: leaderelection.LeaderElection) -> None:
        """Run the election; it returns only once leadership is lost, and nothing may outlive that."""
        try:
            election.run()
        except BaseException:
            log.exception("the leader election ended")
        finally:
            self._stop_reconciling()

    def _watch_deadline(self) -> None:
        deadline = self.election.renew_deadline_s
        while self.lock.closed or time.monotonic() - self.lock.renewed_at <= deadline:
            time.sleep(WATCHDOG_PERIOD_S)
        self._stop_reconciling()

    def _stop_reconciling(self) -> None:
        if self.lock.closed:  # released on the way out: the renewals fail by design
            return
        log.critical("lost the Lease (not renewed in time): exiting, so that only its next holder reconciles")
        os._exit(EXIT_LOST_LEASE)  # no cleanup that could reconcile once more, no wait for the event loop


def released(spec: kubernetes.client.V1LeaseSpec, now: datetime.datetime) -> kubernetes.client.V1LeaseSpec:
    """A Lease spec that no one holds, expired a second after ``now`` (client-go's release)."""
    return kubernetes.client.V1LeaseSpec(
        holder_identity=None,
        lease_duration_seconds=1,
        acquire_time=now,
        renew_time=now,
        lease_transitions=spec.lease_transitions,
    )


@contextlib.asynccontextmanager
async def answering_liveness(endpoint: str | None) -> AsyncIterator[None]:
    """Serve ``endpoint`` (``http://host:port/path``) while a standby waits; kopf serves it once leading."""
    if endpoint is None:
        yield
        return
    url = urllib.parse.urlsplit(endpoint)

    async def standing_by(_: web.Request) -> web.Response:
        return web.json_response({"leader": False})

    app = web.Application()
    app.router.add_get(url.path or "/", standing_by)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    # kopf's defaults for what the URL leaves out, so both listen alike.
    await web.TCPSite(runner, url.hostname or "localhost", url.port or 80).start()
    try:
        yield
    finally:
        await runner.cleanup()


class _BoundedLeaseLock(LeaseLock):
    """The library's LeaseLock with the operator's credentials, each request bounded (a hung one must not outlast
    the renew deadline), a lost connection counted as a failed try (as a refused request is, not as the end of
    the election), the time of the last renewal kept for the watchdog, and closed once released."""

    def __init__(self, election: Election, api: CoordinationV1Api) -> None:
        super().__init__(election.lease, election.namespace, election.identity)  # type: ignore[no-untyped-call]
        self.api_instance = api
        self.timeout = election.renew_deadline_s / 2
        #: Held by a write in flight, and by the release.
        self.guard = threading.Lock()
        self.closed = False
        #: When the last successful try began (monotonic): the Lease was renewed no earlier.
        self.renewed_at = time.monotonic()
        self._try_began = self.renewed_at
        self._refused = False

    def get(self, name: str, namespace: str) -> tuple[bool, object]:
        self._try_began = time.monotonic()
        if self.closed:
            return False, ApiException(status=0, reason="released")
        try:
            lease = self.api_instance.read_namespaced_lease(name, namespace, _request_timeout=self.timeout)
        except ApiException as error:
            self._say_if_refused(error)
            return False, error
        except urllib3.exceptions.HTTPError as error:
            return False, ApiException(status=0, reason=f"no answer: {error}")
        self.lease_reference = lease
        return True, self.get_lock_object(lease)  # type: ignore[no-untyped-call]

    def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        spec = self.get_lease_spec(election_record)  # type: ignore[no-untyped-call]
        body = V1Lease(metadata={"name": name}, spec=spec)
        with self.guard:
            if self.closed:
                return False
            try:
                self.lease_reference = self.api_instance.create_namespaced_lease(
                    namespace, body, _request_timeout=self.timeout
                )
            except (ApiException, urllib3.exceptions.HTTPError) as error:
                self._say_if_refused(error)
                return False
        self.renewed_at = self._try_began
        return True

    def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        if self.lease_reference is None:
            return False
        spec = self.get_lease_spec(updated_record, self.lease_reference.spec)  # type: ignore[no-untyped-call]
        self.lease_reference.spec = spec
        with self.guard:
            if self.closed:
                return False
            try:  # the resourceVersion read last makes this a compare-and-swap
                self.api_instance.replace_namespaced_lease(
                    name, namespace, self.lease_reference, _request_timeout=self.timeout
                )
            except (ApiException, urllib3.exceptions.HTTPError) as error:
                self._say_if_refused(error)
                return False
        self.renewed_at = self._try_began
        return True

    def _say_if_refused(self, error: Exception) -> None:
        """A refusal (401, 403) as a warning, once until it passes: the library would only log it at INFO."""
        refused = isinstance(error, ApiException) and error.status in {401, 403}
        if refused and not self._refused:
            log.warning("Lease %s/%s refused: %s", self.namespace, self.name, error)
        self._refused = refused
