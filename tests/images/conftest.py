"""The images, built (or found up to date) once per session, and run from the build store that holds them."""

from __future__ import annotations

import pytest
from harness.image_runner import RunnableImage, runnable

from neuronfleet.devcluster.images.dockerfile import BuiltImage, build


@pytest.fixture(scope="session")
def operator_built() -> BuiltImage:
    return build("operator")


@pytest.fixture(scope="session")
def engine_built() -> BuiltImage:
    return build("engine")


@pytest.fixture(scope="module")
def operator_image(operator_built: BuiltImage) -> RunnableImage:
    return runnable(operator_built)


@pytest.fixture(scope="module")
def engine_image(engine_built: BuiltImage) -> RunnableImage:
    return runnable(engine_built)
