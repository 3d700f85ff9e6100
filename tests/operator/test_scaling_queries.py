"""The ScaledObject's look-ahead queries, evaluated by a real Prometheus (the one the rig builds) scraping three
replicas' exposition: each query equals the contract's formula on the series it selects.

Two replicas of the service and one of another service serve prometheus-client's exposition on loopback, the
engine's own series names; their device-busy counters grow while the test runs. Prometheus scrapes them every
second; once it holds a few samples, each query is evaluated at one instant beside the plain series it reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from neuronfleet.contract import metrics
from neuronfleet.contract.scaling import signal_lag_s, trend_floor, warm_floor
from neuronfleet.devcluster.process.managed import ManagedProcess, free_ports
from neuronfleet.devcluster.process.tools import ToolsMissingError, bin_dir
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.operator import api
from neuronfleet.operator.policy import scaling

NAMESPACE = "serving"
#: The replicas' prefill rate, pending prompt tokens, and published start by phase (the second is the slowest).
PREFILL_RATE = 20_000.0
PENDING = (3_000.0, 1_000.0)
STARTS = ({"fetch": 30.0, "load": 20.0, "warmup": 5.0}, {"fetch": 60.0, "load": 20.0})
#: The start the operator predicts, read before any replica publishes one.
PREDICTED_START_S = 316.0


@dataclass
class Replica:
    """One replica's exposition, as the engine serves it."""

    service: str
    port: int
    busy: Counter
    server: Any


def exporter(service: str, port: int, pending: float, start: dict[str, float] | None) -> Replica:
    registry = CollectorRegistry()
    Gauge(metrics.PREFILL_TOKENS_PENDING, "pending", registry=registry).set(pending)
    Gauge(metrics.PREFILL_TOKENS_PER_SECOND, "rate", registry=registry).set(PREFILL_RATE)
    if start is not None:
        phases = Gauge(metrics.REPLICA_START_SECONDS, "start", ["phase"], registry=registry)
        for phase, seconds in start.items():
            phases.labels(phase=phase).set(seconds)
    busy = Counter(metrics.DEVICE_BUSY_SECONDS, "busy", ["kind"], registry=registry)
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    return Replica(service, port, busy, server)


@dataclass
class Prometheus:
    """A real Prometheus scraping the replicas, and the instant the test evaluates at."""

    url: str

    def value(self, query: str, at: float) -> float | None:
        """The query's one sample at ``at`` (None for an empty result)."""
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": query, "time": f"{at:.3f}"}, timeout=5)
        answer.raise_for_status()
        result: list[dict[str, Any]] = answer.json()["data"]["result"]
        assert len(result) <= 1, f"{query} gave several series: {result}"
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = bin_dir("prometheus") / "prometheus"
    if not binary.is_file():
        raise ToolsMissingError(f"Prometheus is not built ({binary} is missing): run `make tools`")
    directory = tmp_path_factory.mktemp("prometheus")
    listen, *ports = free_ports(4)
    replicas = [
        exporter("llama", ports[0], PENDING[0], STARTS[0]),
        exporter("llama", ports[1], PENDING[1], STARTS[1]),
        # Another service's replica, busier and pending more: the queries must not count it.
        exporter("other", ports[2], 50_000.0, None),
    ]
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "engines",
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{r.port}"],
                        "labels": {"namespace": NAMESPACE, "neuronfleet_io_service": r.service},
                    }
                    for r in replicas
                ],
            }
        ],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    argv = [
        str(binary),
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{listen}",
        "--log.level=warn",
    ]
    process = ManagedProcess.spawn("prometheus", argv, directory / "prometheus.log")
    done = threading.Event()

    def work() -> None:
        # The replicas' devices busy 80%, 40% and (the other service) 100% of the time.
        while not done.wait(0.05):
            for replica, share in zip(replicas, (0.8, 0.4, 1.0), strict=True):
                replica.busy.labels(kind="prefill").inc(0.05 * share)

    busy = threading.Thread(target=work, daemon=True)
    busy.start()
    try:
        process.wait_ready(f"http://127.0.0.1:{listen}/-/ready", timeout=60, what="Prometheus ready")
        server = Prometheus(f"http://127.0.0.1:{listen}")
        counted = f"count_over_time({metrics.DEVICE_BUSY_SECONDS}_total[1m])"
        wait_for(
            lambda: server.value(f"min({counted})", time.time()),
            lambda least: least is not None and least >= 4 and server.value(f"count({counted})", time.time()) == 3,
            timeout=60,
            interval=0.5,
            what="four scrapes of every replica",
        )
        yield server
    finally:
        done.set()
        process.stop()
        for replica in replicas:
            replica.server.shutdown()


def autoscaling(**fields: Any) -> api.Autoscaling:
    spec = api.parse_service_spec({"model": {"uri": "hf://org/model"}, "autoscaling": {"maxReplicas": 8, **fields}})
    assert spec.autoscaling is not None
    return spec.autoscaling


def trigger_query(service: str, name: str, found: api.Autoscaling) -> str:
    triggers = scaling.triggers(NAMESPACE, service, found, "http://prometheus", start_s=PREDICTED_START_S)
    query: str = {t["name"]: t for t in triggers}[name]["metadata"]["query"]
    return query


def test_the_prefill_backlog_is_the_services_pending_tokens_over_its_prefill_rate(prometheus: Prometheus) -> None:
    query = trigger_query("llama", "prefill-backlog", autoscaling(prefillBacklogSeconds=0.5))
    assert prometheus.value(query, time.time()) == pytest.approx(sum(PENDING) / PREFILL_RATE)
    # A service with no replica reads 0: no replicas asked for.
    gone = trigger_query("gone", "prefill-backlog", autoscaling(prefillBacklogSeconds=0.5))
    assert prometheus.value(gone, time.time()) == 0


def test_the_warm_floor_is_the_contracts_formula_on_the_busy_rate_and_the_slowest_start(
    prometheus: Prometheus,
) -> None:
    found = autoscaling(warmFloor={"stepPercent": 50, "ttftSeconds": 1.5, "windowSeconds": 30})
    at = time.time()
    selector = f'{{namespace="{NAMESPACE}",neuronfleet_io_service="llama"}}'
    busy = prometheus.value(f"sum(rate({metrics.DEVICE_BUSY_SECONDS}_total{selector}[30s]))", at)
    # Seconds into a 30 s window, rate() reads a share of the replicas' 1.2 busy seconds a second: the same
    # share for the floor's query and this one.
    assert busy is not None
    assert busy > 0
    slowest = sum(STARTS[1].values())
    expected = warm_floor(busy, step=0.5, ttft_s=1.5, lag_s=signal_lag_s(slowest))
    assert prometheus.value(trigger_query("llama", "warm-floor", found), at) == pytest.approx(expected, rel=1e-9)
    assert expected > 1.5 * busy * 0.9, "the rise, barely discounted by a lag of minutes"


def test_a_trend_following_floor_projects_the_recent_rise_a_lag_ahead(prometheus: Prometheus) -> None:
    """An hour's window and its last 12 minutes: Prometheus holds under a minute of the counters, so the hour's
    rate reads a fifth of the 12 minutes' one, a steep rise, which the floor projects a lag ahead."""
    found = autoscaling(warmFloor={"stepPercent": 25, "ttftSeconds": 1.5, "windowSeconds": 3600, "followTrend": True})
    at = time.time()
    selector = f'{{namespace="{NAMESPACE}",neuronfleet_io_service="llama"}}'
    recent, window = (
        prometheus.value(f"sum(rate({metrics.DEVICE_BUSY_SECONDS}_total{selector}[{seconds}s]))", at)
        for seconds in (720, 3600)
    )
    assert recent is not None
    assert window is not None
    assert recent > 4 * window > 0, "a rise"
    slowest = sum(STARTS[1].values())
    expected = trend_floor(recent, window, window_s=3600, step=0.25, ttft_s=1.5, lag_s=signal_lag_s(slowest))
    assert prometheus.value(trigger_query("llama", "warm-floor", found), at) == pytest.approx(expected, rel=1e-9)
    assert expected > 1.25 * recent, "the rise is projected ahead"
    assert prometheus.value(trigger_query("gone", "warm-floor", found), at) == 0


def test_the_warm_floor_reads_the_predicted_start_until_a_replica_publishes_one(prometheus: Prometheus) -> None:
    """The other service's replica publishes no start: its floor's lag is the operator's prediction."""
    found = autoscaling(warmFloor={"ttftSeconds": 100, "windowSeconds": 30})
    at = time.time()
    selector = f'{{namespace="{NAMESPACE}",neuronfleet_io_service="other"}}'
    busy = prometheus.value(f"sum(rate({metrics.DEVICE_BUSY_SECONDS}_total{selector}[30s]))", at)
    assert busy is not None
    expected = warm_floor(busy, step=1.0, ttft_s=100, lag_s=signal_lag_s(PREDICTED_START_S))
    assert prometheus.value(trigger_query("other", "warm-floor", found), at) == pytest.approx(expected, rel=1e-9)
    assert prometheus.value(trigger_query("gone", "warm-floor", found), at) == 0
