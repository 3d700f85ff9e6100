"""The real node's pure parts: the egress proxy's rules, the runc wrapper's parsing, the cgroup remount
plan, the capacity check and the images' OCI archives (no root, no cluster)."""

from __future__ import annotations

import ipaddress
import json
import tarfile
from pathlib import Path

from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.images.runc_norlimits import flag_value, subcommand, without_rlimits
from neuronfleet.devcluster.realnode.capacity import needs_patch, neuron_capacity
from neuronfleet.devcluster.realnode.egress_proxy import allowed, connect_target
from neuronfleet.devcluster.realnode.namespace import Mount, cgroup_mounts

NETWORKS = [ipaddress.ip_network(n) for n in ("10.240.255.254/32", "10.245.0.0/24")]


def test_connect_target_reads_only_connect_requests() -> None:
    assert connect_target(b"CONNECT 10.245.0.3:8080 HTTP/1.1\r\nHost: x\r\n\r\n") == ("10.245.0.3", 8080)
    assert connect_target(b"CONNECT [fd00::1]:443 HTTP/1.1\r\n\r\n") == ("fd00::1", 443)
    assert connect_target(b"GET / HTTP/1.1\r\n\r\n") is None
    assert connect_target(b"CONNECT 10.245.0.3 HTTP/1.1\r\n\r\n") is None


def test_only_addresses_in_the_node_networks_are_allowed() -> None:
    assert allowed("10.245.0.7", NETWORKS)
    assert allowed("10.240.255.254", NETWORKS)
    # A KWOK node's address, anything outside, and names (never resolved) are refused.
    assert not allowed("10.240.0.1", NETWORKS)
    assert not allowed("8.8.8.8", NETWORKS)
    assert not allowed("cpu-0", NETWORKS)


def test_runc_arguments_are_parsed_past_global_flags() -> None:
    args = ["--root", "/run/runc", "--log", "/x.log", "create", "--bundle", "/b", "id"]
    assert subcommand(args) == "create"
    assert flag_value(args, "--bundle", "-b") == "/b"
    assert flag_value(["exec", "--process=/p.json", "id"], "--process", "-p") == "/p.json"
    assert subcommand(["--debug"]) is None


def test_rlimits_are_dropped_and_the_rest_kept() -> None:
    process = {"args": ["sh"], "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]}
    assert without_rlimits(process)
    assert process == {"args": ["sh"]}
    assert not without_rlimits(process)


def test_cgroup_mounts_are_read_from_mountinfo() -> None:
    mountinfo = "\n".join(
        [
            "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755",
            "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu",
            "40 31 0:35 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate",
            "50 23 0:40 / /proc rw - proc proc rw",
        ]
    )
    assert cgroup_mounts(mountinfo) == [
        Mount("/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
        Mount("/sys/fs/cgroup/unified", "cgroup2", "rw,nsdelegate"),
    ]


def test_capacity_is_patched_only_when_missing_or_different() -> None:
    capacity = neuron_capacity("trn2.48xlarge")
    assert capacity == {"aws.amazon.com/neuron": "16", "aws.amazon.com/neuroncore": "64"}
    assert needs_patch({"status": {"capacity": {"cpu": "2"}}}, capacity)
    assert needs_patch({"status": {"capacity": {**capacity, "aws.amazon.com/neuron": "1"}}}, capacity)
    assert not needs_patch({"status": {"capacity": {"cpu": "2", **capacity}}}, capacity)


def test_oci_archive_names_the_image_and_matches_its_digests(tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as archive:
        archive.add(__file__, "hello")
    path = node_images.write_oci_archive(
        tmp_path / "image.tar", "localhost/x:1", layer, user="1000:1000", Cmd=["hello"]
    )
    with tarfile.open(path) as archive:
        index = json.loads(archive.extractfile("index.json").read())  # type: ignore[union-attr]
        entry = index["manifests"][0]
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == "localhost/x:1"
        manifest = json.loads(archive.extractfile(f"blobs/sha256/{entry['digest'][7:]}").read())  # type: ignore[union-attr]
        config = json.loads(archive.extractfile(f"blobs/sha256/{manifest['config']['digest'][7:]}").read())  # type: ignore[union-attr]
        assert config["config"]["User"] == "1000:1000"
        assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]
        # One history entry per layer: buildah's layered builds refuse a base image without them.
        assert len(config["history"]) == len(config["rootfs"]["diff_ids"])
        assert archive.getmember(f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}").size == layer.stat().st_size


def test_content_key_changes_with_any_input() -> None:
    assert node_images.content_key("a", "b") == node_images.content_key("a", "b")
    assert node_images.content_key("a", "b") != node_images.content_key("ab")
    assert node_images.content_key("a") != node_images.content_key(b"b")
