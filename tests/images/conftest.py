"""The images, built (or found up to date) once per session, and loaded for running commands inside them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from harness.image_runner import RunnableImage, loaded

from neuronfleet.devcluster.images.dockerfile import BuiltImage, build


@pytest.fixture(scope="session")
def operator_archive() -> BuiltImage:
    return build("operator")


@pytest.fixture(scope="session")
def engine_archive() -> BuiltImage:
    return build("engine")


@pytest.fixture(scope="module")
def operator_image(operator_archive: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnableImage]:
    yield from loaded(operator_archive, tmp_path_factory.mktemp("podman-operator"))


@pytest.fixture(scope="module")
def engine_image(engine_archive: BuiltImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunnableImage]:
    yield from loaded(engine_archive, tmp_path_factory.mktemp("podman-engine"))
