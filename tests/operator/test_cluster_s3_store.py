"""``s3://`` stores on a real control plane with fake nodes: what compile and serving pods get, and a store
the engine cannot reach, and a ServiceAccount that does not exist.

KWOK runs no container, so the compile never really reaches S3 here. What is real: the Job and pod specs
the API server admits (ServiceAccount, environment, no volume for the store), the operator's statuses, and,
for the unreachable store, the engine's own last line: the compile Job's command runs here as a process
against a closed port, and the fake compile pod ends with that line as its termination message, as the
kubelet would report it (``terminationMessagePolicy: FallbackToLogsOnError``).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from harness.engine_server import SCRIPTS, engine_env
from harness.programs import run_program
from harness.services import Services
from kubernetes.client import ApiException, CoreV1Api, V1Container, V1ObjectMeta, V1Pod, V1PodSpec, V1ServiceAccount

from neuronfleet.contract.names import LABEL_ARTIFACT, LABEL_SERVICE
from neuronfleet.devcluster.addons.operator_process import OperatorProcess
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.kwok import FAIL_ANNOTATION, FAIL_MESSAGE_ANNOTATION
from neuronfleet.devcluster.controlplane.status import condition
from neuronfleet.devcluster.process.waiting import WaitFor
from neuronfleet.operator import api, plan
from neuronfleet.operator.cluster.kube import JOBS, PODS, Kube

pytest_plugins = ["harness.operator_fixtures"]

Obj = dict[str, Any]

STORE = "s3://neuronfleet-artifacts/team"
ACCOUNT = "artifact-writer"
SECRET = "artifact-keys"
#: Nothing listens on the discard port: a store there cannot be reached.
CLOSED = "http://127.0.0.1:9"


def spec(**compile_settings: Any) -> Obj:
    """A small service compiled into an S3 prefix, its pods run as the ServiceAccount the bucket trusts."""
    return {
        "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
        "engine": {"max_num_seqs": 4, "tensor_parallel_size": 4},
        "replicas": 1,
        "compile": {
            "artifactStore": STORE,
            "serviceAccountName": ACCOUNT,
            "s3": {"region": "us-west-2", "endpointUrl": CLOSED, "credentialsSecret": SECRET},
            "resources": {"cpu": "1", "memory": "1Gi"},
            **compile_settings,
        },
    }


def env_of(container: Obj) -> dict[str, str]:
    """The container's literal environment (values from the downward API left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def assert_wired_for_s3(pod_spec: Obj) -> None:
    """A pod of an s3:// store: the named ServiceAccount, S3's environment, a local cache, no claim."""
    assert pod_spec["serviceAccountName"] == ACCOUNT
    assert pod_spec["automountServiceAccountToken"] is False
    assert not [v for v in pod_spec["volumes"] if "persistentVolumeClaim" in v]
    (container,) = pod_spec["containers"]
    env = env_of(container)
    assert env["AWS_REGION"] == "us-west-2"
    assert env["AWS_ENDPOINT_URL_S3"] == CLOSED
    assert env["NEURONFLEET_ARTIFACT_CACHE"] == plan.CACHE_MOUNT
    assert container["envFrom"] == [{"secretRef": {"name": SECRET}}]
    assert {"name": "artifact-cache", "mountPath": plan.CACHE_MOUNT} in container["volumeMounts"]
    assert container["args"][container["args"].index("--artifact-store") + 1] == STORE


def test_an_s3_service_compiles_and_serves_with_its_pods_wired_for_the_store(
    services: Services, operator: OperatorProcess, api: Kube, core: CoreV1Api, namespace: str, wait_for: WaitFor
) -> None:
    core.create_namespaced_service_account(namespace, V1ServiceAccount(metadata=V1ObjectMeta(name=ACCOUNT)))
    services.create("llama", spec())
    assert services.wait_phase("llama", "Compiling")["status"]["artifact"]["phase"] in {"Pending", "Compiling"}
    done = services.wait_ready("llama")
    artifact_hash = done["status"]["artifact"]["hash"]

    (job,) = api.list(JOBS, namespace, LABEL_ARTIFACT)
    assert_wired_for_s3(job["spec"]["template"]["spec"])
    compile_pods = api.list(PODS, namespace, f"job-name={job['metadata']['name']}")
    assert compile_pods, "the Job made no pod"
    assert {pod["spec"]["serviceAccountName"] for pod in compile_pods} == {ACCOUNT}

    (serving,) = wait_for(lambda: api.list(PODS, namespace, f"{LABEL_SERVICE}=llama"), what="the serving pod")
    assert_wired_for_s3(serving["spec"])
    assert env_of(serving["spec"]["containers"][0])["NEURONFLEET_ARTIFACT_HASH"] == artifact_hash
    (artifact,) = services.artifacts()
    assert artifact["status"]["location"] == f"{STORE}/{artifact_hash}"


def engine_failure_line(tmp_path: Path, service: Obj) -> str:
    """The last line the compile Job's own command prints against the unreachable store, run here."""
    parsed = api.parse_service_spec(service)
    body = plan.artifact(plan.Owner(api.API_VERSION, "NeuronInferenceService", "llama", "uid"), "ns", parsed)
    artifact_spec = api.parse_artifact_spec(body["spec"])
    job = plan.compile_job(plan.Owner(api.API_VERSION, "NeuronCompiledArtifact", "a", "uid"), "ns", artifact_spec)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    config = tmp_path / plan.ENGINE_FILE
    config.write_text(plan.engine_yaml(artifact_spec.engine))
    args = [str(config) if arg == f"{plan.CONFIG_DIR}/{plan.ENGINE_FILE}" else arg for arg in container["args"]]
    env = {
        **engine_env(),
        **env_of(container),
        "HOME": str(tmp_path),
        "NEURONFLEET_ARTIFACT_CACHE": str(tmp_path / "cache"),
        # What the Secret would hold.
        "AWS_ACCESS_KEY_ID": "NFTESTKEY",
        "AWS_SECRET_ACCESS_KEY": "never-printed-0123456789",
        "PATH": os.environ.get("PATH", ""),
    }
    # No Neuron SDK here: the service is on the simulated device, whose compile also reads the store first.
    assert args[-2:] == ["--device", "sim"]
    result = run_program([str(SCRIPTS / "neuronfleet-engine"), *args], timeout=120, env=env)
    assert result.returncode == 2, result.stderr
    assert "never-printed" not in result.stdout + result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_an_unreachable_store_ends_compile_failed_with_the_engines_reason(
    services: Services,
    operator: OperatorProcess,
    core: CoreV1Api,
    namespace: str,
    cluster: LocalCluster,
    tmp_path: Path,
) -> None:
    core.create_namespaced_service_account(namespace, V1ServiceAccount(metadata=V1ObjectMeta(name=ACCOUNT)))
    service = {**spec(backoffLimit=0), "device": "sim"}
    line = engine_failure_line(tmp_path, service)
    assert line.startswith(f"error: cannot reach the artifact store at {STORE}/")

    failing = copy.deepcopy(service)
    failing["compile"]["podAnnotations"] = {FAIL_ANNOTATION: "true", FAIL_MESSAGE_ANNOTATION: line}
    services.create("llama", failing)
    failed = services.wait_phase("llama", "CompileFailed")
    artifact_ready = condition(failed, "ArtifactReady")
    assert artifact_ready["reason"] == "CompileFailed"
    assert f"last compile pod: {line}" in artifact_ready["message"]
    assert condition(failed, "Ready")["reason"] == "CompileFailed"
    (artifact,) = services.artifacts()
    assert artifact["status"]["phase"] == "Failed"
    assert artifact["status"]["message"].endswith(f"last compile pod: {line}")

    described = cluster.kubectl("describe", "nis", "llama", "-n", namespace)
    print(f"$ kubectl describe nis llama\n{described.stdout}")
    assert described.returncode == 0, described.stderr
    assert "cannot reach the artifact store" in described.stdout


def test_a_service_account_that_does_not_exist_says_so_and_fixing_it_lets_the_compile_go_on(
    services: Services, operator: OperatorProcess, core: CoreV1Api, namespace: str, wait_for: WaitFor
) -> None:
    # The API server's ServiceAccount admission refuses such a pod: the Job controller cannot make one.
    orphan = V1Pod(
        metadata=V1ObjectMeta(name="orphan"),
        spec=V1PodSpec(service_account_name=ACCOUNT, containers=[V1Container(name="c", image="busybox")]),
    )
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, orphan)
    assert refused.value.status == 403
    assert refused.value.body is not None
    assert f'serviceaccount "{ACCOUNT}" not found' in json.loads(refused.value.body)["message"]

    services.create("llama", spec())
    stuck = services.wait(
        "llama",
        lambda body: "FailedCreate" in (condition(body, "ArtifactReady").get("message") or ""),
        "the refused compile pod in ArtifactReady",
    )
    assert stuck["status"]["phase"] == "Compiling"
    artifact_ready = condition(stuck, "ArtifactReady")
    assert (artifact_ready["status"], artifact_ready["reason"]) == ("False", "Compiling")
    lookup = f'error looking up service account {namespace}/{ACCOUNT}: serviceaccount "{ACCOUNT}" not found'
    assert lookup in artifact_ready["message"]
    (artifact,) = services.artifacts()
    job = plan.compile_job_name(artifact["metadata"]["name"])
    assert (artifact["status"]["phase"], artifact["status"]["reason"]) == ("Compiling", "FailedCreate")
    assert artifact["status"]["message"].startswith(f"compile Job {job} cannot create its pod: ")
    assert lookup in artifact["status"]["message"]

    # The same Job makes its pod once the ServiceAccount exists (the controller retries within a minute).
    core.create_namespaced_service_account(namespace, V1ServiceAccount(metadata=V1ObjectMeta(name=ACCOUNT)))
    services.wait_ready("llama", timeout=120)
    (artifact,) = services.artifacts()
    assert (artifact["status"]["phase"], artifact["status"]["job"]) == ("Ready", job)
