"""The built images, looked at from inside: what each holds, who runs it, and that its entrypoint works."""

from __future__ import annotations

import json

import pytest
from harness.image_runner import RunnableImage
from harness.lockfile import closure, load_lock, locked_versions, normalize

from neuronfleet.devcluster.images.layout import image_config

#: The environment's own distributions (not the base image's), as ``{name: version}``.
INSTALLED = (
    "import importlib.metadata as m, json, sysconfig;"
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions(path=[sysconfig.get_path('purelib')])}))"
)
#: Test code that must not ship: the project's tests and the test runners.
TEST_CODE = (
    "import importlib.util as u, json, pathlib, sysconfig;"
    "site = pathlib.Path(sysconfig.get_path('purelib'));"
    "found = lambda n: u.find_spec(n) is not None;"
    "paths = [site / 'tests', *site.glob('neuronfleet/**/tests'), pathlib.Path('/src')];"
    "print(json.dumps({'pytest': found('pytest'), 'hypothesis': found('hypothesis'),"
    " 'tests': [str(p) for p in paths if p.exists()]}))"
)


@pytest.fixture(params=["operator", "engine"])
def image(request: pytest.FixtureRequest) -> RunnableImage:
    runnable: RunnableImage = request.getfixturevalue(f"{request.param}_image")
    return runnable


def installed(image: RunnableImage) -> dict[str, str]:
    listed = image.python(INSTALLED)
    assert listed.returncode == 0, listed.stderr
    found: dict[str, str] = json.loads(listed.stdout)
    return {normalize(name): version for name, version in found.items()}


def test_operator_image_has_kopf_and_no_vllm(operator_image: RunnableImage) -> None:
    names = "['kopf', 'kubernetes', 'vllm', 'torch']"
    probe = operator_image.python(
        "import importlib.util as u; print({n: u.find_spec(n) is not None for n in " + names + "})"
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "{'kopf': True, 'kubernetes': True, 'vllm': False, 'torch': False}"


def test_runs_as_non_root(image: RunnableImage) -> None:
    assert image_config(image.image.source, image.name)["config"]["User"] == "1000:1000"
    ids = image.run("-c", "echo $(id -u):$(id -g)", entrypoint="sh")
    assert ids.returncode == 0, ids.stderr
    assert ids.stdout.strip() == "1000:1000"


@pytest.mark.parametrize(("target", "extra"), [("operator", "operator"), ("engine", "engine")])
def test_installs_exactly_the_lock(target: str, extra: str, request: pytest.FixtureRequest) -> None:
    runnable: RunnableImage = request.getfixturevalue(f"{target}_image")
    lock = load_lock()
    found = installed(runnable)
    assert set(found) == closure(lock, "neuronfleet", {extra}, here=True) | {"neuronfleet"}
    versions = locked_versions(lock)
    wrong = {name: version for name, version in found.items() if version not in versions[name]}
    assert wrong == {}, f"installed at versions uv.lock does not hold: {wrong}"


def test_engine_image_has_vllm_and_torch_as_locked(engine_image: RunnableImage) -> None:
    versions = locked_versions(load_lock())
    found = installed(engine_image)
    assert found["vllm"] in versions["vllm"]
    assert found["torch"] in versions["torch"]


def test_no_test_code(image: RunnableImage) -> None:
    probe = image.python(TEST_CODE)
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout) == {"pytest": False, "hypothesis": False, "tests": []}


def test_engine_entrypoint_runs(engine_image: RunnableImage) -> None:
    # The image's own entrypoint and command: `neuronfleet-engine --help`.
    shown = engine_image.run()
    assert shown.returncode == 0, shown.stderr
    assert "Usage: neuronfleet-engine" in shown.stdout


def test_operator_entrypoint_runs(operator_image: RunnableImage) -> None:
    shown = operator_image.run("run", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "Usage: neuronfleet-operator run" in shown.stdout
