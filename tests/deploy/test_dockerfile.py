"""The Dockerfile: lint-clean, two slim non-root final stages, entrypoints that work, no vLLM for the operator.

The file is checked by what it is made of: hadolint, the stages' instructions, the installed package's
entrypoints, and the operator extra's closure in uv.lock. tests/images/ builds both images and looks inside.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from harness.lockfile import closure, load_lock

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT = Path(sys.executable).parent / "hadolint"
#: Packages that must never reach the operator image (vLLM drags in PyTorch and CUDA).
HEAVY = {"vllm", "torch", "triton", "xformers"}


@dataclass
class Stage:
    """One ``FROM ... AS name`` block: its base and its instructions."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for k, args in self.instructions if k == keyword]


def stages() -> dict[str, Stage]:
    """The Dockerfile's stages (continuation lines joined, comments dropped)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found: dict[str, Stage] = {}
    current: Stage | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            base, _, name = args.partition(" AS ")
            current = found[name.strip()] = Stage(name.strip(), base.strip())
        elif current is not None:
            current.instructions.append((keyword, args.strip()))
    return found


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not exec form: {args}"
    return [str(v) for v in value]


def test_hadolint_passes_without_exceptions() -> None:
    linted = subprocess.run(
        [str(HADOLINT), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
    # No rule is switched off inline: the file is clean as written.
    assert "hadolint ignore" not in DOCKERFILE.read_text()


def test_dockerignore_sends_only_what_the_images_install() -> None:
    lines = [x for x in (ROOT / ".dockerignore").read_text().splitlines() if x and not x.startswith("#")]
    assert lines[0] == "*", "everything is excluded first"
    allowed = {x.removeprefix("!").rstrip("/") for x in lines if x.startswith("!")}
    copied = {
        source
        for stage in stages().values()
        for args in stage.all("COPY")
        if "--from" not in args
        for source in args.split()[:-1]
    }
    assert copied <= allowed | {"."}, f"COPY of files the context excludes: {copied - allowed}"
    assert not allowed & {".venv", ".git", "tests", "bench"}


def numeric_non_root(stage: Stage) -> None:
    (user,) = stage.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit(), f"numeric user (runAsNonRoot can check it), got {user}"
    assert int(uid) > 0, "non-root"
    assert gid.isdigit(), f"numeric group, got {user}"


def locked_syncs(stage: Stage, extra: str) -> list[str]:
    """The stage's ``uv sync`` runs, checked to install from the lock, this extra only, finally as a wheel."""
    syncs = [args for args in stage.all("RUN") if "uv sync" in args]
    assert syncs
    assert all("--locked" in s and "--no-dev" in s and f"--extra {extra}" in s for s in syncs), syncs
    assert "--no-editable" in syncs[-1], "the project as a wheel, not a link to sources"
    return syncs


def test_operator_final_stage_is_the_runtime_alone() -> None:
    found = stages()
    final = found["operator"]
    assert final.all("RUN") == [], "a final stage runs nothing: no package manager, no build tools"
    # The environment in two layers: the dependencies, then the project's own files, so a source change
    # replaces only the second.
    assert final.all("COPY") == [
        "--from=operator-deps /opt/neuronfleet /opt/neuronfleet",
        "--from=operator-build /project/ /opt/neuronfleet/",
    ]
    numeric_non_root(final)
    deps, build = found["operator-deps"], found["operator-build"]
    assert build.base == "operator-deps", "the project is installed on the dependencies"
    syncs = locked_syncs(Stage("operator-env", deps.base, deps.instructions + build.instructions), "operator")
    assert len(syncs) == 2
    assert "from=lock," in syncs[0], "dependencies from the lock alone first"
    assert "--no-install-project" in syncs[0]
    assert "from=sources," in syncs[-1]
    assert deps.all("RUN") == syncs[:1]
    assert [run for run in build.all("RUN") if "uv sync" in run] == syncs[1:]


def test_engine_installs_in_place_with_uv_and_sources_only_mounted() -> None:
    found = stages()
    final = found["engine"]
    # Nothing is copied in: the 10 GB environment is written once, and no uv or sources stay behind.
    assert final.all("COPY") == []
    syncs = locked_syncs(final, "engine")
    for run in final.all("RUN"):
        assert "--mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv" in run
        assert "--mount=type=cache,target=/root/.cache/uv" in run, "downloads stay out of the image"
    assert "from=lock," in syncs[0], "dependencies from the lock alone first"
    assert "--no-install-project" in syncs[0]
    assert "from=sources," in syncs[-1]
    assert found["lock"].all("RUN") == [], "the mounted stages only hold files"
    assert found["sources"].all("RUN") == []
    numeric_non_root(final)


def test_each_install_is_keyed_by_a_digest_of_what_it_mounts() -> None:
    """buildah's layer cache does not hash a RUN's mounts: the ARG declared just before each install keys it."""
    found = stages()
    keyed: list[str] = []
    for stage in ("operator-deps", "operator-build", "engine"):
        declared: list[str] = []
        for keyword, args in found[stage].instructions:
            if keyword == "ARG":
                declared.append(args.split("=")[0])
            elif keyword == "RUN" and "uv sync" in args:
                lock = "--no-install-project" in args
                wanted = "NEURONFLEET_LOCK_DIGEST" if lock else "NEURONFLEET_SOURCES_DIGEST"
                assert declared[-1:] == [wanted], f"{stage}: {wanted} just before {args[:60]}"
                assert ("from=lock," if lock else "from=sources,") in args
                keyed.append(wanted)
    assert keyed == ["NEURONFLEET_LOCK_DIGEST", "NEURONFLEET_SOURCES_DIGEST"] * 2
    text = DOCKERFILE.read_text()
    assert "BuildKit hashes mounts itself: leave them unset." in text, "the header says why they exist"


def test_engine_base_image_is_a_build_argument() -> None:
    found = stages()
    assert found["engine"].base == "${ENGINE_BASE}"
    assert found["operator"].base == found["uv"].base == found["lock"].base == "${PYTHON_BASE}"
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG ENGINE_BASE=\$\{PYTHON_BASE\}$", text, re.MULTILINE)
    assert "--build-arg ENGINE_BASE=" in text, "the header documents how to build on the Neuron DLC"


@pytest.mark.parametrize("target", ["operator", "engine"])
def test_entrypoint_works_from_the_installed_package(
    target: str, run_cli: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    final = stages()[target]
    (entrypoint,) = final.all("ENTRYPOINT")
    (cmd,) = final.all("CMD")
    program, *args = exec_form(entrypoint) + exec_form(cmd)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert program in scripts, f"{program} is not one of the package's console scripts"
    if "--help" not in args:
        args.append("--help")
    shown = run_cli(program, *args)
    assert shown.returncode == 0, f"{shlex.join([program, *args])}: {shown.stderr}"
    assert "Usage:" in shown.stdout


def test_operator_entrypoint_imports_no_vllm() -> None:
    probe = (
        "import sys; import neuronfleet.operator.main; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & " + repr(HEAVY) + "))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"


def test_operator_extra_locks_no_vllm_or_torch() -> None:
    lock = load_lock()
    operator = closure(lock, "neuronfleet", {"operator"})
    assert {"kopf", "kubernetes", "pydantic"} <= operator
    assert not operator & HEAVY, operator & HEAVY
    assert {"vllm", "torch"} <= closure(lock, "neuronfleet", {"engine"}), "the engine image does get vLLM"
