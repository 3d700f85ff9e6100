"""The Argo CD add-on's pure parts: its settings, the environment the release's workloads map from them, the
Git repository (no cluster)."""

from __future__ import annotations

from pathlib import Path

import yaml

from neuronfleet.devcluster.addons.argocd import (
    CMD_PARAMS,
    PART_OF,
    RECONCILIATION,
    WORKLOADS,
    GitRepo,
    argocd_cm,
    health_patch,
    release_file,
    workload_env,
)

ROOT = Path(__file__).resolve().parents[2]


def test_argocd_cm_carries_our_health_checks_verbatim_and_a_short_reconciliation() -> None:
    patch = ROOT / "argocd" / "argocd-cm-health.yaml"
    assert health_patch() == patch
    cm = argocd_cm(patch)
    assert cm["metadata"]["labels"] == PART_OF
    data = cm["data"]
    for key, script in yaml.safe_load(patch.read_text())["data"].items():
        assert data[key] == script
    assert data["timeout.reconciliation"] == RECONCILIATION


def test_workload_env_resolves_config_map_keys_and_leaves_out_missing_ones(tmp_path: Path) -> None:
    def ref(name: str, key: str) -> dict[str, object]:
        return {"configMapKeyRef": {"name": name, "key": key, "optional": True}}

    container = {
        "name": "c",
        "env": [
            {"name": "A", "valueFrom": ref("cm", "a")},
            {"name": "B", "valueFrom": ref("cm", "b")},
            {"name": "C", "valueFrom": ref("other", "c")},
            {"name": "D", "value": "plain"},
        ],
    }
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump({"spec": {"template": {"spec": {"containers": [container]}}}}))
    assert workload_env(workload, {"cm": {"a": "1"}}) == {"A": "1"}


def test_every_setting_the_rig_writes_reaches_a_component_of_the_pinned_release() -> None:
    """A misspelt key would be silently ignored by Argo CD: each must be one a workload reads."""
    config_maps = {"argocd-cm": {"timeout.reconciliation": RECONCILIATION}, "argocd-cmd-params-cm": dict(CMD_PARAMS)}
    env = {name: workload_env(release_file("workloads", manifest), config_maps) for name, manifest in WORKLOADS.items()}
    controller, repo = env["argocd-application-controller"], env["argocd-repo-server"]
    assert controller["ARGOCD_APPLICATION_CONTROLLER_PERSIST_RESOURCE_HEALTH"] == "true"
    assert controller["ARGOCD_APPLICATION_CONTROLLER_REPO_SERVER_PLAINTEXT"] == "true"
    assert controller["ARGOCD_RECONCILIATION_TIMEOUT"] == RECONCILIATION
    assert repo["ARGOCD_REPO_SERVER_DISABLE_TLS"] == "true"
    read = set()
    for manifest in WORKLOADS.values():
        body = yaml.safe_load(release_file("workloads", manifest).read_text())
        for entry in body["spec"]["template"]["spec"]["containers"][0].get("env", []):
            key = (entry.get("valueFrom") or {}).get("configMapKeyRef", {}).get("key")
            read.add(key)
    assert set(CMD_PARAMS) <= read, set(CMD_PARAMS) - read


def test_a_commit_writes_and_removes_files_and_names_the_revision(tmp_path: Path) -> None:
    repo = GitRepo.init(tmp_path / "repo")
    assert repo.url == f"file://{tmp_path / 'repo'}"
    first = repo.commit("first", write={"services/a.yaml": "a: 1\n", "services/b.yaml": "b: 2\n"})
    second = repo.commit("second", remove=("services/b.yaml",))
    assert first != second
    assert repo.git("rev-parse", "HEAD").strip() == second
    assert repo.git("ls-files").split() == ["services/a.yaml"]
    assert repo.git("log", "--format=%s").split() == ["second", "first"]
