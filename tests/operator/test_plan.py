"""Spec in, Kubernetes objects out: the planned artifact, compile Job and serving objects."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from neuronfleet.contract.config import EngineConfig
from neuronfleet.contract.names import LABEL_ARTIFACT, LABEL_QUARANTINED, LABEL_SERVICE, REPLICA_ENV
from neuronfleet.contract.sim_settings import START_TIME_SCALE_ENV
from neuronfleet.contract.start_time import predict_model_start
from neuronfleet.operator import api, plan

OWNER = plan.Owner(api.API_VERSION, "NeuronInferenceService", "llama", "uid-1")
NS = "serving"
MODEL = {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"}


def spec(**fields: Any) -> api.NeuronInferenceServiceSpec:
    return api.parse_service_spec({"model": MODEL, **fields})


def artifact_spec(**fields: Any) -> tuple[plan.Owner, api.NeuronCompiledArtifactSpec]:
    body = plan.artifact(OWNER, NS, spec(**fields))
    owner = plan.Owner(body["apiVersion"], body["kind"], body["metadata"]["name"], "uid-a")
    return owner, api.parse_artifact_spec(body["spec"])


def served(s: api.NeuronInferenceServiceSpec) -> plan.ServedArtifact:
    identity = s.identity()
    return plan.ServedArtifact(plan.artifact_name(identity), identity.hash(), s.compile)


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


def arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_artifact_is_named_by_model_and_hash_and_shared_not_controlled() -> None:
    s = spec()
    body = plan.artifact(OWNER, NS, s)
    assert body["metadata"]["name"] == f"llama-3-1-8b-{s.identity().hash()}"
    assert body["metadata"]["labels"][LABEL_ARTIFACT] == s.identity().hash()
    (ref,) = body["metadata"]["ownerReferences"]
    assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == ("uid-1", False, False)


def test_artifact_spec_carries_the_identity_with_buckets_written_out() -> None:
    _, parsed = artifact_spec(engine={"max_num_seqs": 6})
    assert parsed.engine.num_seqs_buckets == [1, 2, 4, 6]
    assert parsed.hash() == spec(engine={"max_num_seqs": 6}).identity().hash()


def test_artifact_names_fit_a_job_name_for_any_model() -> None:
    long = spec(model={"uri": "s3://bucket/" + "x" * 200})
    name = plan.artifact_name(long.identity())
    assert len(plan.compile_job_name(name)) <= 63
    assert plan.artifact_name(spec(model={"uri": "hf://org/7b"}).identity()).startswith("m-7b-")


def test_compile_job_is_deterministic_bounded_and_runs_the_engine_compile() -> None:
    owner, parsed = artifact_spec(
        compile={"timeoutSeconds": 600, "backoffLimit": 1, "artifactStore": "s3://neff-bucket/prod"}
    )
    job = plan.compile_job(owner, NS, parsed)
    assert job["metadata"]["name"] == f"{owner.name}-compile"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-a"
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    assert (job["spec"]["activeDeadlineSeconds"], job["spec"]["backoffLimit"]) == (600, 1)
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["command"] == ["neuronfleet-engine"]
    assert c["args"][:3] == ["compile", "--config", "/etc/neuronfleet/engine.yaml"]
    assert arg(c["args"], "--artifact-hash") == parsed.hash()
    assert arg(c["args"], "--artifact-store") == "s3://neff-bucket/prod"
    assert arg(c["args"], "--target") == "trn2"
    assert plan.compile_job(owner, NS, parsed) == job


def test_compile_pods_stay_off_neuron_nodes_by_default() -> None:
    owner, parsed = artifact_spec()
    pod = plan.compile_job(owner, NS, parsed)["spec"]["template"]["spec"]
    assert pod["tolerations"] == []
    assert "aws.amazon.com/neuron" not in str(pod["containers"][0]["resources"])


def test_compile_pods_take_the_configured_placement_and_annotations() -> None:
    owner, parsed = artifact_spec(
        compile={
            "nodeSelector": {"pool": "compile"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "podAnnotations": {"neuronfleet.io/kwok-fail": "true"},
        }
    )
    template = plan.compile_job(owner, NS, parsed)["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"pool": "compile"}
    assert template["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    assert template["metadata"]["annotations"] == {"neuronfleet.io/kwok-fail": "true"}


def test_pvc_store_is_mounted_writable_for_compile_and_read_only_for_serving() -> None:
    s = spec(compile={"artifactStore": "pvc://neff-cache/prod"})
    owner, parsed = artifact_spec(compile={"artifactStore": "pvc://neff-cache/prod"})
    job_pod = plan.compile_job(owner, NS, parsed)["spec"]["template"]["spec"]
    assert {"name": "artifacts", "persistentVolumeClaim": {"claimName": "neff-cache", "readOnly": False}} in job_pod[
        "volumes"
    ]
    assert arg(job_pod["containers"][0]["args"], "--artifact-store") == "/var/lib/neuronfleet/artifacts/prod"
    deployment = plan.deployment(OWNER, NS, s, served(s))
    mounts = container(deployment)["volumeMounts"]
    assert {"name": "artifacts", "mountPath": "/var/lib/neuronfleet/artifacts", "readOnly": True} in mounts


def test_s3_store_gives_pods_a_local_cache_and_the_aws_environment_but_no_claim() -> None:
    settings = {"artifactStore": "s3://neff-bucket/prod"}
    owner, parsed = artifact_spec(compile=settings)
    job_pod = plan.compile_job(owner, NS, parsed)["spec"]["template"]["spec"]
    assert "serviceAccountName" not in job_pod
    (compile_container,) = job_pod["containers"]
    assert compile_container["env"] == [
        {"name": "HOME", "value": "/tmp"},
        {"name": "NEURONFLEET_ARTIFACT_CACHE", "value": plan.CACHE_MOUNT},
    ]
    assert "envFrom" not in compile_container
    assert {"name": "artifact-cache", "emptyDir": {}} in job_pod["volumes"]
    assert not [v for v in job_pod["volumes"] if "persistentVolumeClaim" in v]

    access = {"region": "eu-west-1", "endpointUrl": "https://s3.example.net", "credentialsSecret": "keys"}
    s = spec(compile={**settings, "serviceAccountName": "neff-reader", "s3": access})
    pod = plan.deployment(OWNER, NS, s, served(s))["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "neff-reader"
    assert pod["automountServiceAccountToken"] is False
    engine = container(plan.deployment(OWNER, NS, s, served(s)))
    assert engine["env"][3:] == [
        {"name": "NEURONFLEET_ARTIFACT_CACHE", "value": plan.CACHE_MOUNT},
        {"name": "AWS_REGION", "value": "eu-west-1"},
        {"name": "AWS_ENDPOINT_URL_S3", "value": "https://s3.example.net"},
    ]
    assert engine["envFrom"] == [{"secretRef": {"name": "keys"}}]
    assert {"name": "artifact-cache", "mountPath": plan.CACHE_MOUNT} in engine["volumeMounts"]


def test_a_node_cache_is_the_serving_pods_shared_bounded_copy_and_not_the_compile_jobs() -> None:
    access = {"nodeCache": {"hostPath": "/var/cache/neuronfleet", "sizeLimit": "1.5G"}}
    settings = {"artifactStore": "s3://neff-bucket/prod", "s3": access}
    s = spec(compile=settings)
    pod = plan.deployment(OWNER, NS, s, served(s))["spec"]["template"]["spec"]
    assert {"name": "artifact-cache", "hostPath": {"path": "/var/cache/neuronfleet", "type": "Directory"}} in pod[
        "volumes"
    ]
    engine = pod["containers"][0]
    assert {"name": "artifact-cache", "mountPath": plan.CACHE_MOUNT} in engine["volumeMounts"]
    assert {"name": "NEURONFLEET_ARTIFACT_CACHE_BYTES", "value": "1500000000"} in engine["env"]
    # A compile Job stages its upload in a cache of its own: no other pod reads it.
    owner, parsed = artifact_spec(compile=settings)
    job_pod = plan.compile_job(owner, NS, parsed)["spec"]["template"]["spec"]
    assert {"name": "artifact-cache", "emptyDir": {}} in job_pod["volumes"]
    assert "NEURONFLEET_ARTIFACT_CACHE_BYTES" not in str(job_pod)
    # Without one, each serving pod keeps its own copy, unbounded.
    plain = spec(compile={"artifactStore": "s3://neff-bucket/prod"})
    pod = plan.deployment(OWNER, NS, plain, served(plain))["spec"]["template"]["spec"]
    assert {"name": "artifact-cache", "emptyDir": {}} in pod["volumes"]


def test_serving_pods_run_as_their_own_services_account_on_a_shared_artifact() -> None:
    first = spec(compile={"artifactStore": "s3://neff-bucket/prod", "serviceAccountName": "first"})
    second = spec(compile={"artifactStore": "s3://neff-bucket/prod", "serviceAccountName": "second"})
    pod = plan.deployment(OWNER, NS, second, served(first))["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "second"
    assert arg(pod["containers"][0]["args"], "--artifact-store") == "s3://neff-bucket/prod"


def test_engine_config_map_holds_the_compiled_shapes() -> None:
    s = spec(engine={"max_num_seqs": 6, "max_model_len": 4096})
    cm = plan.engine_configmap(OWNER, NS, s, "abc")
    engine = EngineConfig.model_validate(yaml.safe_load(cm["data"]["engine.yaml"]))
    assert engine.num_seqs_buckets == [1, 2, 4, 6]
    assert engine.num_batched_tokens_buckets == [128, 256, 512, 1024, 2048, 4096]
    assert cm["metadata"]["name"] == plan.engine_configmap_name("llama", s.engine)
    assert cm["metadata"]["labels"][LABEL_ARTIFACT] == "abc"


def test_deployment_is_pinned_to_its_artifact() -> None:
    s = spec()
    artifact = served(s)
    deployment = plan.deployment(OWNER, NS, s, artifact)
    template = deployment["spec"]["template"]
    assert template["metadata"]["labels"][LABEL_ARTIFACT] == artifact.hash
    assert deployment["spec"]["selector"] == {"matchLabels": {LABEL_SERVICE: "llama"}}
    c = container(deployment)
    assert arg(c["args"], "--artifact-hash") == artifact.hash
    assert {"name": "NEURONFLEET_ARTIFACT_HASH", "value": artifact.hash} in c["env"]
    volumes = template["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": plan.engine_configmap_name("llama", s.engine)}} in volumes


@pytest.mark.parametrize(
    ("instance", "tensor_parallel_size", "devices"),
    # Trainium2 and Trainium3 have 4 logical cores a device at LNC=2, Inferentia2 2.
    [("trn2.48xlarge", 32, "8"), ("trn3.48xlarge", 64, "16"), ("trn3.48xlarge", 6, "2"), ("inf2.48xlarge", 24, "12")],
)
def test_deployment_runs_on_neuron_nodes_with_derived_devices(
    instance: str, tensor_parallel_size: int, devices: str
) -> None:
    s = spec(instanceType=instance, engine={"tensor_parallel_size": tensor_parallel_size})
    deployment = plan.deployment(OWNER, NS, s, served(s))
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": instance}
    assert pod["tolerations"] == [{"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"}]
    resources = container(deployment)["resources"]
    assert resources["requests"]["aws.amazon.com/neuron"] == resources["limits"]["aws.amazon.com/neuron"] == devices
    # The engine derives the prefill cap from the instance type's step times.
    assert arg(container(deployment)["args"], "--instance-type") == instance


def test_deployment_surges_first_and_drains() -> None:
    s = spec(drain={"preStopSeconds": 15, "drainTimeoutSeconds": 90}, rollout={"startupTimeoutSeconds": 1200})
    deployment = plan.deployment(OWNER, NS, s, served(s))
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 15}}}
    assert pod["terminationGracePeriodSeconds"] == 15 + 90 + 15
    assert arg(c["args"], "--drain-timeout") == "90"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1200
    assert c["startupProbe"]["periodSeconds"] == 10


def test_a_simulated_replica_is_probed_at_start_every_two_seconds_for_the_same_timeout() -> None:
    s = spec(device="sim", rollout={"startupTimeoutSeconds": 1200})
    c = container(plan.deployment(OWNER, NS, s, served(s)))
    assert c["startupProbe"]["periodSeconds"] == 2
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1200
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"


def test_a_model_that_loads_for_longer_than_the_startup_timeout_is_given_twice_its_predicted_start() -> None:
    # Llama 3.1 405B from the Hub: about 30 minutes to fetch, load and shard, past the 1,800 s default.
    big = spec(model={"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"})
    predicted = predict_model_start("hf://meta-llama/Llama-3.1-405B-Instruct")
    assert predicted is not None
    assert predicted.total_s > big.rollout.startup_timeout_seconds
    deployment = plan.deployment(OWNER, NS, big, served(big))
    probe = container(deployment)["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 2 * predicted.total_s
    assert deployment["spec"]["progressDeadlineSeconds"] >= 2 * predicted.total_s
    # An 8B loads in well under the timeout, and a model of unknown size gets the timeout as given.
    for model in ("hf://meta-llama/Llama-3.1-8B", "hf://org/unknown-model"):
        small = spec(model={"uri": model}, rollout={"startupTimeoutSeconds": 600})
        probe = container(plan.deployment(OWNER, NS, small, served(small)))["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] == 600, model


def test_simulated_replicas_spend_the_operators_share_of_a_neuron_replicas_start() -> None:
    def env(s: api.NeuronInferenceServiceSpec, scale: float) -> dict[str, str]:
        planned = plan.serving_plan(OWNER, NS, s, served(s), start_time_scale=scale)
        canary = plan.canary_plan(OWNER, NS, s, served(s), 1, start_time_scale=scale)
        both = [{e["name"]: e.get("value") for e in container(d.deployment)["env"]} for d in (planned, canary)]
        assert both[0] == both[1]
        return both[0]

    sim = spec(device="sim")
    assert env(sim, 0.01)[START_TIME_SCALE_ENV] == "0.01"
    assert env(sim, 0)[START_TIME_SCALE_ENV] == "0"
    # The whole start is the engine's default: nothing rendered, so no pod template changes on an upgrade.
    assert START_TIME_SCALE_ENV not in env(sim, 1.0)
    # A Neuron replica takes what it takes.
    assert START_TIME_SCALE_ENV not in env(spec(), 0.01)


def test_serving_pods_name_their_replica_and_keep_the_reason_they_stopped() -> None:
    s = spec()
    c = container(plan.deployment(OWNER, NS, s, served(s)))
    replica = {"name": REPLICA_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    assert replica in c["env"]
    # The engine's own line on a device fault; the log's tail on any other crash.
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_serving_pods_keep_off_the_nodes_of_quarantined_pods_strictly_for_a_node_fault() -> None:
    s = spec()
    affinity = plan.deployment(OWNER, NS, s, served(s))["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (strict,) = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    # Any service's pod quarantined for its node, in any namespace, on the same node.
    assert strict == {
        "labelSelector": {"matchLabels": {LABEL_QUARANTINED: "node"}},
        "namespaceSelector": {},
        "topologyKey": "kubernetes.io/hostname",
    }
    (preferred,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["weight"] == 100
    assert preferred["podAffinityTerm"]["labelSelector"] == {
        "matchExpressions": [{"key": LABEL_QUARANTINED, "operator": "Exists"}]
    }
    # A quarantined pod leaves every selector its service has: none of them names the quarantine label.
    assert LABEL_QUARANTINED not in plan.service_labels("llama")


def test_serving_pods_run_restricted() -> None:
    s = spec()
    pod = plan.deployment(OWNER, NS, s, served(s))["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    security = pod["containers"][0]["securityContext"]
    assert security == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_serving_only_engine_settings_roll_the_pods_but_share_the_artifact() -> None:
    before = spec()
    after = spec(engine={"scheduler": {"max_consecutive_prefill_steps": 4}})
    assert after.identity().hash() == before.identity().hash()
    a = plan.deployment(OWNER, NS, before, served(before))
    b = plan.deployment(OWNER, NS, after, served(after))
    assert a["spec"]["template"] != b["spec"]["template"]  # a new ConfigMap: the pods roll
    engine = yaml.safe_load(plan.engine_configmap(OWNER, NS, after, "h")["data"]["engine.yaml"])
    assert engine["scheduler"]["max_consecutive_prefill_steps"] == 4


def test_replicas_change_only_the_replica_count() -> None:
    one, three = spec(replicas=1), spec(replicas=3)
    a = plan.deployment(OWNER, NS, one, served(one))
    b = plan.deployment(OWNER, NS, three, served(three))
    assert a["spec"]["template"] == b["spec"]["template"]
    assert (a["spec"]["replicas"], b["spec"]["replicas"]) == (1, 3)


def test_serving_objects_are_owned_by_the_service_config_first() -> None:
    s = spec()
    objects = plan.serving_objects(OWNER, NS, s, served(s))
    assert [o["kind"] for o in objects] == ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"]
    for obj in objects:
        assert obj["metadata"]["ownerReferences"] == [OWNER.reference()]
        assert obj["metadata"]["namespace"] == NS
    service, pdb = objects[2], objects[3]
    assert service["spec"]["selector"] == {LABEL_SERVICE: "llama"}
    assert pdb["spec"]["maxUnavailable"] == 1


def test_simulated_service_compiles_and_serves_on_the_sim_device_on_any_node() -> None:
    sim = spec(device="sim", instanceType="trn2.48xlarge")
    owner, artifact = artifact_spec(device="sim", instanceType="trn2.48xlarge")
    assert artifact.device == "sim"
    assert artifact.hash() == sim.identity().hash() != spec(instanceType="trn2.48xlarge").identity().hash()
    compile_args = plan.compile_job(owner, NS, artifact)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert arg(compile_args, "--device") == "sim"
    deployment = plan.deployment(OWNER, NS, sim, served(sim))
    pod = deployment["spec"]["template"]["spec"]
    engine = container(deployment)
    assert (arg(engine["args"], "--device"), arg(engine["args"], "--instance-type")) == ("sim", "trn2.48xlarge")
    # CPU and memory instead of Neuron devices, and no Neuron placement: any node runs it.
    assert engine["resources"] == {
        "requests": {"cpu": plan.SIM_CPU, "memory": plan.SIM_MEMORY},
        "limits": {"memory": plan.SIM_MEMORY},
    }
    assert "nodeSelector" not in pod
    assert "tolerations" not in pod


def test_simulated_replicas_take_the_resources_given() -> None:
    sim = spec(device="sim", resources={"cpu": "3", "memory": "5Gi"})
    resources = container(plan.deployment(OWNER, NS, sim, served(sim)))["resources"]
    assert resources == {"requests": {"cpu": "3", "memory": "5Gi"}, "limits": {"memory": "5Gi"}}


def test_serving_pods_take_the_placement_given_besides_the_neuron_one() -> None:
    pool = {"pool": "staging"}
    dedicated = {"key": "dedicated", "operator": "Equal", "value": "rehearsal", "effect": "NoSchedule"}
    neuron = spec(instanceType="trn2.48xlarge", nodeSelector=pool, tolerations=[dedicated])
    pod = plan.deployment(OWNER, NS, neuron, served(neuron))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "staging", "node.kubernetes.io/instance-type": "trn2.48xlarge"}
    assert pod["tolerations"] == [
        {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"},
        dedicated,
    ]
    # A sim replica goes only where the user says: no instance-type label, no Neuron toleration.
    sim = spec(device="sim", instanceType="trn2.48xlarge", nodeSelector=pool, tolerations=[dedicated])
    pod = plan.deployment(OWNER, NS, sim, served(sim))["spec"]["template"]["spec"]
    assert (pod["nodeSelector"], pod["tolerations"]) == (pool, [dedicated])


def test_neuron_pods_name_no_device_so_pods_from_before_keep_their_spec() -> None:
    neuron = spec()
    _, artifact = artifact_spec()
    assert "--device" not in container(plan.deployment(OWNER, NS, neuron, served(neuron)))["args"]
    assert "--device" not in plan.compile_invocation(artifact).args()


@pytest.mark.parametrize(
    "engine",
    [
        EngineConfig(),
        EngineConfig(
            max_num_seqs=16,
            max_num_batched_tokens=2048,
            num_batched_tokens_buckets=[128, 512, 2048],
            num_seqs_buckets=[1, 4, 16],
        ),
        EngineConfig(tensor_parallel_size=8, dtype="float16", decode_context_length_buckets=[1024, 4096]),
    ],
)
def test_the_engine_file_rendered_once_by_content_is_the_configuration_written_out(engine: EngineConfig) -> None:
    rendered = plan.engine_yaml(engine)
    # What the pods read: every field, the bucket sets as compiled.
    assert yaml.safe_load(rendered) == plan.served_engine(engine).model_dump(mode="json")
    # An equal configuration parsed anew gets the same text; a changed one, its own.
    again = EngineConfig.model_validate(engine.model_dump())
    assert plan.engine_yaml(again) is rendered
    assert plan.engine_yaml(engine.model_copy(update={"block_size": 64})) != rendered
