"""``make demo``: the stages it shows (from captured objects), the completion it sends through the Service,
and one whole run with --exit-when-ready on the real node."""

from __future__ import annotations

import datetime
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.programs import run_program

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.demo import completion
from neuronfleet.devcluster.demo.run import (
    DEFAULT_EXAMPLE,
    DemoError,
    load_example,
    rbac_refusals,
    store_claim,
    with_image,
)
from neuronfleet.devcluster.demo.view import headline, stages
from neuronfleet.devcluster.images.inputs import base_archive, checkout_key, file_digest
from neuronfleet.devcluster.process.managed import SCRIPTS
from neuronfleet.operator.api import parse_service_spec

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "NeuronInferenceService"
ARTIFACT = "NeuronCompiledArtifact"
NOW = datetime.datetime(2026, 11, 30, 2, 3, 30, tzinfo=datetime.UTC)

Captured = Callable[[str, str], dict[str, Any]]


def states(service: dict[str, Any] | None, artifact: dict[str, Any] | None = None) -> dict[str, str]:
    return {s.name: s.state for s in stages(service, artifact, NOW)}


def test_stages_follow_the_service_from_apply_to_ready(captured: Captured) -> None:
    assert states(captured(SERVICE, "no-status.yaml")) == {
        "Validated": "active",
        "Compiling": "waiting",
        "Rolling out": "waiting",
        "Ready": "waiting",
    }
    compiling = stages(captured(SERVICE, "compiling.yaml"), captured(ARTIFACT, "compiling.yaml"), NOW)
    assert [s.state for s in compiling] == ["done", "active", "waiting", "waiting"]
    assert headline(compiling) == "Compiling"
    # Progress: buckets compiled, the Job's attempt, time since the Job started.
    assert "0/9 buckets compiled" in compiling[1].detail
    assert "attempt 1 of 3" in compiling[1].detail
    assert compiling[1].detail.endswith(" s")
    assert states(captured(SERVICE, "rolling-out.yaml"), captured(ARTIFACT, "ready.yaml")) == {
        "Validated": "done",
        "Compiling": "done",
        "Rolling out": "active",
        "Ready": "waiting",
    }
    ready = stages(captured(SERVICE, "ready.yaml"), captured(ARTIFACT, "ready.yaml"), NOW)
    assert [s.state for s in ready] == ["done"] * 4
    assert ready[2].detail.startswith("2/2 replicas ready")


def test_stages_show_what_stops_the_way_to_ready(captured: Captured) -> None:
    failed = stages(captured(SERVICE, "compile-failed.yaml"), captured(ARTIFACT, "failed.yaml"), NOW)
    assert [s.state for s in failed] == ["done", "failed", "waiting", "waiting"]
    assert "BackoffLimitExceeded" in failed[1].detail
    blocked = states(captured(SERVICE, "blocked.yaml"), captured(ARTIFACT, "failed.yaml"))
    assert blocked["Compiling"] == "failed"
    assert states(captured(SERVICE, "invalid.yaml"))["Validated"] == "failed"
    # A spec the operator has not acted on yet is not shown as the old one's outcome.
    assert states(captured(SERVICE, "generation-lag.yaml"))["Validated"] == "active"


def test_the_store_claim_comes_from_a_pvc_store_alone() -> None:
    example = load_example(ROOT / DEFAULT_EXAMPLE)
    assert example["spec"]["compile"]["artifactStore"] == "pvc://neuronfleet-artifacts/neff"
    assert store_claim(example) == "neuronfleet-artifacts"
    example["spec"]["compile"]["artifactStore"] = "s3://bucket/neff"
    assert store_claim(example) is None


def test_the_example_is_one_small_simulated_replica_on_the_real_node() -> None:
    example = load_example(ROOT / DEFAULT_EXAMPLE)
    spec = parse_service_spec(example["spec"])
    assert (spec.device, spec.replicas, spec.model.uri) == ("sim", 1, "hf://neuronfleet/tiny")
    assert spec.engine.num_batched_tokens_buckets == [128, 256]
    # Both the compile pod and the serving pod go to real-0, past its Neuron taint.
    for placement in (spec, spec.compile):
        assert placement.node_selector == {"kubernetes.io/hostname": REAL_NODE}
        assert [(t.key, t.operator, t.effect) for t in placement.tolerations] == [
            ("aws.amazon.com/neuron", "Exists", "NoSchedule")
        ]
    # One serving replica beside the operator's pod (100m) fits the node's two cores.
    assert spec.resources.cpu == "1"
    assert with_image(example, "localhost/neuronfleet/engine:k")["spec"] == {
        **example["spec"],
        "image": "localhost/neuronfleet/engine:k",
    }


def test_the_demo_refuses_a_service_its_node_cannot_serve(tmp_path: Path) -> None:
    neuron = yaml.safe_load((ROOT / "examples" / "llama-3.1-8b-inf2.yaml").read_text())
    path = tmp_path / "neuron.yaml"
    path.write_text(yaml.safe_dump(neuron))
    with pytest.raises(DemoError, match="is not `device: sim`"):
        load_example(path)


def test_rbac_refusals_are_the_forbidden_lines_not_a_timestamp_ending_in_403() -> None:
    refused = (
        "2026-12-04 15:36:46,118 ERROR kopf.objects: Handler 'reconcile' failed: "
        "403 Forbidden: jobs.batch is forbidden: User cannot create resource"
    )
    log = "\n".join(
        [
            "2026-12-04 15:36:45,403 INFO kopf.objects: Handler 'build_registry.<locals>.compile_job' succeeded.",
            refused,
            "2026-12-04 15:36:47,001 INFO kopf.objects: 403 buckets compiled",
        ]
    )
    assert rbac_refusals(log) == [refused]


def test_curl_output_gives_the_final_response_and_its_headers() -> None:
    body = '{"choices": [{"text": " Paris"}]}'
    printed = (
        "HTTP/1.1 100 Continue\r\n\r\n"
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nX-Neuronfleet-Artifact: 0123abcd\r\n\r\n" + body
    )
    response = completion.parse_response(printed)
    assert (response.status, response.body) == (200, body)
    assert response.headers["x-neuronfleet-artifact"] == "0123abcd"
    assert completion.completion_text(response) == " Paris"
    with pytest.raises(completion.ResponseError):
        completion.parse_response("curl: (7) Failed to connect")
    with pytest.raises(completion.ResponseError):
        completion.completion_text(completion.Response(200, {}, "{}"))


def test_the_curl_posts_the_completion_from_the_node_network() -> None:
    argv = completion.curl_argv("nf-demo", "http://10.96.0.9:8000/v1/completions", {"model": "m"})
    assert argv[:5] == ["ip", "netns", "exec", "nf-demo", "curl"]
    assert argv[-2:] == ["-d", '{"model": "m"}']
    assert completion.served_model("hf://neuronfleet/tiny") == "neuronfleet/tiny"


def test_ready_endpoints_name_the_pods_behind_the_service() -> None:
    def endpoint(pod: str, ready: bool) -> dict[str, Any]:
        return {"conditions": {"ready": ready}, "nodeName": REAL_NODE, "targetRef": {"kind": "Pod", "name": pod}}

    slices: list[dict[str, Any]] = [
        {"endpoints": [endpoint("tiny-b", True), endpoint("tiny-old", False)]},
        {"endpoints": None},
    ]
    assert completion.ready_endpoints(slices) == [("tiny-b", REAL_NODE)]


def column(header: str, row: str, name: str) -> str:
    """One column of a kubectl table row, by where its header starts (a blank cell stays blank)."""
    start = header.index(name)
    return row[start:].split(" ", 1)[0]


def test_demo_serves_through_the_service_on_the_real_node_and_tears_down() -> None:
    name = f"demo-test-{os.getpid()}"
    started = time.monotonic()
    ran = run_program(
        [str(SCRIPTS / "neuronfleet-dev"), "demo", "--exit-when-ready", "--name", name],
        timeout=1200,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "250", "NO_COLOR": "1"},
    )
    output = ran.stdout + ran.stderr
    print(f"demo ran {time.monotonic() - started:.0f} s:\n{output}")
    assert ran.returncode == 0, output
    assert_the_demo_story(output, name)
    assert LocalCluster.find(name) is None, "the demo left its cluster behind"


def assert_the_demo_story(output: str, name: str) -> None:
    """What the demo printed: the operator's pod, the stages in order, the completion through the Service."""
    lines = output.splitlines()

    def at(text: str) -> int:
        found = [i for i, line in enumerate(lines) if text in line]
        assert found, f"no {text!r} in:\n{output}"
        return found[0]

    # The chart installed, the operator's pod up, the stages reached in order, then the completion.
    order = [at("helm install neuronfleet"), at("operator pod neuronfleet-system/")]
    order += [at(f"✓ {stage}") for stage in ("Validated", "Compiling", "Rolling out", "Ready")]
    order += [at("X-Neuronfleet-Artifact:"), at("done: every process stopped")]
    assert order == sorted(order), output
    # The operator ran in-cluster, on the real node, from the image built from this checkout.
    operator = lines[at("operator pod neuronfleet-system/")]
    # Named by the key of this checkout's inputs (computed, not built: a build here could prune another's).
    key = checkout_key("operator", ROOT, file_digest(base_archive()))
    assert f"running on {REAL_NODE} from localhost/neuronfleet/operator:{key}," in operator, operator
    assert "as serviceaccount neuronfleet-system/neuronfleet" in operator
    # kubectl get nis: Ready, the one replica ready, at the artifact the operator compiled.
    header, row = lines[at("NAME ")], lines[at("NAME ") + 1]
    assert row.startswith("tiny "), row
    assert (column(header, row, "PHASE"), column(header, row, "READY")) == ("Ready", "1"), row
    revision = column(header, row, "REVISION")
    assert column(header, row, "ARTIFACT") == f"tiny-{revision}"
    # The completion went through the Service from the node's network, to the pod the operator rolled out.
    assert f"ip netns exec nf-{name} curl" in lines[at("(through Service demo/tiny")]
    served = re.search(r"HTTP 200, X-Neuronfleet-Artifact: (\w+), served by pod (tiny-\S+) on (\S+)$", output, re.M)
    assert served is not None, output
    assert (served.group(1), served.group(3)) == (revision, REAL_NODE)
    assert re.search(r"'The capital of France is' -> '\S", output), output
    assert f"kubectl --kubeconfig /tmp/neuronfleet-{name}-" in output
