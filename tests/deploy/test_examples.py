"""examples/: each is a valid service that the API server admits, and fits the instance it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.operator.api import API_VERSION, parse_service_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def load(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(path.read_text())
    return body


def test_the_issue_examples_are_there() -> None:
    specs = {path.stem: parse_service_spec(load(path)["spec"]) for path in EXAMPLES}
    small = specs["llama-3.1-8b-inf2"]
    assert small.instance_type.startswith("inf2.")
    assert "Llama-3.1-8B" in small.model.uri
    large = specs["llama-3.1-70b-trn2"]
    assert (large.instance_type, large.engine.tensor_parallel_size) == ("trn2.48xlarge", 32)
    assert "Llama-3.1-70B" in large.model.uri
    assert large.neuron_devices == 8, "TP 32 is 8 Trainium2 devices at 4 logical cores each"
    through_dra = specs["llama-3.1-70b-trn2-dra"]
    assert (through_dra.placement.devices, through_dra.neuron_devices) == ("dra", 4), "at LNC=1, 8 cores a device"
    long = specs["long-context-chunked-prefill"]
    # Chunked prefill: prompts up to max_model_len run as chunks of at most max_num_batched_tokens.
    assert long.engine.max_model_len >= 8 * long.engine.max_num_batched_tokens
    assert long.engine.effective_num_batched_tokens_buckets[-1] == long.engine.max_num_batched_tokens


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_a_complete_service(path: Path) -> None:
    body = load(path)
    assert (body["apiVersion"], body["kind"]) == (API_VERSION, "NeuronInferenceService")
    spec = parse_service_spec(body["spec"])
    # Every bucket set written out: what is compiled is what the file says, and `kubectl get` shows it.
    assert spec.engine.num_batched_tokens_buckets is not None
    assert spec.engine.num_seqs_buckets is not None
    # The examples keep their artifacts on a claim (docs/deploy.md says how to use s3:// instead).
    assert spec.compile.store_kind == "pvc", spec.compile.artifact_store
    assert "namespace" not in body["metadata"], "applied with -n"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_passes_admission(path: Path, cluster: LocalCluster, crds: Path, namespace: str) -> None:
    applied = cluster.kubectl(
        "apply", "--server-side", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", str(path)
    )
    assert applied.returncode == 0, applied.stderr
    assert (
        applied.stdout.strip()
        == f"neuroninferenceservice.neuronfleet.io/{load(path)['metadata']['name']} serverside-applied (server dry run)"
    )


def test_admission_dry_run_rejects_a_broken_example(
    cluster: LocalCluster, crds: Path, namespace: str, tmp_path: Path
) -> None:
    """The dry run above is the real admission: the same example, one bucket off, is refused."""
    body = load(ROOT / "examples" / "llama-3.1-70b-trn2.yaml")
    body["spec"]["engine"]["num_seqs_buckets"] = [1, 4, 8]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(body))
    applied = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", str(broken))
    assert applied.returncode != 0
    assert "Last bucket in num_seqs_buckets must equal max_num_seqs (16), got 8" in applied.stderr
