"""The Helm chart as rendered: lint, schema, CRDs, pod security, RBAC against the docs, monitors, dashboard.

The same chart is installed on the local control plane and run under its RBAC in test_chart_cluster.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from prometheus_client import generate_latest

from neuronfleet.contract.names import LABEL_SERVICE, SERVICE_METRIC_LABEL
from neuronfleet.devcluster.addons.metrics import parse_samples
from neuronfleet.operator import crdgen, plan
from neuronfleet.operator.api import API_VERSION
from neuronfleet.operator.main import app
from neuronfleet.operator.metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "neuronfleet"

Obj = dict[str, Any]
Helm = Callable[..., subprocess.CompletedProcess[str]]
Render = Callable[..., list[Obj]]


def only(docs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}: {[d['metadata']['name'] for d in found]}"
    return found[0]


def test_helm_lint_strict(helm: Helm) -> None:
    linted = helm("lint", "--strict", str(CHART))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 chart(s) failed" in linted.stdout


@pytest.mark.parametrize(
    ("setting", "complaint"),
    [
        ("imagee.tag=1.0", "additional properties 'imagee' not allowed"),
        ("metrics.podMonitor.enabeld=true", "additional properties 'enabeld' not allowed"),
        ("serviceAccount.annotation.a=b", "additional properties 'annotation' not allowed"),
        ("resources.limits.gpu=1", "additional properties 'gpu' not allowed"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("watchNamespaces[0]=Not_A_Namespace", "watchNamespaces"),
        ("artifactHistoryLimit=11", "artifactHistoryLimit"),
        ("simulatedStartTimeScale=2", "simulatedStartTimeScale"),
        ("leaderElection.leaseSeconds=20", "additional properties 'leaseSeconds' not allowed"),
        ("replicas=0", "replicas"),
    ],
)
def test_schema_rejects_typos_and_bad_values(helm: Helm, setting: str, complaint: str) -> None:
    rendered = helm("template", "neuronfleet", str(CHART), "--set", setting)
    assert rendered.returncode != 0, f"--set {setting} was accepted"
    assert "values don't meet the specifications of the schema" in rendered.stderr
    assert complaint in rendered.stderr


def test_schema_closes_every_object() -> None:
    """additionalProperties: false wherever properties are listed, so any misspelt key fails."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_objects: list[str] = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            if "properties" in node and node.get("additionalProperties") is not False:
                open_objects.append(where)
            for key, child in node.items():
                walk(child, f"{where}/{key}")

    walk(schema, "")
    assert open_objects == []


def test_chart_crds_are_the_generated_ones() -> None:
    generated = crdgen.files()
    chart = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    repo = {p.name: p.read_text() for p in (ROOT / "crds").glob("*.yaml")}
    assert chart == repo == generated, "run `make crds`: it writes crds/ and the chart's copy"


def test_operator_pod_is_restricted_and_probed(render: Render) -> None:
    deployment = only(render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"].keys() == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    # The probe asks the endpoint the operator is told to serve.
    (liveness,) = [a for a in container["args"] if a.startswith("--liveness=")]
    port = int(re.fullmatch(r"--liveness=http://0\.0\.0\.0:(\d+)/healthz", liveness).group(1))  # type: ignore[union-attr]
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    (named,) = [p for p in container["ports"] if p["name"] == probe["port"]]
    assert named["containerPort"] == port
    assert container["command"] == ["neuronfleet-operator"]
    assert container["args"][0] == "run"
    # A read-only root filesystem: anything written goes to the mounted /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def documented_rbac() -> set[tuple[str, frozenset[str]]]:
    """docs/operator.md's "RBAC the operator uses" table: (resource, verbs) per resource."""
    text = (ROOT / "docs" / "operator.md").read_text()
    table = text.split("### RBAC the operator uses", 1)[1].split("\n\n", 2)[1]
    rules = set()
    for row in table.splitlines()[2:]:
        resources, verbs, _ = (cell.strip() for cell in row.strip("|").split("|"))
        for resource in re.findall(r"`([^`]+)`", resources):
            rules.add((resource, frozenset(v.strip() for v in verbs.split(","))))
    return rules


def granted(docs: list[Obj]) -> set[tuple[str, frozenset[str]]]:
    """(resource, verbs) per resource, over every ClusterRole and Role the chart renders."""
    verbs: dict[str, set[str]] = {}
    for role in (d for d in docs if d["kind"] in {"ClusterRole", "Role"}):
        for rule in role["rules"]:
            for resource in rule["resources"]:
                verbs.setdefault(resource, set()).update(rule["verbs"])
    return {(resource, frozenset(held)) for resource, held in verbs.items()}


AUTOSCALING = ("autoscaling.enabled=true", "autoscaling.prometheus.address=http://prometheus.monitoring:9090")


def test_rbac_grants_exactly_the_documented_verbs(render: Render) -> None:
    docs = render("watchNamespaces={llm}", *AUTOSCALING)
    assert granted(docs) == documented_rbac()
    # Cluster-wide, kopf does not scan namespaces; without autoscaling it has no ScaledObjects.
    unused = {
        ("namespaces", frozenset({"list", "watch"})),
        ("scaledobjects", frozenset({"create", "patch", "delete"})),
        ("neuroninferenceservices/scale", frozenset({"patch"})),
    }
    assert granted(render()) == documented_rbac() - unused
    for role in (d for d in docs if d["kind"] == "ClusterRole"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            # By name only where the object is cluster-scoped: the Neuron DRA driver's DeviceClass.
            assert rule.get("resourceNames", ["neuron.aws.com"]) == ["neuron.aws.com"], rule
            assert "resourceNames" not in rule or rule["resources"] == ["deviceclasses"], rule
    # Told how Neuron devices come, the operator asks the cluster nothing about them.
    assert granted(render("neuronDevices=devicePlugin")) == documented_rbac() - unused - {
        ("deviceclasses", frozenset({"get"}))
    }


def test_cluster_wide_by_default(render: Render) -> None:
    docs = render()
    bindings = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert bindings == {"neuronfleet-neuronfleet-system", "neuronfleet-neuronfleet-system-scan"}
    assert [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"] == []
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--namespace")]


def test_watch_namespaces_bind_the_role_only_there(render: Render) -> None:
    docs = render("watchNamespaces={llm,batch}")
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["roleRef"]["kind"] == "ClusterRole"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["batch", "llm"]
    assert {b["roleRef"]["name"] for b in bindings} == {"neuronfleet-neuronfleet-system"}
    # Only scanning (CRDs, namespaces) stays cluster-wide.
    (scan,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert scan["roleRef"]["name"] == "neuronfleet-neuronfleet-system-scan"
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=llm", "--namespace=batch"]
    subjects = {(s["name"], s["namespace"]) for b in bindings for s in b["subjects"]}
    assert subjects == {(only(docs, "ServiceAccount")["metadata"]["name"], "neuronfleet-system")}


def matches(selector: Obj, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions with Exists) against labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "Exists", expression
        if expression["key"] not in labels:
            return False
    return True


def test_monitors_scrape_the_engines_the_operator_runs(render: Render) -> None:
    assert [d for d in render() if d["apiVersion"].startswith("monitoring.coreos.com")] == [], "off by default"
    docs = render("metrics.podMonitor.enabled=true", "metrics.serviceMonitor.enabled=true", "watchNamespaces={llm}")
    owner = plan.Owner(API_VERSION, "NeuronInferenceService", "llama", "uid-1")
    pod_labels = plan.serving_labels("llama", "0123456789abcdef")
    service = plan.service(owner, "llm")
    pod_monitor, service_monitor = only(docs, "PodMonitor"), only(docs, "ServiceMonitor")

    assert matches(pod_monitor["spec"]["selector"], pod_labels)
    assert not matches(pod_monitor["spec"]["selector"], plan.artifact_labels("0123456789abcdef")), "compile pods"
    (endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")
    assert matches(service_monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    for monitor in (pod_monitor, service_monitor):
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}
        # The Prometheus operator turns the label into this one: what the ScaledObjects' queries select by.
        (copied,) = monitor["spec"]["podTargetLabels"]
        assert copied == LABEL_SERVICE
        assert re.sub(r"[^a-zA-Z0-9_]", "_", copied) == SERVICE_METRIC_LABEL


def test_the_operator_parses_every_argument_the_chart_passes_it(render: Render) -> None:
    rendered = render("artifactHistoryLimit=0", "simulatedStartTimeScale=0.01")
    (container,) = only(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    group = typer.main.get_command(app)
    name, *rest = container["args"]
    context = group.make_context("neuronfleet-operator", [name])
    command = group.get_command(context, name)  # type: ignore[attr-defined]
    params = command.make_context(name, rest, parent=context).params
    assert params["artifact_history_limit"] == 0
    assert params["simulated_start_time_scale"] == 0.01
    assert params["resync_seconds"] == 300
    assert (params["leader_election_lease"], params["lease_duration_seconds"]) == ("neuronfleet", 15)


def test_two_operators_elect_one_leader_on_a_lease_only_they_may_renew(render: Render) -> None:
    docs = render()
    deployment = only(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    # A new pod stands by before the old one goes: it releases the Lease on its way out.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {
        "--leader-election-namespace=neuronfleet-system",
        "--leader-election-lease=neuronfleet",
        "--lease-duration-seconds=15",
        "--renew-deadline-seconds=10",
        "--retry-period-seconds=2",
    } <= set(container["args"])
    (spread,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert spread["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    # The Lease's rights: in the release's namespace, renewing only its own Lease.
    role = only(docs, "Role")
    assert role["metadata"]["namespace"] == "neuronfleet-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["neuronfleet"],
            "verbs": ["get", "update"],
        },
    ]
    # A drain takes one at a time.
    budget = only(docs, "PodDisruptionBudget")
    assert budget["spec"] == {"maxUnavailable": 1, "selector": deployment["spec"]["selector"]}
    binding = only(docs, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_without_leader_election_one_operator_runs_and_more_are_refused(render: Render, helm: Helm) -> None:
    docs = render("leaderElection.enabled=false", "replicas=1")
    deployment = only(docs, "Deployment")
    assert (deployment["spec"]["replicas"], deployment["spec"]["strategy"]) == (1, {"type": "Recreate"})
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--leader-election")]
    assert [d for d in docs if d["kind"] in {"Role", "RoleBinding", "PodDisruptionBudget"}] == []
    assert "affinity" not in deployment["spec"]["template"]["spec"]
    both = helm("template", "neuronfleet", str(CHART), "--set", "leaderElection.enabled=false")
    assert both.returncode != 0
    assert "replicas 2 needs leaderElection.enabled" in both.stderr


def test_autoscaling_passes_the_prometheus_address_and_needs_one(render: Render, helm: Helm) -> None:
    (container,) = only(render(*AUTOSCALING), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--prometheus-address=http://prometheus.monitoring:9090" in container["args"]
    (plain,) = only(render(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not any(arg.startswith("--prometheus-address") for arg in plain["args"])
    missing = helm("template", "neuronfleet", str(CHART), "--set", "autoscaling.enabled=true")
    assert missing.returncode != 0
    assert "autoscaling.prometheus.address is required when autoscaling.enabled" in missing.stderr


def test_operator_metrics_are_served_on_a_named_port_and_scraped_by_their_own_monitor(render: Render) -> None:
    docs = render("metricsPort=9191", "metrics.operatorPodMonitor.enabled=true")
    deployment = only(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=9191" in container["args"]
    (port,) = [p for p in container["ports"] if p["name"] == "metrics"]
    assert port["containerPort"] == 9191
    monitor = only(docs, "PodMonitor")
    assert monitor["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert matches(monitor["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    # It selects the operator, not the engines.
    assert not matches(monitor["spec"]["selector"], plan.serving_labels("llama", "0123456789abcdef"))
    assert [d["kind"] for d in render() if d["kind"] == "PodMonitor"] == [], "off by default"


#: What the engine exports: vLLM's own series (the names its server publishes) and the Neuron
#: scheduler's, which neuronfleet.engine.scheduler.metrics writes (prometheus_client adds _total).
VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
}
NEURONFLEET_METRICS = {
    "neuronfleet:padding_tokens_total",
    "neuronfleet:padding_tokens_by_bucket_total",
    "neuronfleet:prefill_steps_total",
    "neuronfleet:decode_steps_total",
    "neuronfleet:decode_padding_seqs_total",
    "neuronfleet:kv_admission_deferrals_total",
}
#: The operator's own series (operator/src/neuronfleet/operator/metrics.py).
OPERATOR_METRICS = {
    "neuronfleet_operator_reconciles_total",
    "neuronfleet_operator_reconcile_duration_seconds_bucket",
    "neuronfleet_operator_objects",
    "neuronfleet_operator_compiles_total",
}


def exported_by_the_operator() -> set[str]:
    """Every series name the operator's metrics produce once each has a sample."""
    metrics = OperatorMetrics()
    with metrics.reconciling("NeuronInferenceService"):
        ended = {"phase": "Ready", "job": "a-compile"}
        metrics.status_written("NeuronCompiledArtifact", "ns", "a", {"phase": "Compiling"}, ended)
    return {name for name, _ in parse_samples(generate_latest(metrics.registry).decode())}


#: Compile Jobs, from kube-state-metrics.
KUBE_STATE_METRICS = {
    "kube_job_status_start_time",
    "kube_job_status_completion_time",
    "kube_job_status_active",
    "kube_job_status_failed",
}


def test_dashboard_plots_what_the_engine_exports(render: Render) -> None:
    assert [d for d in render() if d["kind"] == "ConfigMap"] == [], "off by default"
    config = only(render("dashboard.enabled=true", "dashboard.namespace=monitoring"), "ConfigMap")
    assert config["metadata"]["namespace"] == "monitoring"
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["neuronfleet.json"])
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels}
    pattern = r"\b(?:vllm|neuronfleet):[a-z_]+|\bkube_[a-z_]+|\bneuronfleet_operator_[a-z_]+"
    used = {m for expr in exprs.values() for m in re.findall(pattern, expr)}
    known = VLLM_METRICS | NEURONFLEET_METRICS | KUBE_STATE_METRICS | OPERATOR_METRICS
    assert used <= known, used - known
    assert used >= OPERATOR_METRICS, OPERATOR_METRICS - used
    assert exported_by_the_operator() >= OPERATOR_METRICS, "the dashboard names series the operator lacks"
    # The panels: requests, TTFT, ITL, padding waste per bucket, KV usage; compile durations.
    wanted = {
        "Requests": "vllm:num_requests_running",
        "Time to first token": "vllm:time_to_first_token_seconds_bucket",
        "Inter-token latency": "vllm:inter_token_latency_seconds_bucket",
        "Prefill padding per bucket": "neuronfleet:padding_tokens_by_bucket_total",
        "KV cache usage": "vllm:kv_cache_usage_perc",
        "Compile durations": "kube_job_status_completion_time",
        "Services by phase": "neuronfleet_operator_objects",
        "Reconcile latency": "neuronfleet_operator_reconcile_duration_seconds_bucket",
    }
    for title, metric in wanted.items():
        assert metric in exprs[title], title
    assert "by (bucket)" in exprs["Prefill padding per bucket"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_metrics_port_must_not_be_the_liveness_port(helm: Helm) -> None:
    rendered = helm("template", "neuronfleet", str(CHART), "--set", "metricsPort=8080", "--set", "livenessPort=8080")
    assert rendered.returncode != 0
    assert "metricsPort and livenessPort must differ, both are 8080" in rendered.stderr
