"""The operator on a real control plane with fake Neuron nodes: compile, roll out, share, fail, resume."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import yaml
from harness.services import Services, is_ready, sample, serving_pods

from neuronfleet.contract.names import GROUP, LABEL_ARTIFACT, LABEL_SERVICE
from neuronfleet.devcluster.addons.metrics import Samples
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.kwok import COMPLETE_AFTER_ANNOTATION, FAIL_ANNOTATION, READY_AFTER_ANNOTATION
from neuronfleet.devcluster.controlplane.status import condition, observed, phase_of
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator import crdgen, plan
from neuronfleet.operator.cluster.kube import ARTIFACTS, CONFIGMAPS, DEPLOYMENTS, JOBS, SERVICES_NIS, Kube
from neuronfleet.operator.reconcilers import Manager

# The operator's fixtures (`api`, `operator`, `services`), for the modules that run it alone.
pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]

MODEL = {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"}
DECODE_A = [1, 2, 4, 8]
DECODE_B = [2, 8]


def spec(**overrides: Any) -> Obj:
    """A small service: TP 4 (one Trainium2 device per replica), compiled into an S3 prefix."""
    base: Obj = {
        "model": MODEL,
        "engine": {"max_num_seqs": 8, "num_seqs_buckets": DECODE_A, "tensor_parallel_size": 4},
        "replicas": 2,
        "compile": {"artifactStore": "s3://neuronfleet-test/neff", "resources": {"cpu": "1", "memory": "1Gi"}},
        "drain": {"preStopSeconds": 1, "drainTimeoutSeconds": 5},
    }
    return merge(base, overrides)


def merge(base: Obj, extra: Obj) -> Obj:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        merged[key] = (
            merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) else value
        )
    return merged


def compile_jobs(api: Kube, namespace: str) -> list[Obj]:
    return api.list(JOBS, namespace, LABEL_ARTIFACT)


def template_hash(api: Kube, namespace: str, name: str) -> str | None:
    deployment = api.get(DEPLOYMENTS, namespace, name)
    return None if deployment is None else deployment["spec"]["template"]["metadata"]["labels"][LABEL_ARTIFACT]


def artifact_hash(service: Obj) -> str:
    return str(service["status"]["artifact"]["hash"])


def ready(services: Services, name: str, generation: int = 1) -> Obj:
    return services.wait_ready(name, generation)


def test_apply_compiles_then_rolls_out_on_trn2_nodes(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, cluster: LocalCluster, wait_for: WaitFor
) -> None:
    services.create("llama", spec(compile={"podAnnotations": {COMPLETE_AFTER_ANNOTATION: "3s"}}))

    compiling = services.wait_phase("llama", "Compiling")
    assert condition(compiling, "Validated")["status"] == "True"
    assert condition(compiling, "ArtifactReady")["reason"] == "Compiling"
    (artifact,) = services.artifacts()
    assert artifact["metadata"]["name"] == compiling["status"]["artifact"]["name"]
    (job,) = wait_for(lambda: compile_jobs(api, namespace), what="the compile Job")
    assert job["metadata"]["name"] == plan.compile_job_name(artifact["metadata"]["name"])
    assert job["metadata"]["ownerReferences"][0]["uid"] == artifact["metadata"]["uid"]
    assert api.get(DEPLOYMENTS, namespace, "llama") is None, "rolled out before the artifact was compiled"

    done = ready(services, "llama")
    status = done["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Validated": "True",
        "ArtifactReady": "True",
        "Available": "True",
        "Ready": "True",
        # This cluster serves no InferencePool: the condition says so, and the service serves all the same.
        "Routing": "False",
        "Degraded": "False",
    }
    assert condition(done, "Degraded")["reason"] == "Healthy"
    assert condition(done, "Routing")["reason"] == "InferencePoolUnavailable"
    assert (status["replicas"], status["readyReplicas"], status["updatedReplicas"]) == (2, 2, 2)
    assert status["currentRevision"] == status["targetRevision"] == artifact_hash(done)

    pods = serving_pods(api, namespace, "llama")
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"].startswith("trn2-"), pod["spec"]["nodeName"]
        assert pod["metadata"]["labels"][LABEL_ARTIFACT] == artifact_hash(done)
        assert pod["spec"]["containers"][0]["resources"]["limits"]["aws.amazon.com/neuron"] == "1"
    assert api.get(SERVICES_NIS, namespace, "llama") is not None
    nca = api.get(ARTIFACTS, namespace, artifact["metadata"]["name"])
    assert nca is not None
    assert nca["status"]["phase"] == "Ready"
    assert nca["status"]["location"] == f"s3://neuronfleet-test/neff/{artifact_hash(done)}"

    # Settled: full resyncs after Ready write nothing (the operator's writes do not feed back).
    def versions() -> list[str]:
        kinds = (SERVICES_NIS, ARTIFACTS, DEPLOYMENTS, CONFIGMAPS)
        return sorted(o["metadata"]["resourceVersion"] for kind in kinds for o in api.list(kind, namespace))

    before, passes = versions(), operator.resyncs()
    # The second pass from now started after this snapshot.
    wait_for(operator.resyncs, lambda done: done >= passes + 2, what="two full resyncs", timeout=30)
    assert versions() == before

    listing = cluster.kubectl("get", "nis,nca", "-n", namespace)
    described = cluster.kubectl("describe", "nis", "llama", "-n", namespace)
    print(f"$ kubectl get nis,nca\n{listing.stdout}\n$ kubectl describe nis llama\n{described.stdout}")
    assert listing.returncode == 0, listing.stderr
    (nis_line,) = [line for line in listing.stdout.splitlines() if line.startswith("neuroninferenceservice")]
    assert nis_line.split()[1:5] == ["hf://meta-llama/Llama-3.1-8B", "Ready", "2", "2"]
    for reason in ("ArtifactCreated", "Compiling", "RollingOut", "Ready"):
        assert reason in described.stdout, f"no {reason} event in kubectl describe"


def test_same_identity_shares_one_artifact_and_one_job(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    first = services.create("chat", spec())
    # Different replicas, resources and rollout: the same compile identity.
    second = services.create("batch", spec(replicas=1, resources={"cpu": "2"}, rollout={"maxSurge": 2}))
    ready(services, "chat")
    ready(services, "batch")

    (artifact,) = services.artifacts()
    owners = {ref["uid"] for ref in artifact["metadata"]["ownerReferences"]}
    assert owners == {first["metadata"]["uid"], second["metadata"]["uid"]}
    assert len(compile_jobs(api, namespace)) == 1

    # Deleting one user keeps the artifact for the other; deleting the last lets it go.
    api.delete(SERVICES_NIS, namespace, "chat")
    wait_for(
        lambda: services.artifacts()[0]["metadata"]["ownerReferences"],
        lambda refs: [r["uid"] for r in refs] == [second["metadata"]["uid"]],
        what="the deleted service's reference to be dropped",
    )
    assert phase_of(services.get("batch")) == "Ready"
    api.delete(SERVICES_NIS, namespace, "batch")
    wait_for(
        lambda: (services.artifacts(), compile_jobs(api, namespace)),
        lambda seen: seen == ([], []),
        what="the artifact and its Job to be garbage-collected with their last service",
        show=lambda seen: [[o["metadata"]["name"] for o in group] for group in seen],
    )


def test_a_bucket_change_compiles_while_the_old_revision_serves_then_surges_and_a_rollback_needs_no_compile(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    services.create("llama", spec(podAnnotations={READY_AFTER_ANNOTATION: "1s"}))
    old = artifact_hash(ready(services, "llama"))

    services.patch_spec(
        "llama",
        {
            "engine": {"num_seqs_buckets": DECODE_B},
            "compile": {"podAnnotations": {COMPLETE_AFTER_ANNOTATION: "4s"}},
        },
    )
    compiling = services.wait(
        "llama", lambda b: observed(b) and phase_of(b) == "Compiling", "compiling the new buckets"
    )
    new = artifact_hash(compiling)
    assert new != old
    assert "keeps serving" in condition(compiling, "Ready")["message"]
    assert compiling["status"]["readyReplicas"] == 2
    assert template_hash(api, namespace, "llama") == old, "the pod template changed before the compile finished"
    # The artifact's own handler creates its Job, maybe after the service's status says Compiling.
    jobs = wait_for(lambda: compile_jobs(api, namespace), lambda found: len(found) >= 2, what="the new compile Job")
    assert len(jobs) == 2

    seen: list[tuple[int, int, set[str]]] = []

    def observe() -> Obj:
        pods = serving_pods(api, namespace, "llama")
        seen.append(
            (
                sum(1 for p in pods if is_ready(p)),
                len(pods),
                {p["metadata"]["labels"][LABEL_ARTIFACT] for p in pods},
            )
        )
        return services.get("llama")

    done = wait_for(
        observe,
        lambda b: phase_of(b) == "Ready" and b["status"]["currentRevision"] == new,
        timeout=90,
        interval=0.1,
        what="the surge rollout to the new revision",
        show=lambda b: (b["status"]["phase"], seen[-3:]),
    )
    assert min(ready_count for ready_count, _, _ in seen) >= 2, f"dropped below 2 ready replicas: {seen}"
    assert max(total for _, total, _ in seen) <= 3, f"more than maxSurge=1 extra pods: {seen}"
    assert any(hashes == {old, new} for _, _, hashes in seen), "never saw old and new pods side by side"
    assert {p["metadata"]["labels"][LABEL_ARTIFACT] for p in serving_pods(api, namespace, "llama")} == {new}
    assert done["status"]["targetRevision"] == new

    # The old engine configuration goes once nothing runs it; the old artifact stays for a rollback.
    def kept() -> tuple[list[str], list[str]]:
        return (
            sorted(a["metadata"]["labels"][LABEL_ARTIFACT] for a in services.artifacts()),
            sorted(
                c["metadata"]["labels"][LABEL_ARTIFACT]
                for c in api.list(CONFIGMAPS, namespace, "neuronfleet.io/service=llama")
            ),
        )

    wait_for(kept, lambda now: now == (sorted([old, new]), [new]), what="the old ConfigMap released")
    assert services.get("llama")["status"]["previousRevisions"] == [old]
    (old_artifact,) = [a for a in services.artifacts() if a["metadata"]["labels"][LABEL_ARTIFACT] == old]

    # A rollback: the old buckets again. Its artifact is still Ready, so it rolls out at once, no compile.
    reverted_at = time.monotonic()
    services.patch_spec("llama", {"engine": {"num_seqs_buckets": DECODE_A}})
    phases: list[str] = []

    def observe_phase() -> Obj:
        body = services.get("llama")
        phases.append((phase_of(body) if observed(body) else None) or "(not observed)")
        return body

    back = wait_for(
        observe_phase,
        lambda b: observed(b) and phase_of(b) == "Ready" and b["status"]["currentRevision"] == old,
        timeout=90,
        interval=0.1,
        what="the rollback to the old revision",
    )
    print(f"    rollback to a kept artifact: Ready on it {time.monotonic() - reverted_at:.1f} s after the revert")
    assert not {"Compiling", "Pending"} & set(phases), phases
    assert len(compile_jobs(api, namespace)) == 2
    assert [
        a["metadata"]["uid"] for a in services.artifacts() if a["metadata"]["name"] == old_artifact["metadata"]["name"]
    ] == [old_artifact["metadata"]["uid"]]
    assert back["status"]["previousRevisions"] == [new]

    # No history: the artifact it moved away from goes as soon as nothing runs it.
    services.patch_spec("llama", {"rollout": {"artifactHistoryLimit": 0}})
    wait_for(kept, lambda now: now == ([old], [old]), what="the replaced artifact released")


def test_a_serving_only_change_rolls_the_pods_without_a_compile_and_a_lora_slot_change_compiles(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    services.create("llama", spec(replicas=1, lora={"maxLoras": 2}))
    artifact = artifact_hash(ready(services, "llama"))
    (old_config,) = api.list(CONFIGMAPS, namespace, f"{LABEL_SERVICE}=llama")
    old_pods = {p["metadata"]["name"] for p in serving_pods(api, namespace, "llama")}

    # A scheduler option and a LoRA adapter: both only served, neither compiled.
    adapter = {"name": "fr", "source": "/var/lib/adapters/fr"}
    services.patch_spec(
        "llama",
        {"engine": {"scheduler": {"max_consecutive_prefill_steps": 4}}, "lora": {"maxLoras": 2, "adapters": [adapter]}},
    )
    done = wait_for(
        lambda: (services.get("llama"), serving_pods(api, namespace, "llama")),
        lambda seen: (
            phase_of(seen[0]) == "Ready"
            and observed(seen[0])
            and {p["metadata"]["name"] for p in seen[1]}.isdisjoint(old_pods)
        ),
        what="new pods with the new engine configuration",
        show=lambda seen: (phase_of(seen[0]), [p["metadata"]["name"] for p in seen[1]]),
    )
    assert artifact_hash(done[0]) == artifact
    assert len(compile_jobs(api, namespace)) == 1, "a serving-only change recompiled"
    # Handled with no record of Kopf's on the service (no patch of it): its status's observedGeneration is the record.
    assert [key for key in done[0]["metadata"].get("annotations") or {} if key.startswith(f"{GROUP}/")] == []
    (new_config,) = wait_for(
        lambda: api.list(CONFIGMAPS, namespace, f"{LABEL_SERVICE}=llama"),
        lambda configs: len(configs) == 1 and configs[0]["metadata"]["name"] != old_config["metadata"]["name"],
        what="the old engine ConfigMap to be removed after the rollout",
        show=lambda configs: [c["metadata"]["name"] for c in configs],
    )
    assert "max_consecutive_prefill_steps: 4" in new_config["data"]["engine.yaml"]
    (pod,) = done[1]
    (engine,) = pod["spec"]["containers"]
    assert "fr=/var/lib/adapters/fr" in engine["args"][engine["args"].index("--lora-adapter") + 1]
    assert {"name": "lora-fr", "mountPath": "/var/lib/adapters/fr", "readOnly": True} in engine["volumeMounts"]

    # More slots are other graphs: a new artifact compiles while the adapter's revision serves.
    services.patch_spec("llama", {"lora": {"maxLoras": 4}})
    services.wait("llama", lambda b: observed(b) and artifact_hash(b) != artifact, "a new artifact for 4 LoRA slots")
    wait_for(lambda: compile_jobs(api, namespace), lambda jobs: len(jobs) == 2, what="the compile Job of the slots")


def test_failed_compile_blocks_while_the_old_revision_keeps_serving(
    services: Services,
    operator: OperatorProcess,
    api: Kube,
    namespace: str,
    cluster: LocalCluster,
    wait_for: WaitFor,
) -> None:
    services.create("llama", spec())
    old = artifact_hash(ready(services, "llama"))

    services.patch_spec(
        "llama",
        {
            "engine": {"num_seqs_buckets": DECODE_B},
            "compile": {"backoffLimit": 0, "podAnnotations": {FAIL_ANNOTATION: "true"}},
        },
    )
    blocked = services.wait_phase("llama", "Blocked")
    reason = condition(blocked, "Ready")
    assert reason["reason"] == "BlockedByFailedCompile"
    assert "BackoffLimitExceeded" in reason["message"]
    assert f"revision {old} keeps serving" in reason["message"]
    assert condition(blocked, "ArtifactReady")["reason"] == "CompileFailed"
    assert condition(blocked, "Available")["status"] == "True"
    assert blocked["status"]["readyReplicas"] == 2
    assert template_hash(api, namespace, "llama") == old
    assert sum(1 for p in serving_pods(api, namespace, "llama") if is_ready(p)) == 2
    failed = next(a for a in services.artifacts() if a["metadata"]["labels"][LABEL_ARTIFACT] != old)
    assert failed["status"]["phase"] == "Failed"
    assert failed["status"]["reason"] == "BackoffLimitExceeded"
    described = cluster.kubectl("describe", "nis", "llama", "-n", namespace).stdout
    assert "BlockedByFailedCompile" in described
    samples = wait_for(
        operator.metrics,
        lambda s: sample(s, "neuronfleet_operator_objects", kind=SERVICES_NIS.kind, phase="Blocked") == 1,
        what="the service counted Blocked",
    )
    assert sample(samples, "neuronfleet_operator_compiles_total", outcome="Failed") == 1
    assert sample(samples, "neuronfleet_operator_compiles_total", outcome="Ready") == 1

    # Reverting the spec serves the old revision again and lets the failed artifact go.
    services.patch_spec("llama", {"engine": {"num_seqs_buckets": DECODE_A}, "compile": {"podAnnotations": None}})
    back = ready(services, "llama", generation=3)
    assert artifact_hash(back) == old
    assert back["status"]["currentRevision"] == old


def test_the_operator_exports_its_reconciles_compiles_and_phases(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    nis, nca = SERVICES_NIS.kind, ARTIFACTS.kind
    services.create("llama", spec(replicas=1))
    ready(services, "llama")
    # The phase is counted just after the status write that a client may already have seen.
    samples = wait_for(
        operator.metrics,
        lambda s: sample(s, "neuronfleet_operator_objects", kind=nis, phase="Ready") == 1,
        what="the service counted Ready",
    )
    assert sample(samples, "neuronfleet_operator_objects", kind=nis, phase="Compiling") == 0
    assert sample(samples, "neuronfleet_operator_objects", kind=nca, phase="Ready") == 1
    assert sample(samples, "neuronfleet_operator_compiles_total", outcome="Ready") == 1
    # Compiling, RollingOut and Ready were each written by a reconcile, and each was timed.
    assert sample(samples, "neuronfleet_operator_reconciles_total", kind=nis, outcome="ok") >= 3
    assert sample(samples, "neuronfleet_operator_reconcile_duration_seconds_count", kind=nis) >= 3

    assert api.delete(SERVICES_NIS, namespace, "llama")
    wait_for(
        operator.metrics,
        lambda s: sample(s, "neuronfleet_operator_objects", kind=nis, phase="Ready") == 0,
        what="the deleted service to leave the operator's phase counts",
    )


def test_operator_killed_mid_compile_resumes_without_a_second_job(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    services.create("llama", spec(compile={"podAnnotations": {COMPLETE_AFTER_ANNOTATION: "4s"}}))
    services.wait_phase("llama", "Compiling")
    (job,) = wait_for(lambda: compile_jobs(api, namespace), what="the compile Job")
    operator.kill()

    # The Job finishes while nobody watches.
    wait_for(
        lambda: compile_jobs(api, namespace),
        lambda jobs: len(jobs) == 1 and jobs[0].get("status", {}).get("succeeded") == 1,
        what="the compile Job to finish without the operator",
        show=lambda jobs: [j.get("status") for j in jobs],
    )
    assert phase_of(services.get("llama")) == "Compiling"

    operator.start(wait_for)
    done = ready(services, "llama")
    (after,) = compile_jobs(api, namespace)
    assert after["metadata"]["uid"] == job["metadata"]["uid"], "the Job was created again"
    assert done["status"]["readyReplicas"] == 2

    # The restarted operator counts the compile it found ended; a later one reads Ready back and does not.
    def compiled(s: Samples) -> float:
        return sample(s, "neuronfleet_operator_compiles_total", outcome="Ready")

    wait_for(operator.metrics, lambda s: compiled(s) == 1, what="the compile counted once", show=compiled)
    operator.stop()
    operator.start(wait_for)
    samples = wait_for(
        operator.metrics,
        lambda s: sample(s, "neuronfleet_operator_objects", kind=ARTIFACTS.kind, phase="Ready") == 1,
        what="the artifact reconciled after the restart",
    )
    assert compiled(samples) == 0


def test_not_enough_neuron_devices_says_so_and_scaling_down_recovers(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, cluster: LocalCluster
) -> None:
    # The fleet has one inf2.48xlarge (12 devices): a second 12-device replica cannot fit.
    services.create("big", spec(instanceType="inf2.48xlarge", engine={"tensor_parallel_size": 24}, replicas=2))
    # One replica serves (Available), the other waits for devices (not Ready).
    stuck = services.wait(
        "big",
        lambda b: phase_of(b) == "Unschedulable" and condition(b, "Available").get("status") == "True",
        "one replica serving, one unschedulable",
    )
    reason = condition(stuck, "Ready")
    assert reason["reason"] == "InsufficientNeuronCapacity"
    assert "Insufficient aws.amazon.com/neuron" in reason["message"]

    scaled = cluster.kubectl("scale", "nis/big", "--replicas=1", "-n", namespace)
    assert scaled.returncode == 0, scaled.stderr
    ready(services, "big", generation=2)
    assert len(compile_jobs(api, namespace)) == 1, "scaling recompiled"


def test_spec_past_admission_is_invalid_in_status_with_no_children(
    crds: Path,
    services: Services,
    operator: OperatorProcess,
    api: Kube,
    namespace: str,
    cluster: LocalCluster,
    tmp_path: Path,
    wait_for: WaitFor,
) -> None:
    # An older CRD without the bucket rules lets an invalid spec in: the operator must still refuse it.
    (kind,) = [k for k in crdgen.KINDS if k.kind == "NeuronInferenceService"]
    lax = crdgen.crd(kind)
    engine = lax["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["engine"]
    engine.pop("x-kubernetes-validations")
    lax_file = tmp_path / "lax.yaml"
    lax_file.write_text(yaml.safe_dump(lax))
    invalid = spec(engine={"num_seqs_buckets": [1, 2, 4]})
    try:
        assert cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(lax_file)).returncode == 0
        wait_for(lambda: services.create("legacy", invalid), timeout=30, what="the lax CRD to admit the spec")
    finally:
        restored = cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
        assert restored.returncode == 0, restored.stderr

    refused = services.wait(
        "legacy", lambda b: observed(b) and phase_of(b) == "Invalid", "Validated=False from the operator"
    )
    validated = condition(refused, "Validated")
    assert (validated["status"], validated["reason"]) == ("False", "InvalidBuckets")
    assert validated["message"] == (
        "spec.engine.num_seqs_buckets: Last bucket in num_seqs_buckets must equal max_num_seqs (8), got 4"
    )
    assert services.artifacts() == []
    assert api.get(DEPLOYMENTS, namespace, "legacy") is None

    fixed = wait_for(
        lambda: services.patch_spec("legacy", {"engine": {"num_seqs_buckets": DECODE_A}}),
        timeout=30,
        what="the fix to be admitted",
    )
    ready(services, "legacy", generation=fixed["metadata"]["generation"])


def test_an_event_handler_retries_a_refused_request_without_waiting_for_a_resync(
    services: Services, api: Kube, namespace: str, cluster: LocalCluster, wait_for: WaitFor, tmp_path: Path
) -> None:
    # No full resync within the test: only the handler's own retry can recover.
    operator = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path, resync_seconds=3600)
    operator.start(wait_for)
    try:
        services.create("llama", spec(replicas=1))
        ready(services, "llama")
        (artifact,) = services.artifacts()
        # A quota the operator does not watch: lifting it wakes no handler. Until the quota controller
        # counts custom resources (its discovery lags), admission refuses every create it covers.
        quotas = f"/api/v1/namespaces/{namespace}/resourcequotas"
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "no-artifacts"},
            "spec": {"hard": {f"count/{ARTIFACTS.plural}.{ARTIFACTS.group}": "0"}},
        }
        api.request("POST", quotas, body=quota)

        def refused(samples: Samples) -> float:
            return sample(samples, "neuronfleet_operator_reconciles_total", kind=SERVICES_NIS.kind, outcome="error")

        before = refused(operator.metrics())
        assert api.delete(ARTIFACTS, namespace, artifact["metadata"]["name"])
        # The artifact's DELETED event reconciles its service, whose new artifact the quota refuses.
        wait_for(operator.metrics, lambda s: refused(s) > before, what="the quota refusing the artifact", show=refused)
        assert services.artifacts() == []

        api.request("DELETE", f"{quotas}/no-artifacts")
        (again,) = wait_for(services.artifacts, what="the artifact created again by the retry", timeout=30)
        assert again["metadata"]["uid"] != artifact["metadata"]["uid"]
        # The service's ArtifactReady is still the first artifact's: wait for the new one's own phase.
        wait_for(
            lambda: api.get(ARTIFACTS, namespace, again["metadata"]["name"]) or {},
            lambda found: (
                found.get("metadata", {}).get("uid") == again["metadata"]["uid"] and phase_of(found) == "Ready"
            ),
            what="the recreated artifact compiled",
        )
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(60)}")


def test_the_reconciler_keeps_no_lock_for_objects_it_is_not_reconciling(
    services: Services, api: Kube, namespace: str
) -> None:
    reconciler = Manager(api, lambda body, event: None)
    names = ["a", "b", "c"]
    for name in names:
        services.create(name, spec(replicas=1))
        reconciler.reconcile_service(namespace, name)
    for artifact in services.artifacts():
        reconciler.reconcile_artifact(namespace, artifact["metadata"]["name"])
    assert len(reconciler.locks) == 0
    for name in names:
        body = services.get(name)
        assert api.delete(SERVICES_NIS, namespace, name)
        reconciler.reconcile_service(namespace, name)
        reconciler.forget_service(body)
    assert len(reconciler.locks) == 0


def test_a_canary_runs_beside_the_stable_revision_and_goes_once_its_revision_rolls_out(
    services: Services, operator: OperatorProcess, api: Kube, namespace: str, wait_for: WaitFor
) -> None:
    """The wiring of a canary (its analysis, which needs engines that answer, runs on the real node)."""
    canary_spec = {"steps": [{"weight": 10, "pauseSeconds": 5}, {"weight": 50}]}
    services.create("canary", spec(podAnnotations={READY_AFTER_ANNOTATION: "1s"}, rollout={"canary": canary_spec}))
    old = artifact_hash(ready(services, "canary"))
    # The first revision has nothing to be compared with: it rolls out as without a canary.
    assert api.get(DEPLOYMENTS, namespace, plan.canary_name("canary")) is None

    services.patch_spec("canary", {"engine": {"num_seqs_buckets": DECODE_B}})
    trial = services.wait(
        "canary",
        lambda b: (b.get("status", {}).get("canary") or {}).get("stepStartedAt") is not None,
        "a canary whose first step's replicas are Ready",
    )
    new = artifact_hash(trial)
    assert (trial["status"]["phase"], condition(trial, "Ready")["reason"]) == ("Canary", "CanaryProgressing")
    assert trial["status"]["canary"]["revision"] == new
    assert (trial["status"]["canary"]["canaryReplicas"], trial["status"]["canary"]["stableReplicas"]) == (1, 2)
    # The stable revision keeps every replica; one of the new revision runs beside them, in the same Service.
    assert template_hash(api, namespace, "canary") == old
    assert (api.get(DEPLOYMENTS, namespace, "canary") or {})["spec"]["replicas"] == 2
    assert template_hash(api, namespace, plan.canary_name("canary")) == new
    pods = serving_pods(api, namespace, "canary")
    assert sorted(p["metadata"]["labels"][LABEL_ARTIFACT] for p in pods) == sorted([old, old, new])
    assert all(p["metadata"]["labels"][LABEL_SERVICE] == "canary" for p in pods)
    # No engine answers on a fake node: the analysis waits for completions, and so does the canary.
    assert "0 of the 100 completions the canary needs" in condition(trial, "Ready")["message"]

    # Without the canary section the new revision rolls out as any would, and the canary's replicas go.
    services.patch_spec("canary", {"rollout": {"canary": None}})
    done = services.wait(
        "canary", lambda b: phase_of(b) == "Ready" and b["status"]["currentRevision"] == new, "the new revision"
    )
    assert done["status"].get("canary") is None
    wait_for(
        lambda: api.get(DEPLOYMENTS, namespace, plan.canary_name("canary")),
        lambda found: found is None,
        what="the canary's Deployment deleted",
    )
