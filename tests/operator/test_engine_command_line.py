"""Every command line the operator's plan writes for the engine, parsed by the engine's own parser.

The flags cross a process boundary as strings: a renamed or retyped option on either side would only
show when a pod starts. Here each argument list is parsed as ``neuronfleet-engine`` would parse it, and
what it parses to is what the spec says.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import typer

from neuronfleet.contract.hardware import INSTANCE_TYPES
from neuronfleet.contract.invocation import CompileInvocation, ServeInvocation
from neuronfleet.contract.names import HTTP_PORT, KV_EVENTS_PORT
from neuronfleet.engine.cli.main import app
from neuronfleet.engine.cli.options import CompileOptions, ServeOptions
from neuronfleet.operator import api, plan

ENGINE = typer.main.get_command(app)
OWNER = plan.Owner(api.API_VERSION, "NeuronInferenceService", "llama", "uid-1")
STORES = ["s3://neuronfleet-artifacts/neff", "pvc://neff-cache/compiled"]


def parsed(args: list[str]) -> dict[str, Any]:
    """The parameters ``neuronfleet-engine <args>`` parses to; a usage error fails the test."""
    name, rest = args[0], args[1:]
    group = ENGINE.make_context("neuronfleet-engine", list(args))
    command = ENGINE.get_command(group, name)  # type: ignore[attr-defined]
    assert command is not None, f"the engine has no command {name!r}"
    params: dict[str, Any] = command.make_context(name, list(rest), parent=group).params
    return params


def service(device: str, instance_type: str, store: str, lnc: int | None = 1) -> api.NeuronInferenceServiceSpec:
    """A spec at logical-NeuronCore setting ``lnc``: 1 is the default of trn1 and inf2, not of trn2 and trn3."""
    return api.NeuronInferenceServiceSpec.model_validate(
        {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B", "revision": "0e9e39f"},
            "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_model_len": 512},
            "device": device,
            "instanceType": instance_type,
            "image": "neuronfleet/engine:0.1.0",
            "compile": {"artifactStore": store},
            "drain": {"drainTimeoutSeconds": 45},
            "placement": {} if lnc is None else {"logicalNeuronCores": lnc},
        }
    )


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("device", ["neuron", "sim"])
@pytest.mark.parametrize("instance_type", sorted(INSTANCE_TYPES))
def test_the_serve_command_the_plan_writes_parses_to_the_spec(device: str, instance_type: str, store: str) -> None:
    spec = service(device, instance_type, store)
    served = plan.ServedArtifact("llama-x", "0123456789abcdef", spec.compile)
    params = parsed(plan.serve_invocation(spec, served).args())
    assert params["config"] == Path(plan.CONFIG_DIR) / plan.ENGINE_FILE
    assert (params["model"], params["revision"]) == (spec.model.uri, spec.model.revision)
    assert (params["artifact_store"], params["artifact_hash"]) == (plan.store_path(spec.compile), served.hash)
    assert (params["device"], params["instance_type"]) == (device, instance_type)
    assert (params["port"], params["drain_timeout"]) == (HTTP_PORT, 45)
    # Written only where it is not the target's default: the identity the engine computes is the operator's.
    expected = 1 if INSTANCE_TYPES[instance_type].chip.default_lnc != 1 else None
    assert params["logical_neuron_cores"] == spec.identity().logical_neuron_cores == expected


@pytest.mark.parametrize("lnc", [None, 1])
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("device", ["neuron", "sim"])
def test_the_compile_command_the_plan_writes_parses_to_the_artifact(device: str, store: str, lnc: int | None) -> None:
    spec = service(device, "trn2.48xlarge", store, lnc)
    artifact = plan.artifact(OWNER, "llm", spec)
    artifact_spec = api.parse_artifact_spec(artifact["spec"])
    params = parsed(plan.compile_invocation(artifact_spec).args())
    assert params["config"] == Path(plan.CONFIG_DIR) / plan.ENGINE_FILE
    assert (params["model"], params["revision"]) == (spec.model.uri, spec.model.revision)
    assert (params["target"], params["engine_image"], params["device"]) == ("trn2", spec.image, device)
    assert (params["artifact_store"], params["artifact_hash"]) == (plan.store_path(spec.compile), artifact_spec.hash())
    assert params["logical_neuron_cores"] == lnc


@pytest.mark.parametrize(
    "invocation",
    [
        CompileInvocation("/c.yaml", "hf://m", "r1", "trn2", "img:1", "s3://b/p", "0123456789abcdef", "sim"),
        ServeInvocation("/c.yaml", "hf://m", "r1", "/store", "0123456789abcdef", 8000, 45, "sim", "trn2.48xlarge"),
    ],
    ids=["compile", "serve"],
)
def test_every_field_of_an_invocation_is_the_engine_option_of_its_name(
    invocation: CompileInvocation | ServeInvocation,
) -> None:
    params = parsed(invocation.args())
    for field in dataclasses.fields(invocation):
        value = getattr(invocation, field.name)
        assert str(params[field.name]) == str(value), field.name


@pytest.mark.parametrize(
    ("invocation", "options"),
    [(CompileInvocation, CompileOptions), (ServeInvocation, ServeOptions)],
    ids=["compile", "serve"],
)
def test_an_option_the_operator_leaves_out_means_what_the_engine_defaults_it_to(
    invocation: type[CompileInvocation | ServeInvocation], options: type[CompileOptions | ServeOptions]
) -> None:
    engine_defaults = {field.name: field.default for field in dataclasses.fields(options)}
    for field in dataclasses.fields(invocation):
        assert field.name in engine_defaults, f"--{field.name} is not an option of the engine's {invocation.command}"
        if field.default is not dataclasses.MISSING:
            # A tuple the operator leaves empty is an option the engine never sees.
            expected = None if field.default == () else field.default
            assert engine_defaults[field.name] == expected, field.name


def test_an_option_at_its_default_is_left_out() -> None:
    neuron = CompileInvocation("/c.yaml", "hf://m", "r1", "trn2", "img:1", "/store", "0123456789abcdef")
    assert neuron.args()[:3] == ["compile", "--config", "/c.yaml"]
    assert "--device" not in neuron.args()
    assert parsed(neuron.args())["device"] == "neuron"


def test_lora_slots_and_adapters_are_the_engine_options_the_identity_and_the_pods_read() -> None:
    digest = "ab" * 32
    adapters = [{"name": "fr", "source": "s3://adapters/fr"}, {"name": "de", "source": "/data/de", "sha256": digest}]
    lora = api.Lora.model_validate({"maxLoras": 2, "maxLoraRank": 32, "adapters": adapters})
    spec = service("sim", "trn2.48xlarge", STORES[0]).model_copy(update={"lora": lora})
    served = plan.ServedArtifact("llama-x", "0123456789abcdef", spec.compile)
    params = parsed(plan.serve_invocation(spec, served).args())
    assert (params["max_loras"], params["max_lora_rank"]) == (2, 32)
    assert params["lora_adapter"] == ["fr=s3://adapters/fr", f"de=/data/de@{digest}"]
    artifact_spec = api.parse_artifact_spec(plan.artifact(OWNER, "llm", spec)["spec"])
    compiled = parsed(plan.compile_invocation(artifact_spec).args())
    assert (compiled["max_loras"], compiled["max_lora_rank"]) == (2, 32)
    # The adapters are served, never compiled: the artifact is the same with none of them.
    assert (
        artifact_spec.hash()
        == spec.model_copy(update={"lora": api.Lora(max_loras=2, max_lora_rank=32)}).identity().hash()
    )
    assert artifact_spec.hash() != spec.identity().model_copy(update={"lora": None}).hash()


def test_kv_events_are_published_on_the_engines_ports_when_routing_asks() -> None:
    spec = service("sim", "trn2.48xlarge", STORES[0])
    served = plan.ServedArtifact("llama-x", "0123456789abcdef", spec.compile)
    assert parsed(plan.serve_invocation(spec, served).args())["kv_events_port"] is None
    routed = spec.model_copy(update={"routing": api.Routing(kv_events=True)})
    assert parsed(plan.serve_invocation(routed, served).args())["kv_events_port"] == KV_EVENTS_PORT
    (engine,) = plan.deployment(OWNER, "llm", routed, served)["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in engine["ports"]}
    # The engine replays on the next port when it is not named: the pod opens both.
    assert ports == {"http": HTTP_PORT, "kv-events": KV_EVENTS_PORT, "kv-replay": KV_EVENTS_PORT + 1}
