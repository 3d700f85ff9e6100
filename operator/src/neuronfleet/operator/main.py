"""``neuronfleet-operator``: run the operator, or write its CRDs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import kopf
import kubernetes
import prometheus_client
import typer
from rich.console import Console

from neuronfleet.operator import crdgen
from neuronfleet.operator.api.rollout import MAX_ARTIFACT_HISTORY
from neuronfleet.operator.cluster.cache import CachedKube, ObjectCache
from neuronfleet.operator.cluster.kube import EventRecorder, named_client
from neuronfleet.operator.cluster.leadership import (
    Election,
    Leadership,
    LeaseUnavailable,
    answering_liveness,
    candidate_identity,
)
from neuronfleet.operator.metrics import OperatorMetrics
from neuronfleet.operator.plan import RouterImages
from neuronfleet.operator.reconcilers import Manager
from neuronfleet.operator.reconcilers.devices import NeuronDevices, NeuronDevicesSetting
from neuronfleet.operator.reconcilers.service import DEFAULT_ARTIFACT_HISTORY_LIMIT
from neuronfleet.operator.runtime.drive import RECONCILE_WORKERS
from neuronfleet.operator.runtime.handlers import build_registry

#: Exit status for bad input (credentials that do not load, CRDs out of date), as typer's for bad options.
EXIT_INVALID = 2

# Help is shown as written, never read as rich markup (where `[/X]` is a closing tag that crashes `--help`).
app = typer.Typer(
    help="The neuronfleet Kubernetes operator.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit with the invalid-input status."""
    err.print(f"error: {message}", markup=False)
    raise typer.Exit(EXIT_INVALID)


def load_configuration(kubeconfig: Path | None) -> kubernetes.client.Configuration:
    """Client configuration: the given kubeconfig, else in-cluster, else ``$KUBECONFIG``/``~/.kube/config``."""
    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    else:
        kubernetes.config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig is not None else None, client_configuration=configuration
        )
    return configuration


def connection_info(configuration: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """The same credentials for kopf's watches as for the reconciler's requests."""
    header = configuration.get_api_key_with_prefix("BearerToken") or configuration.get_api_key_with_prefix(
        "authorization"
    )
    scheme, token = None, None
    if header:
        parts = header.split(" ", 1)
        scheme, token = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


async def operate(
    configuration: kubernetes.client.Configuration,
    namespaces: Sequence[str] | None,
    *,
    resync_seconds: float = 300.0,
    liveness: str | None = None,
    metrics: OperatorMetrics | None = None,
    prometheus: str | None = None,
    router_images: RouterImages | None = None,
    artifact_history_limit: int = DEFAULT_ARTIFACT_HISTORY_LIMIT,
    neuron_devices: NeuronDevicesSetting = "devicePlugin",
    simulated_start_time_scale: float = 1.0,
    identity: str | None = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
) -> None:
    """Run the operator until ``stop_flag`` is set (or a signal, in the main thread); its requests name it as
    ``identity`` (its candidacy's, when elected)."""
    # The reconcilers read what the watches deliver (kopf fills the cache) and write through the client.
    cache = ObjectCache()
    kube = CachedKube(named_client(configuration, identity or candidate_identity()), cache)
    # What no watch brings, and whether the cluster serves InferencePools, before the first reconcile.
    every: list[str | None] = list(namespaces) if namespaces is not None else [None]
    for namespace in every:
        await asyncio.to_thread(kube.relist_unwatched, namespace)
    reconciler = Manager(
        kube,
        EventRecorder(kube),
        metrics,
        prometheus,
        router_images=router_images,
        artifact_history_limit=artifact_history_limit,
        devices=await asyncio.to_thread(NeuronDevices.resolve, neuron_devices, kube),
        start_time_scale=simulated_start_time_scale,
    )
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=RECONCILE_WORKERS, thread_name_prefix="reconcile")
    registry = build_registry(reconciler, cache, namespaces, resync_seconds, executor)
    if metrics is not None:
        metrics.leader.set(1)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(configuration)

    try:
        await kopf.operator(
            registry=registry,
            standalone=True,
            clusterwide=namespaces is None,
            namespaces=list(namespaces or ()),
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        # kopf cancelled its tasks, not the reconciles running in threads: they end here (the resync pass
        # stops at its next object), so nothing of this operator still writes once another may lead.
        await asyncio.to_thread(executor.shutdown, wait=True, cancel_futures=True)
        await asyncio.get_running_loop().shutdown_default_executor()


async def lead(
    configuration: kubernetes.client.Configuration, election: Election | None, liveness: str | None, **options: Any
) -> None:
    """Operate once this process leads (at once without an ``election``); release the Lease on the way out."""
    if election is None:
        await operate(configuration, liveness=liveness, **options)
        return
    leadership = Leadership(election, configuration)
    async with answering_liveness(liveness):
        await leadership.acquire()
    try:
        await operate(configuration, liveness=liveness, identity=election.identity, **options)
    finally:
        leadership.release()  # in the loop: its executor is shut down, and nothing else runs any more


def serve_metrics(metrics: OperatorMetrics, address: str, port: int) -> None:
    """Serve ``metrics`` on ``address:port`` (``/metrics``) from a thread, or fail with why not."""
    try:
        prometheus_client.start_http_server(port, address, registry=metrics.registry)
    except OSError as error:
        fail(f"cannot serve metrics on {address}:{port}: {error.strerror or error}")


# Options of `run` too long to read in its signature.
PrometheusAddress = Annotated[
    str | None,
    typer.Option(
        help="Prometheus URL the KEDA triggers of autoscaled services query, e.g. http://prometheus.monitoring:9090.",
        show_default=False,
    ),
]
ArtifactHistoryLimit = Annotated[
    int,
    typer.Option(
        min=0,
        max=MAX_ARTIFACT_HISTORY,
        help="Artifacts a service served before, kept for a rollback (unless its spec.rollout says).",
    ),
]
NeuronDevicesOption = Annotated[
    NeuronDevicesSetting,
    typer.Option(
        help=(
            "How Neuron replicas get devices unless their spec.placement.devices says: dra (ResourceClaims of the "
            "Neuron DRA driver), devicePlugin (aws.amazon.com/neuron), or auto (dra where the cluster has the "
            "DeviceClass neuron.aws.com, decided at start)."
        ),
    ),
]
SimulatedStartTimeScale = Annotated[
    float,
    typer.Option(
        min=0,
        max=1,
        help="The share of a Neuron replica's modelled start time (weights fetched, loaded, graphs, warm-up) that "
        "replicas on the simulated device (spec.device: sim) spend before they serve: 1 starts them as slowly as "
        "Neuron would, 0 at once.",
    ),
]
LeaseNamespace = Annotated[
    str | None,
    typer.Option(
        help="Elect one leader on a Lease in this namespace (run several operators, one reconciles). "
        "Default: no election, this one reconciles.",
        show_default=False,
    ),
]
PickerImage = Annotated[str, typer.Option(help="The Endpoint Picker's image, for services with spec.routing.")]
EnvoyImage = Annotated[str, typer.Option(help="Envoy's image, in front of each Endpoint Picker.")]
PickerInflightTokens = Annotated[
    bool,
    typer.Option(
        help="The picker image is neuronfleet's build (tools/gie): its pickers also score replicas by the tokens "
        "each has in flight to them."
    ),
]
LeaseName = Annotated[str, typer.Option(help="The Lease's name.")]
LeaseDuration = Annotated[int, typer.Option(min=1, help="A standby takes the Lease once it went unrenewed this long.")]
RenewDeadline = Annotated[
    int, typer.Option(min=1, help="The leader exits if it has not renewed the Lease within this.")
]
RetryPeriod = Annotated[int, typer.Option(min=1, help="Seconds between tries to take or renew the Lease.")]


@app.command()
def run(
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", help="Watch this namespace (repeatable). Default: all namespaces."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            dir_okay=False,
            help="Kubeconfig file. Default: in-cluster, else $KUBECONFIG.",
            show_default=False,
        ),
    ] = None,
    liveness: Annotated[
        str | None, typer.Option(help="Liveness endpoint, e.g. http://0.0.0.0:8080/healthz.", show_default=False)
    ] = None,
    resync_seconds: Annotated[
        float, typer.Option(min=1, help="Seconds between full resyncs (a safety net behind the watches).")
    ] = 300.0,
    metrics_port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, help="Serve Prometheus metrics on this port (/metrics).", show_default=False),
    ] = None,
    metrics_address: Annotated[str, typer.Option(help="Address the metrics port listens on.")] = "0.0.0.0",
    prometheus_address: PrometheusAddress = None,
    picker_image: PickerImage = RouterImages.picker,
    envoy_image: EnvoyImage = RouterImages.envoy,
    picker_inflight_tokens: PickerInflightTokens = RouterImages.picker_inflight_tokens,
    artifact_history_limit: ArtifactHistoryLimit = DEFAULT_ARTIFACT_HISTORY_LIMIT,
    neuron_devices: NeuronDevicesOption = "auto",
    simulated_start_time_scale: SimulatedStartTimeScale = 1.0,
    leader_election_namespace: LeaseNamespace = None,
    leader_election_lease: LeaseName = Election.lease,
    lease_duration_seconds: LeaseDuration = Election.lease_duration_s,
    renew_deadline_seconds: RenewDeadline = Election.renew_deadline_s,
    retry_period_seconds: RetryPeriod = Election.retry_period_s,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run the operator."""
    try:
        configuration = load_configuration(kubeconfig)
    except kubernetes.config.ConfigException as error:
        fail(f"cannot load Kubernetes credentials: {error}")
    election = None
    if leader_election_namespace is not None:
        election = Election(
            leader_election_namespace, leader_election_lease, lease_duration_seconds, renew_deadline_seconds,
            retry_period_seconds,
        )  # fmt: skip
        if (problem := election.problem()) is not None:
            fail(problem)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    metrics = OperatorMetrics()
    if metrics_port is not None:
        serve_metrics(metrics, metrics_address, metrics_port)
    try:
        asyncio.run(
            lead(
                configuration,
                election,
                liveness,
                namespaces=namespace or None,
                resync_seconds=resync_seconds,
                metrics=metrics,
                prometheus=prometheus_address,
                router_images=RouterImages(picker_image, envoy_image, picker_inflight_tokens),
                artifact_history_limit=artifact_history_limit,
                neuron_devices=neuron_devices,
                simulated_start_time_scale=simulated_start_time_scale,
            )
        )
    except LeaseUnavailable as error:
        fail(str(error))


@app.command()
def crds(
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory to write the CRDs into.")] = Path("crds"),
    check: Annotated[bool, typer.Option(help="Write nothing; exit 2 if the files differ from the models.")] = False,
) -> None:
    """Write the CustomResourceDefinitions generated from the API models."""
    stale = []
    for name, text in crdgen.files().items():
        path = output / name
        current = path.read_text() if path.is_file() else None
        if current == text:
            continue
        stale.append(str(path))
        if not check:
            output.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if check and stale:
        fail(f"out of date (run `neuronfleet-operator crds`): {', '.join(stale)}")
    for written in stale:
        out.print(f"wrote {written}")
