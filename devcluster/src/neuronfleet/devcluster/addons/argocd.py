"""Argo CD beside a cluster, installed as a user installs it, and a Git repository it syncs from.

The pinned Argo CD (``tools/argocd``: one binary, each component chosen by ``ARGOCD_BINARY_NAME``) runs the
parts GitOps needs, as processes of the rig against the cluster's kube-apiserver (as the autoscaling rig runs
KEDA), on the host's loopback:

- Redis, Argo CD's cache (Debian's ``redis-server``);
- the repo server, which clones the repository and renders it (``git``, and the rig's ``helm`` for charts);
- the application controller, which compares, syncs and assesses health. ``ARGOCD_FAKE_IN_CLUSTER`` makes it
  reach ``https://kubernetes.default.svc`` through the cluster's admin kubeconfig, as Argo CD's own local
  runs do.

What a user applies is applied as they would: the release's CRDs, namespace ``argocd`` with ``argocd-cm``
(the health checks of ``argocd/argocd-cm-health.yaml`` merged in, as docs/deploy.md tells users to patch it),
``argocd-cmd-params-cm``, ``argocd-rbac-cm`` and ``argocd-secret``, and the ``default`` AppProject (which
argocd-server, not run here, would create). Each process gets the environment its workload manifest in the
release maps from those ConfigMaps (``tools/argocd/build.sh`` copies the manifests beside the binary), so a
setting changes Argo CD here as it would in a cluster; only ports and the namespace are flags, as a pod would
not need them.

The repository is a local one, served as ``file://`` (Argo CD supports the scheme; its own end-to-end tests
use it). Processes are recorded in the cluster's state, so ``cluster down`` and ``cluster reap`` stop them.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.controlplane.api import ApiError
from neuronfleet.devcluster.errors import RigError
from neuronfleet.devcluster.process.managed import ManagedProcess, ProcessNotReadyError, free_ports, stop_all
from neuronfleet.devcluster.process.state import save
from neuronfleet.devcluster.process.tools import ToolsMissingError, bin_dir

Obj = dict[str, Any]

NAMESPACE = "argocd"
API_VERSION = "argoproj.io/v1alpha1"
#: Argo CD's settings informers select ConfigMaps and Secrets by this label.
PART_OF = {"app.kubernetes.io/part-of": "argocd"}
#: Set on an Application, makes the controller compare it now; ``hard`` also drops the rendered manifests.
REFRESH_ANNOTATION = "argocd.argoproj.io/refresh"
#: The controller compares every Application this often (argocd-cm ``timeout.reconciliation``; Argo CD's
#: default is 3 minutes): a test's commit is seen without waiting for a webhook there is none of.
RECONCILIATION = "10s"
#: Argo CD's settings, as the release's workloads read them from ``argocd-cmd-params-cm``.
CMD_PARAMS: dict[str, str] = {
    # The rig's processes talk over loopback: no TLS between them.
    "reposerver.disable.tls": "true",
    "controller.repo.server.plaintext": "true",
    # Keeps each resource's health (with our checks' messages) in the Application's status.resources.
    "controller.resource.health.persist": "true",
    # Self-heal at once: Argo CD's backoff starts at 2 s.
    "controller.self.heal.timeout.seconds": "0",
    "controller.log.format": "text",
    "reposerver.log.format": "text",
}
#: The workload manifests ``tools/argocd/build.sh`` copies, by component.
WORKLOADS = {
    "argocd-repo-server": "argocd-repo-server-deployment.yaml",
    "argocd-application-controller": "argocd-application-controller-statefulset.yaml",
}


class ArgoCdError(RigError):
    """Argo CD could not be started, or a command against it failed."""


def argocd_binary() -> Path:
    """The pinned Argo CD binary (``tools/argocd/build.sh``)."""
    path = bin_dir("argocd") / "argocd"
    if not path.is_file():
        raise ToolsMissingError(f"Argo CD is not built ({path} is missing): run `make tools`")
    return path


def release_file(folder: str, name: str) -> Path:
    """A file the build copied beside the binary from the pinned release (``crds/``, ``workloads/``)."""
    path = bin_dir("argocd").parent / folder / name
    if not path.is_file():
        raise ToolsMissingError(f"{path} is missing: run `make tools`")
    return path


def health_patch() -> Path:
    """``argocd/argocd-cm-health.yaml`` of the checkout this package is installed from (a link tree into it)."""
    for parent in Path(__file__).resolve().parents:
        patch = parent / "argocd" / "argocd-cm-health.yaml"
        if patch.is_file():
            return patch
    raise ArgoCdError("argocd/argocd-cm-health.yaml not found: run from a neuronfleet checkout")


def argocd_cm(health: Path) -> Obj:
    """``argocd-cm``: the health checks of the patch at ``health`` (as a user merges it), a short reconciliation."""
    patch: Obj = yaml.safe_load(health.read_text())
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "argocd-cm", "namespace": NAMESPACE, "labels": PART_OF},
        # No jitter (Argo CD adds up to a minute by default): each comparison comes when due.
        "data": {**patch["data"], "timeout.reconciliation": RECONCILIATION, "timeout.reconciliation.jitter": "0s"},
    }


def workload_env(workload: Path, config_maps: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """The environment the kubelet would give the workload's container from ``config_maps`` (name -> data).

    Only ``configMapKeyRef`` values are resolved; a key the ConfigMap lacks is left out, as the manifests
    mark every such reference optional.
    """
    body: Obj = yaml.safe_load(workload.read_text())
    env: dict[str, str] = {}
    for entry in body["spec"]["template"]["spec"]["containers"][0].get("env", []):
        ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
        if ref is None:
            continue
        value = config_maps.get(ref["name"], {}).get(ref["key"])
        if value is not None:
            env[entry["name"]] = value
    return env


def default_project() -> Obj:
    """The ``default`` AppProject argocd-server creates on its first start: any repository, any destination."""
    return {
        "apiVersion": API_VERSION,
        "kind": "AppProject",
        "metadata": {"name": "default", "namespace": NAMESPACE},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"server": "*", "namespace": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
        },
    }


@dataclass(frozen=True)
class Ports:
    """The rig's loopback ports."""

    redis: int
    repo_server: int
    repo_server_metrics: int
    controller_metrics: int

    @classmethod
    def pick(cls) -> Ports:
        """Free loopback ports."""
        return cls(*free_ports(4))


@dataclass
class ArgoCd:
    """A running Argo CD (Redis, repo server, application controller) against a cluster."""

    cluster: LocalCluster
    directory: Path
    processes: list[ManagedProcess] = field(default_factory=list)
    #: Seconds :meth:`start` took.
    started_in: float = 0.0

    @classmethod
    def start(cls, cluster: LocalCluster, *, health: Path | None = None, timeout: float = 120.0) -> ArgoCd:
        """Install Argo CD's CRDs and settings into ``cluster`` and start its processes; return once both
        components answer their health checks."""
        begun = time.monotonic()
        binary = argocd_binary()
        workloads = {name: release_file("workloads", manifest) for name, manifest in WORKLOADS.items()}
        directory = cluster.state.workdir / "argocd"
        directory.mkdir()
        ports = Ports.pick()
        rig = cls(cluster, directory)
        try:
            config_maps = rig._install(argocd_cm(health or health_patch()), ports)
            redis = rig._spawn(
                "argocd-redis",
                ["redis-server", "--bind", "127.0.0.1", "--port", str(ports.redis), "--save", "", "--appendonly", "no"],
                {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
            rig._wait(redis, "Redis to answer", lambda: _redis_answers(ports.redis), timeout)
            repo = rig._spawn(
                "argocd-repo-server",
                [
                    str(binary),
                    f"--port={ports.repo_server}",
                    "--address=127.0.0.1",
                    f"--metrics-port={ports.repo_server_metrics}",
                    "--metrics-address=127.0.0.1",
                ],
                rig._env("argocd-repo-server", workloads, config_maps),
            )
            controller = rig._spawn(
                "argocd-application-controller",
                [str(binary), f"--metrics-port={ports.controller_metrics}", f"--namespace={NAMESPACE}"],
                rig._env("argocd-application-controller", workloads, config_maps),
            )
            rig._wait(
                repo, "the repo server's /healthz", f"http://127.0.0.1:{ports.repo_server_metrics}/healthz", timeout
            )
            rig._wait(
                controller, "the controller's /healthz", f"http://127.0.0.1:{ports.controller_metrics}/healthz", timeout
            )
        except BaseException:
            rig.stop()
            raise
        rig.started_in = time.monotonic() - begun
        return rig

    def _install(self, cm: Obj, ports: Ports) -> dict[str, dict[str, str]]:
        """Apply the CRDs, namespace, settings and project; the ConfigMaps' data, by name."""
        crds = release_file("crds", "application-crd.yaml").parent
        self.cluster.install_crds(crds, "Argo CD's CRDs")
        params = {
            **CMD_PARAMS,
            "redis.server": f"127.0.0.1:{ports.redis}",
            "repo.server": f"127.0.0.1:{ports.repo_server}",
        }
        objects: list[Obj] = [
            cm,
            _config_map("argocd-cmd-params-cm", params),
            # Nobody logs in: there is no argocd-server. Read-only for anyone, as the release ships it empty.
            _config_map("argocd-rbac-cm", {"policy.default": "role:readonly"}),
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "argocd-secret", "namespace": NAMESPACE, "labels": PART_OF},
                "stringData": {"server.secretkey": secrets.token_urlsafe(32)},
            },
            default_project(),
        ]
        with self.cluster.admin_api() as api:
            api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
            for body in objects:
                api.request("POST", api.path(body["apiVersion"], body["kind"], NAMESPACE), body)
        return {"argocd-cm": cm["data"], "argocd-cmd-params-cm": params}

    def _env(
        self, component: str, workloads: Mapping[str, Path], config_maps: Mapping[str, Mapping[str, str]]
    ) -> dict[str, str]:
        helm = bin_dir("kube")
        home = self.directory / component
        for sub in ("tls", "ssh", "gpg", "tmp"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        return {
            **workload_env(workloads[component], config_maps),
            "ARGOCD_BINARY_NAME": component,
            "ARGOCD_FAKE_IN_CLUSTER": "true",
            "KUBECONFIG": str(self.cluster.kubeconfig),
            # The rig's helm renders charts; git comes from Debian.
            "PATH": f"{helm}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(home),
            "TMPDIR": str(home / "tmp"),
            # What the release mounts from argocd-tls-certs-cm, argocd-ssh-known-hosts-cm and argocd-gpg-keys-cm.
            "ARGOCD_TLS_DATA_PATH": str(home / "tls"),
            "ARGOCD_SSH_DATA_PATH": str(home / "ssh"),
            "ARGOCD_GNUPGHOME": str(home / "gpg"),
            "ARGOCD_GPG_ENABLED": "false",
        }

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> ManagedProcess:
        process = ManagedProcess.spawn(name, argv, self.directory / f"{name}.log", cwd=self.directory, env=env)
        self.processes.append(process)
        # Recorded with the cluster's own, so `cluster down` and the reaper stop it after a crash too.
        self.cluster.state.processes.append(process.record)
        save(self.cluster.state)
        return process

    def _wait(self, process: ManagedProcess, what: str, probe: str | Callable[[], bool], timeout: float) -> None:
        try:
            process.wait_ready(probe, timeout=timeout, what=what, interval=0.5)
        except ProcessNotReadyError as error:
            raise ArgoCdError(str(error)) from None

    def application(self, name: str) -> Obj | None:
        """An Application, or None while it does not exist."""
        with self.cluster.admin_api() as api:
            return api.get(api.path(API_VERSION, "Application", NAMESPACE, name))

    def apply(self, application: Obj) -> None:
        """Create an Application (or replace its spec), as ``kubectl apply`` of a user's file."""
        path = self.directory / f"application-{application['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(application))
        applied = self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        if applied.returncode != 0:
            raise ArgoCdError(f"applying {path.name} failed: {applied.stderr.strip()}")

    def refresh(self, name: str, kind: str = "hard") -> None:
        """Ask the controller to compare the Application with Git now, as ``argocd app get --hard-refresh``."""
        patch = {"metadata": {"annotations": {REFRESH_ANNOTATION: kind}}}
        with self.cluster.admin_api() as api:
            try:
                api.request(
                    "PATCH",
                    api.path(API_VERSION, "Application", NAMESPACE, name),
                    patch,
                    content_type="application/merge-patch+json",
                )
            except ApiError as error:
                raise ArgoCdError(f"refreshing {name}: {error}") from None

    def refreshed(self, name: str) -> bool:
        """Whether the controller has done the refresh :meth:`refresh` asked for (it drops the annotation then)."""
        found = self.application(name) or {}
        return REFRESH_ANNOTATION not in (found.get("metadata", {}).get("annotations") or {})

    def logs(self) -> dict[str, str]:
        """The end of each process's log, for a failing test."""
        return {p.record.name: p.tail(60) for p in self.processes}

    def stop(self) -> None:
        """Stop the processes (Argo CD's objects stay: the cluster goes with its test session)."""
        if not stop_all(self.processes, grace=5):
            raise ArgoCdError(f"could not stop {', '.join(p.record.name for p in self.processes if p.alive())}")
        pids = {p.pid for p in self.processes}
        self.cluster.state.processes = [r for r in self.cluster.state.processes if r.pid not in pids]
        save(self.cluster.state)


def _config_map(name: str, data: dict[str, str]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": PART_OF},
        "data": data,
    }


def _redis_answers(port: int) -> bool:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, timeout=5, check=False
    )
    return done.stdout.strip() == "PONG"


@dataclass
class GitRepo:
    """A local Git repository, Argo CD's source as ``file://``; each :meth:`commit` is one revision."""

    path: Path
    branch: str = "main"

    @property
    def url(self) -> str:
        """What an Application's ``repoURL`` names."""
        return f"file://{self.path}"

    @classmethod
    def init(cls, path: Path) -> GitRepo:
        """An empty repository at ``path``."""
        repo = cls(path)
        path.mkdir(parents=True)
        repo.git("init", "--quiet", f"--initial-branch={repo.branch}")
        return repo

    def git(self, *args: str) -> str:
        """Run git in the repository; its output."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.path.parent),
            "GIT_AUTHOR_NAME": "neuronfleet tests",
            "GIT_AUTHOR_EMAIL": "tests@neuronfleet.invalid",
            "GIT_COMMITTER_NAME": "neuronfleet tests",
            "GIT_COMMITTER_EMAIL": "tests@neuronfleet.invalid",
        }
        done = subprocess.run(
            ["git", "-C", str(self.path), *args], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        if done.returncode != 0:
            raise ArgoCdError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def commit(self, message: str, *, write: Mapping[str, str] | None = None, remove: tuple[str, ...] = ()) -> str:
        """Write files (path relative to the repository -> text), remove others, commit all; the new revision."""
        for relative, text in (write or {}).items():
            target = self.path / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        for relative in remove:
            self.git("rm", "--quiet", "-r", relative)
        self.git("add", "--all")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD").strip()
