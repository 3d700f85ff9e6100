"""GitOps through a real Argo CD (:mod:`neuronfleet.devcluster.addons.argocd`): the repository's layout, the
Applications, and Argo CD's own view of them, polled and kept with timestamps.

The repository holds what a user's would: ``crds/``, ``charts/neuronfleet``, ``apps/`` (the Applications of
``argocd/applications.yaml``, pointed at the repository) and ``services/``. One parent Application (app of
apps) syncs ``apps/``; its waves put the CRDs first, then the operator's chart, then the services.
"""

from __future__ import annotations

import copy
import datetime
import json
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from neuronfleet.devcluster.addons import argocd
from neuronfleet.devcluster.addons.argocd import ArgoCd, GitRepo
from neuronfleet.devcluster.cluster.local import LocalCluster
from neuronfleet.devcluster.process.waiting import wait_for

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
PARENT, CRDS_APP, OPERATOR_APP, SERVICES_APP = (
    "neuronfleet",
    "neuronfleet-crds",
    "neuronfleet-operator",
    "neuronfleet-services",
)
#: A label Argo CD owns on each service (it is in Git): the drift tests edit it by hand.
TEAM = {"team": "llm"}
#: How long a wait on Argo CD may take by default: a compile and a rollout on the real node.
TIMEOUT_S = 600


def parsed(stamp: str | None) -> float:
    """An API timestamp (RFC 3339, whole seconds) as Unix seconds; 0 when absent."""
    return datetime.datetime.fromisoformat(stamp).timestamp() if stamp else 0.0


@dataclass(frozen=True)
class Seen:
    """One change in what Argo CD reports for an Application."""

    at: float
    app: str
    sync: str
    health: str
    operation: str
    revision: str
    #: The health Argo CD gives each service (status.resources), as "name: status: message".
    services: tuple[str, ...]


class ArgoLog:
    """Polls the Applications every half second; keeps every change, with when it was seen."""

    def __init__(self, argo: ArgoCd, apps: tuple[str, ...]) -> None:
        self.argo = argo
        self.apps = apps
        self.seen: list[Seen] = []
        self._last: dict[str, tuple[str, ...]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="argo-log", daemon=True)
        self._thread.start()

    def _sample(self, name: str) -> None:
        app = self.argo.application(name)
        if app is None:
            return
        status = app.get("status") or {}
        services = tuple(
            f"{r['name']}: {r.get('health', {}).get('status')}: {r.get('health', {}).get('message', '')}"
            for r in status.get("resources", [])
            if r["kind"] == "NeuronInferenceService"
        )
        sync = (status.get("sync") or {}).get("status", "-")
        health = (status.get("health") or {}).get("status", "-")
        operation = (status.get("operationState") or {}).get("phase", "-")
        revision = ((status.get("sync") or {}).get("revision") or "-")[:8]
        state = (sync, health, operation, revision, *services)
        if self._last.get(name) != state:
            self._last[name] = state
            self.seen.append(Seen(time.time(), name, sync, health, operation, revision, services))

    def _run(self) -> None:
        while not self._stop.is_set():
            for name in self.apps:
                try:
                    self._sample(name)
                except Exception as error:  # a slow read: the next round samples again
                    self.seen.append(Seen(time.time(), name, "?", "?", repr(error)[:80], "-", ()))
            self._stop.wait(0.5)

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(timeout=10)

    def since(self, start: float, app: str = SERVICES_APP) -> list[Seen]:
        """What ``app`` reported from ``start`` on."""
        return [s for s in self.seen if s.app == app and s.at >= start]

    def print(self, test: str, start: float) -> None:
        """Every change from ``start`` on, in seconds from it: for the log and the issue's note."""
        print(f"==> {test}: Argo CD's view (s, application, sync, health, operation, revision; services)", flush=True)
        for s in [s for s in self.seen if s.at >= start]:
            print(f"    {s.at - start:6.1f} {s.app} {s.sync} {s.health} {s.operation} {s.revision}", flush=True)
            for line in s.services:
                print(f"           {line}", flush=True)


def applications(repo: GitRepo, services_namespace: str, operator: Obj) -> list[Obj]:
    """``argocd/applications.yaml``, pointed at the repository and the services' namespace.

    ``operator`` holds the chart's destination namespace (``namespace``) and values to add (``values``).
    """
    apps = list(yaml.safe_load_all((ROOT / "argocd" / "applications.yaml").read_text()))
    for app in apps:
        app["spec"]["source"]["repoURL"] = repo.url
        app["spec"]["source"]["targetRevision"] = repo.branch
    by_name = {app["metadata"]["name"]: app for app in apps}
    chart = by_name[OPERATOR_APP]["spec"]
    chart["destination"]["namespace"] = operator["namespace"]
    chart["source"]["helm"]["valuesObject"].update(operator["values"])
    services = by_name[SERVICES_APP]["spec"]
    services["destination"]["namespace"] = services_namespace
    services["source"] = {"repoURL": repo.url, "targetRevision": repo.branch, "path": "services"}
    return apps


def make_repository(path: Path, apps: Callable[[GitRepo], list[Obj]], services: dict[str, Obj]) -> GitRepo:
    """The repository with its first commit: the CRDs, the chart, ``apps(repo)`` and the services."""
    repo = GitRepo.init(path)
    shutil.copytree(ROOT / "crds", repo.path / "crds")
    shutil.copytree(ROOT / "charts" / "neuronfleet", repo.path / "charts" / "neuronfleet")
    repo.commit(
        "neuronfleet: CRDs, operator, services",
        write={
            "apps/applications.yaml": yaml.safe_dump_all(apps(repo)),
            **{f"services/{name}.yaml": yaml.safe_dump(body) for name, body in services.items()},
        },
    )
    return repo


def parent_application(repo: GitRepo) -> Obj:
    """The app of apps: ``apps/`` of the repository, synced in waves."""
    return {
        "apiVersion": argocd.API_VERSION,
        "kind": "Application",
        "metadata": {"name": PARENT, "namespace": argocd.NAMESPACE},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo.url, "targetRevision": repo.branch, "path": "apps"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": argocd.NAMESPACE},
            "syncPolicy": {"automated": {"prune": True, "selfHeal": True}},
        },
    }


@dataclass
class GitOps:
    """The repository, Argo CD, and the services it deploys."""

    cluster: LocalCluster
    argo: ArgoCd
    repo: GitRepo
    log: ArgoLog
    #: Where the services are.
    namespace: str
    #: The services in Git, by name.
    services: dict[str, Obj] = field(default_factory=dict)

    def commit(self, message: str, changed: dict[str, Obj | None]) -> tuple[str, float]:
        """Commit services (None removes one) and ask Argo CD to look; the revision, and when it was committed."""
        write = {f"services/{name}.yaml": yaml.safe_dump(body) for name, body in changed.items() if body is not None}
        remove = tuple(f"services/{name}.yaml" for name, body in changed.items() if body is None)
        committed_at = time.time()
        revision = self.repo.commit(message, write=write, remove=remove)
        for name, body in changed.items():
            if body is None:
                self.services.pop(name)
            else:
                self.services[name] = body
        self.argo.refresh(SERVICES_APP)
        return revision, committed_at

    def revert(self, revision: str) -> tuple[str, float]:
        """``git revert`` a commit, as a user rolls back, and ask Argo CD to look; the revision, and when."""
        reverted_at = time.time()
        self.repo.git("revert", "--no-edit", revision)
        for name in list(self.services):
            path = self.repo.path / "services" / f"{name}.yaml"
            if path.is_file():
                self.services[name] = yaml.safe_load(path.read_text())
            else:
                self.services.pop(name)
        self.argo.refresh(SERVICES_APP)
        return self.head(), reverted_at

    def app(self, name: str = SERVICES_APP) -> Obj:
        """An Application's status (empty while it has none)."""
        found = self.argo.application(name) or {}
        return dict(found.get("status") or {})

    def head(self) -> str:
        """The repository's newest revision."""
        return self.repo.git("rev-parse", "HEAD").strip()

    def get(self, kind: str, name: str = "") -> Obj:
        """An object (or, without a name, a list) of the services' namespace, as JSON."""
        done = self.cluster.kubectl("get", kind, *([name] if name else []), "-n", self.namespace, "-o", "json")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def owners(self, artifact_hash: str) -> set[str]:
        """The services that hold the artifact of ``artifact_hash`` (its owner references)."""
        found = [a for a in self.get("nca")["items"] if a["metadata"]["name"].endswith(artifact_hash)]
        assert len(found) == 1, [a["metadata"]["name"] for a in found]
        return {ref["name"] for ref in found[0]["metadata"].get("ownerReferences", [])}

    def wait_app(
        self, check: Callable[[Obj], Any], what: str, name: str = SERVICES_APP, timeout: float = TIMEOUT_S
    ) -> Any:
        """Poll an Application's status until ``check`` returns something true; show Argo CD's logs if never."""
        try:
            return wait_for(lambda: check(self.app(name)), timeout=timeout, interval=0.5, what=f"{name}: {what}")
        except Exception:
            for component, tail in self.argo.logs().items():
                print(f"--- {component} ---\n{tail}", flush=True)
            raise

    def synced_healthy(self, revision: str, name: str = SERVICES_APP) -> Callable[[Obj], bool]:
        """Synced to ``revision`` and Healthy."""
        return lambda s: (
            s.get("sync", {}).get("status") == "Synced"
            and s.get("sync", {}).get("revision") == revision
            and s.get("health", {}).get("status") == "Healthy"
        )


def service_health(status: Obj, name: str) -> Obj:
    """The health Argo CD gives one service (persisted in status.resources); empty while none."""
    found = [r for r in status.get("resources", []) if r["kind"] == "NeuronInferenceService" and r["name"] == name]
    return dict(found[0].get("health") or {}) if found else {}


def in_git(manifest: Obj, name: str) -> Obj:
    """A service as the repository holds it: named, with the label Argo CD owns."""
    body = copy.deepcopy(manifest)
    body["metadata"] = {"name": name, "labels": dict(TEAM)}
    return body


def sharer(manifest: Obj, name: str) -> Obj:
    """Another service of the same compiled identity as ``manifest``, autoscaled (its scale subresource is KEDA's)."""
    body = in_git(manifest, name)
    body["spec"].pop("replicas")
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2}
    return body
