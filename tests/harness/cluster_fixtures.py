"""pytest fixtures for tests against a real local control plane.

Loaded for every test by ``tests/conftest.py`` (``pytest_plugins = ["harness.cluster_fixtures"]``). The
cluster starts on first use, once per session; a cluster left by a crashed earlier run is reaped first.
The ``kubernetes`` package is imported only by tests that use the cluster, and nothing here imports the
operator.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from neuronfleet.devcluster.addons.autoscaling_rig import AutoscalingRig
from neuronfleet.devcluster.cluster.local import LocalCluster, reap_orphans
from neuronfleet.devcluster.controlplane.components import REAL_NODE
from neuronfleet.devcluster.images import node_images
from neuronfleet.devcluster.images.dockerfile import BuiltImage, build
from neuronfleet.devcluster.images.inputs import TARGETS, Target
from neuronfleet.devcluster.process.tools import NodeTools
from neuronfleet.devcluster.process.waiting import WaitFor, wait_for
from neuronfleet.devcluster.realnode import node
from neuronfleet.devcluster.realnode.node import RealNode
from neuronfleet.devcluster.realnode.store import NodeImageStore, OciImage
from neuronfleet.operator.plan import RouterImages

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, AppsV1Api, BatchV1Api, CoreV1Api


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """One local cluster for the whole session, owned by this process and stopped at the end."""
    reap_orphans()
    local = LocalCluster.start(f"pytest-{os.getpid()}", owner_pid=os.getpid())
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[LocalCluster]:
    """A second cluster for the session: the real node ``real-0`` (the one trn2.48xlarge) beside KWOK nodes.

    Started on first use, beside (never inside) the KWOK tests' ``cluster``, whose speed it leaves alone.
    The KWOK fleet has no trn2 node, so trn2.48xlarge pods land on the real node; inf2 services and compile
    Jobs land on KWOK nodes. Its containerd starts with the pause and base images and the Dockerfile's
    operator and engine images, unpacked into the node image store before it starts (minutes the first
    time a build is seen, nothing after: :mod:`neuronfleet.devcluster.realnode.store`).
    """
    reap_orphans()
    store = NodeImageStore.default(NodeTools.locate().directory)
    store.prepare([OciImage.of(build(target)) for target in TARGETS], say=lambda line: print(f"==> {line}", flush=True))
    local = LocalCluster.start(
        f"pytest-real-{os.getpid()}", fleet=node.fleet_beside(), owner_pid=os.getpid(), real_node=True
    )
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture(scope="session")
def real_node(real_cluster: LocalCluster) -> RealNode:
    """The real node of :func:`real_cluster`: its containerd (``ctr``, ``crictl``) and network namespace."""
    node = real_cluster.real_node
    assert node is not None
    return node


@pytest.fixture(scope="session")
def autoscaling_rig(real_cluster: LocalCluster) -> Iterator[AutoscalingRig]:
    """Prometheus scraping the real node's serving pods, and KEDA's operator and metrics adapter, for the session.

    Prometheus keeps the pods labelled as the operator labels serving pods, at their port named ``http``;
    a ScaledObject's prometheus trigger reaches it at ``rig.prometheus_url``. See
    :mod:`neuronfleet.devcluster.addons.autoscaling_rig`.
    """
    rig = AutoscalingRig.start(real_cluster)
    print(f"==> the autoscaling rig started in {rig.started_in:.1f} s", flush=True)
    try:
        yield rig
    finally:
        rig.stop()


#: An image built here, runnable on the real node (checked once per session), and returned.
NodeImage = Callable[[Target], BuiltImage]


@pytest.fixture(scope="session")
def node_image(real_node: RealNode) -> NodeImage:
    """:data:`NodeImage` for the real node: the operator or engine image, built (or up to date) and imported.

    Both were in the node's containerd from its start (:func:`real_cluster`); the import sends whatever a
    rebuild during the session changed.
    """
    imported: dict[Target, BuiltImage] = {}

    def load(target: Target) -> BuiltImage:
        if target not in imported:
            image = build(target)
            layers = real_node.import_image(OciImage.of(image))
            print(f"==> the {target} image is in {REAL_NODE}'s containerd ({layers} layers sent)", flush=True)
            imported[target] = image
        return imported[target]

    return load


@pytest.fixture(scope="session")
def router_images(real_node: RealNode) -> RouterImages:
    """The Endpoint Picker's and Envoy's images (:mod:`neuronfleet.devcluster.images.node_images`), built (or
    found cached) and imported into the real node; pods name them with ``imagePullPolicy: Never``."""
    for build_archive in (node_images.picker_image, node_images.envoy_image):
        image = OciImage.read(build_archive())
        layers = real_node.import_image(image)
        print(f"==> {image.name} is in {REAL_NODE}'s containerd ({layers} layers sent)", flush=True)
    return RouterImages(node_images.PICKER_IMAGE, node_images.ENVOY_IMAGE, picker_inflight_tokens=True)


@pytest.fixture(scope="session")
def crds(cluster: LocalCluster, pytestconfig: pytest.Config) -> Path:
    """The checked-in CRDs, applied as users apply them, and Established."""
    directory = pytestconfig.rootpath / "crds"
    cluster.install_crds(directory, "the CRDs")
    return directory


@pytest.fixture(scope="session")
def kube(cluster: LocalCluster) -> Iterator[ApiClient]:
    """A ``kubernetes`` API client authenticated as the cluster admin."""
    client = cluster.api_client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def core(kube: ApiClient) -> CoreV1Api:
    """The core API group (pods, nodes, namespaces, ...) as admin."""
    from kubernetes.client import CoreV1Api

    return CoreV1Api(kube)


@pytest.fixture
def apps(kube: ApiClient) -> AppsV1Api:
    """The apps API group (Deployments, ReplicaSets, ...) as admin."""
    from kubernetes.client import AppsV1Api

    return AppsV1Api(kube)


@pytest.fixture
def batch(kube: ApiClient) -> BatchV1Api:
    """The batch API group (Jobs) as admin."""
    from kubernetes.client import BatchV1Api

    return BatchV1Api(kube)


@pytest.fixture
def namespace(kube: ApiClient) -> Iterator[str]:
    """A fresh namespace for one test, deleted afterwards (without waiting for it to go)."""
    from kubernetes.client import CoreV1Api, V1Namespace, V1ObjectMeta

    core = CoreV1Api(kube)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name=name)))
    # Pods are refused until the controller manager has made the namespace's default ServiceAccount.
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=30,
        what=f"ServiceAccount default in namespace {name}",
    )
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> WaitFor:
    """:func:`neuronfleet.devcluster.process.waiting.wait_for`: poll within a named bound, report what was seen."""
    return wait_for
