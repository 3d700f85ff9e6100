"""The chart on the local control plane: installed with helm, the operator runs in-cluster from the image
built here, on the real node, under the chart's ServiceAccount, and takes a service to Ready on the KWOK
fleet; then what users see with kubectl.

The release lives in a namespace that enforces the restricted Pod Security Standard, and the chart
binds its role only there (watchNamespaces), so the operator has nothing but what the chart grants.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.cluster_fixtures import NodeImage
from harness.services import Services

from neuronfleet.contract.config import EngineConfig
from neuronfleet.devcluster.cluster.credentials import service_account_kubeconfig
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.controlplane.storage import artifact_volume
from neuronfleet.devcluster.demo import operator_release
from neuronfleet.devcluster.images.dockerfile import BuiltImage
from neuronfleet.devcluster.process.waiting import wait_for
from neuronfleet.operator.api import parse_service_spec
from neuronfleet.operator.cluster.kube import ARTIFACTS, Kube

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "neuronfleet"
EXAMPLE = ROOT / "examples" / "llama-3.1-8b-inf2.yaml"
RELEASE = operator_release.RELEASE

Obj = dict[str, Any]
Health = Callable[[str, Obj], dict[str, str]]


@dataclass
class Release:
    """The chart installed in one namespace, its operator running in a pod on the real node."""

    cluster: LocalCluster
    namespace: str
    #: The chart's ServiceAccount token, for asking what the operator may do.
    kubeconfig: Path
    image: BuiltImage
    notes: str

    @property
    def identity(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{RELEASE}"

    def kubectl(self, *args: str, as_operator: bool = False) -> subprocess.CompletedProcess[str]:
        """kubectl in the release's namespace, as admin or with the operator's credentials."""
        if not as_operator:
            return self.cluster.kubectl("--namespace", self.namespace, *args)
        return subprocess.run(
            [str(self.cluster.state.tools / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def operator_log(self) -> str:
        """The leading operator container's log, as the kubelet keeps it."""
        return ok(operator_release.leader_log(self.cluster, self.namespace))


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{result.args}: {result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def release(
    real_cluster: LocalCluster, node_image: NodeImage, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    image = node_image("operator")
    namespace = f"chart-{uuid.uuid4().hex[:8]}"
    ok(real_cluster.kubectl("create", "namespace", namespace))
    ok(real_cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted"))
    installed = operator_release.install(
        real_cluster, CHART, namespace, image.name, watch_namespaces=[namespace], resync_seconds=5
    )
    ok(installed)
    workdir = tmp_path_factory.mktemp("release")
    kubeconfig = service_account_kubeconfig(real_cluster, namespace, RELEASE, workdir / "operator.kubeconfig")
    installed_release = Release(real_cluster, namespace, kubeconfig, image, installed.stdout)
    try:
        yield installed_release
    finally:
        log = operator_release.leader_log(real_cluster, namespace, tail=60)
        print(f"--- operator log ---\n{log.stdout}{log.stderr}")
        real_cluster.helm("uninstall", RELEASE, "--namespace", namespace)
        real_cluster.kubectl("delete", "namespace", namespace, "--wait=false")


@pytest.fixture(scope="module")
def kube(real_cluster: LocalCluster) -> Iterator[Any]:
    """A ``kubernetes`` API client for the real cluster, as admin."""
    client = real_cluster.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def ready_service(release: Release, kube: Any, tmp_path_factory: pytest.TempPathFactory) -> Obj:
    """The 8B example, applied as a user would, taken to Ready by the operator under the chart's RBAC."""
    # Its pvc:// store's claim, as an admin provisions it (the operator has no rights on claims).
    claim = parse_service_spec(yaml.safe_load(EXAMPLE.read_text())["spec"]).compile.store_claim
    assert claim is not None
    directory = tmp_path_factory.mktemp("volume")
    volume = directory / "artifact-volume.yaml"
    volume.write_text(yaml.safe_dump_all(artifact_volume(release.namespace, claim, str(directory / "store"))))
    ok(release.cluster.kubectl("apply", "-f", str(volume)))
    ok(release.kubectl("apply", "--server-side", "-f", str(EXAMPLE)))
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    return Services(Kube(kube), release.namespace, wait_for).wait_ready(name, timeout=90)


def test_operator_reaches_ready_with_only_the_charts_rights(release: Release, ready_service: Obj) -> None:
    assert ready_service["status"]["readyReplicas"] == ready_service["spec"]["replicas"] == 2
    pods = json.loads(ok(release.kubectl("get", "pods", "-l", "app.kubernetes.io/name=neuronfleet", "-o", "json")))
    # Two operators ran in containers from the image built here, on the real node, as the chart's account.
    assert len(pods["items"]) == 2
    for pod in pods["items"]:
        assert pod["spec"]["nodeName"] == REAL_NODE
        assert pod["spec"]["serviceAccountName"] == RELEASE
        (status,) = pod["status"]["containerStatuses"]
        assert status["image"] == release.image.name
        assert status["ready"] is True
    # One of them leads, and only it reconciled; the other stands by, alive to its probe.
    leader = operator_release.leader(release.cluster, release.namespace)
    (standby,) = {p["metadata"]["name"] for p in pods["items"]} - {leader}
    waiting = ok(release.kubectl("logs", f"pod/{standby}", "--tail=-1"))
    assert f"standing by for Lease {release.namespace}/{RELEASE}" in waiting, waiting
    assert "leading" not in waiting, waiting
    assert "Handler" not in waiting, waiting
    whoami = ok(release.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", as_operator=True))
    assert whoami == release.identity
    # A verb the chart forgot shows up as a 403 somewhere, even where the operator carries on. The
    # pattern names the status, not a bare 403, which a log line's milliseconds can spell.
    log = release.operator_log()
    assert not re.search(r"forbidden|status=403|'code': 403", log, re.IGNORECASE), log[-3000:]


def can_i(
    release: Release, verb: str, resource: str, namespace: str | None = None, subresource: str | None = None
) -> bool:
    where = ["--namespace", namespace or release.namespace]
    # `kind/x` names an object x; a subresource needs the flag.
    only = [f"--subresource={subresource}"] if subresource else []
    answer = release.kubectl("auth", "can-i", verb, resource, *where, *only, as_operator=True)
    return answer.stdout.strip() == "yes"


def test_service_account_has_the_documented_rights_and_no_more(release: Release) -> None:
    allowed = [
        ("delete", "neuroncompiledartifacts.neuronfleet.io"),
        ("create", "jobs.batch"),
        ("delete", "configmaps"),
        ("create", "events"),
        # A service whose spec.routing goes loses its router: the Deployment, its Services, the picker's access.
        ("delete", "deployments.apps"),
        ("create", "roles.rbac.authorization.k8s.io"),
        # The leader election: its own Lease, in its own namespace.
        ("update", f"leases.coordination.k8s.io/{RELEASE}"),
    ]
    denied = [
        # A service's spec is its owner's: the operator writes only its status (and, autoscaled, its scale).
        ("patch", "neuroninferenceservices.neuronfleet.io"),
        ("update", "neuroninferenceservices.neuronfleet.io"),
        ("delete", "neuroninferenceservices.neuronfleet.io"),
        ("delete", "jobs.batch"),
        # The picker's Role grants only what the operator holds itself: no escalation, no binding of others'.
        ("escalate", "roles.rbac.authorization.k8s.io"),
        ("bind", "roles.rbac.authorization.k8s.io"),
        ("get", "secrets"),
        ("create", "pods"),
        ("get", "configmaps"),
        ("create", "customresourcedefinitions.apiextensions.k8s.io"),
        ("update", "leases.coordination.k8s.io/kube-scheduler"),
    ]
    assert [(v, r) for v, r in allowed if not can_i(release, v, r)] == []
    assert [(v, r) for v, r in denied if can_i(release, v, r)] == []
    assert can_i(release, "patch", "neuroninferenceservices.neuronfleet.io", subresource="status")
    # Bound to the watched namespace only.
    assert not can_i(release, "list", "neuroninferenceservices.neuronfleet.io", "default")


def test_operator_pod_passes_the_restricted_pod_security_standard(release: Release) -> None:
    deployment = yaml.safe_load(ok(release.kubectl("get", "deployment", RELEASE, "-o", "yaml")))
    # Admission would have refused the pod in this namespace (ReplicaSet FailedCreate) had it broken a rule.
    assert deployment["status"].get("availableReplicas") == deployment["spec"]["replicas"] == 2
    labels = yaml.safe_load(ok(release.kubectl("get", "namespace", release.namespace, "-o", "yaml")))
    assert labels["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_install_notes_tell_how_to_upgrade_the_crds(release: Release) -> None:
    assert "Before upgrading the chart, apply its CRDs" in release.notes
    assert "kubectl apply --server-side -f charts/neuronfleet/crds/" in release.notes
    assert f"the namespaces {release.namespace}" in release.notes


def test_rendered_manifests_pass_server_side_dry_run(release: Release, tmp_path: Path) -> None:
    """What `helm template` renders, with every option this cluster has the APIs for, is valid Kubernetes."""
    rendered = release.cluster.helm(
        "template",
        "dryrun",
        str(CHART),
        "--namespace",
        release.namespace,
        "--set",
        f"watchNamespaces={{{release.namespace}}}",
        "--set",
        "dashboard.enabled=true",
        "--set",
        "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::123456789012:role/neuronfleet",
        "--set",
        "verbose=true",
    )
    path = tmp_path / "rendered.yaml"
    path.write_text(ok(rendered))
    applied = ok(release.kubectl("apply", "--server-side", "--dry-run=server", "--validate=strict", "-f", str(path)))
    kinds = {line.split("/")[0] for line in applied.splitlines()}
    assert kinds >= {
        "serviceaccount",
        "clusterrole.rbac.authorization.k8s.io",
        "clusterrolebinding.rbac.authorization.k8s.io",
        "rolebinding.rbac.authorization.k8s.io",
        "deployment.apps",
        "configmap",
    }, applied
    assert all(line.endswith("(server dry run)") for line in applied.splitlines()), applied


def test_get_nis_shows_model_buckets_phase_and_replicas(release: Release, ready_service: Obj) -> None:
    table = ok(release.kubectl("get", "nis"))
    header, row = table.splitlines()
    columns = ["NAME", "MODEL", "BUCKETS", "PHASE", "READY", "DESIRED", "CURRENT", "HEALTH", "ARTIFACT", "AGE"]
    assert header.split() == columns
    name, model, buckets, phase, ready, desired, current, health, artifact, _age = row.split()
    assert (name, model) == (ready_service["metadata"]["name"], "hf://meta-llama/Llama-3.1-8B-Instruct")
    assert buckets == "[256,512,1024,2048,4096]"
    # Desired is status.desiredReplicas (spec.replicas or the autoscaler's), Current the serving pods.
    assert (phase, ready, desired, current) == ("Ready", "2", "2", "2")
    # The Degraded condition's reason: no Neuron fault holds a replica out.
    assert health == "Healthy"
    assert artifact == ready_service["status"]["artifact"]["name"]
    wide = ok(release.kubectl("get", "nis", "-o", "wide")).splitlines()[0].split()
    assert {"DECODE", "INSTANCE", "TP", "REVISION"} <= set(wide)


def test_get_neuron_lists_both_kinds(release: Release, ready_service: Obj) -> None:
    listed = ok(release.kubectl("get", "neuron", "-o", "name")).split()
    assert f"neuroninferenceservice.neuronfleet.io/{ready_service['metadata']['name']}" in listed
    assert f"neuroncompiledartifact.neuronfleet.io/{ready_service['status']['artifact']['name']}" in listed


def test_describe_tells_the_story_in_events(release: Release, ready_service: Obj) -> None:
    # The operator posts the Ready event just after the Ready status the fixture waited for.
    described = wait_for(
        lambda: ok(release.kubectl("describe", "nis", ready_service["metadata"]["name"])),
        lambda out: "Ready" in out.split("Events:", 1)[1],
        timeout=30,
        what="the Ready event",
    )
    events = described.split("Events:", 1)[1]
    reasons = [r for r in ("ArtifactCreated", "Compiling", "Compiled", "RollingOut", "Ready") if r in events]
    assert reasons == ["ArtifactCreated", "Compiling", "Compiled", "RollingOut", "Ready"], events
    # describe sorts by lastTimestamp, which has one-second resolution, so the order
    # is checked on creation order: the operator never updates its events, and this
    # etcd-backed apiserver hands out increasing resourceVersions.
    selector = f"involvedObject.name={ready_service['metadata']['name']}"
    listed = json.loads(ok(release.kubectl("get", "events", "-o", "json", "--field-selector", selector)))["items"]
    told = [e["reason"] for e in sorted(listed, key=lambda e: int(e["metadata"]["resourceVersion"]))]
    firsts = [told.index(r) for r in ("ArtifactCreated", "Compiled", "Ready")]
    assert firsts == sorted(firsts), told
    artifact = ok(release.kubectl("describe", "nca", ready_service["status"]["artifact"]["name"]))
    assert "CompileStarted" in artifact
    assert "compiled 9 buckets" in artifact


def test_explain_describes_every_engine_field(release: Release) -> None:
    explained = ok(release.kubectl("explain", "nis.spec.engine"))
    fields = re.findall(r"^  (\w+)\s+<", explained.split("FIELDS:", 1)[1], re.MULTILINE)
    assert sorted(fields) == sorted(EngineConfig.model_fields)
    for name, info in EngineConfig.model_fields.items():
        assert info.description, name
        # kubectl wraps long lines: compare the words.
        assert " ".join(info.description.split()[:6]) in " ".join(explained.split()), name


def test_argo_cd_health_of_the_live_objects(
    release: Release, ready_service: Obj, kube: Any, argo_health: Health
) -> None:
    assert argo_health("NeuronInferenceService", ready_service)["status"] == "Healthy"
    artifact = Kube(kube).get(ARTIFACTS, release.namespace, ready_service["status"]["artifact"]["name"])
    assert artifact is not None
    assert argo_health("NeuronCompiledArtifact", artifact)["status"] == "Healthy"
