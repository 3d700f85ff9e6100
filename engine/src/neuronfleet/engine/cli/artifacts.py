"""Compiling into an artifact store and copying artifacts to and from ``s3://`` stores, for ``compile`` and ``serve``.

Failures end the command: one ``error:`` line on stderr and exit 2, except
what ``download_from_s3`` raises, which ``serve`` turns into its own exit codes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from neuronfleet.engine.artifacts.store import (
    GRAPHS_DIR,
    MANIFEST,
    ArtifactError,
    ArtifactFile,
    BucketEntry,
    Manifest,
    artifact_dir,
    compile_artifact,
    is_complete,
)
from neuronfleet.engine.cli.common import err, fail
from neuronfleet.engine.config import EngineConfig
from neuronfleet.engine.hardware import get_instance_type
from neuronfleet.engine.identity import CompileIdentity
from neuronfleet.engine.sim.compiler import simulated_compiler
from neuronfleet.engine.sim.cost_model import CostModel
from neuronfleet.engine.sim.model_shapes import get_shape
from neuronfleet.engine.sim_settings import SimSettings


def run_compile(
    engine: EngineConfig, identity: CompileIdentity, store: str, settings: SimSettings | None
) -> tuple[Manifest, int]:
    """Compile the artifact into the local ``store`` for its identity's device, with a progress bar on stderr; one
    line and exit 2 on failure. ``settings`` are the simulated device's (``None`` on Neuron)."""
    artifact_hash = identity.hash()
    if identity.device == "neuron":
        from neuronfleet.engine.artifacts.neuron_compile import neuron_compile_bucket

        compile_bucket = neuron_compile_bucket(engine, identity, store)
    else:
        assert settings is not None
        try:
            cost = CostModel(
                get_instance_type(settings.instance_type), get_shape(settings.shape), engine.tensor_parallel_size
            )
            graphs = artifact_dir(store, artifact_hash) / GRAPHS_DIR
        except (ValueError, ArtifactError) as error:
            fail(str(error))
        compile_bucket = simulated_compiler(cost, sleep=settings.clock == "real", graphs=graphs, seed=artifact_hash)
    try:
        complete = is_complete(store, artifact_hash)
    except ArtifactError as error:
        fail(str(error))  # before the progress bar, so the line is all there is
    progress = Progress(
        TextColumn("compiling artifact {task.fields[artifact]}: {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        # Nothing to show for an artifact that is already complete.
        disable=complete,
    )
    total = len(engine.effective_num_batched_tokens_buckets) + len(engine.effective_num_seqs_buckets)
    with progress:
        task = progress.add_task("", total=total, artifact=artifact_hash)

        def on_bucket(entry: BucketEntry, done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, description=f"{entry.kind} {entry.size}")

        try:
            return compile_artifact(store, identity, compile_bucket, on_bucket)
        except ArtifactError as error:
            fail(str(error))


def cache_root(cache_dir: Path | None) -> Path:
    """The local cache of s3:// artifacts."""
    return cache_dir if cache_dir is not None else Path.home() / ".cache" / "neuronfleet" / "artifacts"


def show_file(verb: str) -> Callable[[ArtifactFile, int, int, bool], None]:
    """One line on stderr per file copied (or found already there): progress that reads the same in pod logs."""

    def on_file(entry: ArtifactFile, done: int, total: int, skipped: bool) -> None:
        what = "already there" if skipped else verb
        err.print(f"{what} {entry.path} ({entry.size:,} bytes) [{done}/{total}]", markup=False)

    return on_file


def compile_to_s3(
    engine: EngineConfig,
    identity: CompileIdentity,
    store: str,
    cache: Path,
    settings: SimSettings | None,
) -> str:
    """Compile into the local cache, then upload, the manifest last; the line that says what was done."""
    # Imported only for s3:// stores: boto3 takes a moment to load.
    from neuronfleet.engine.artifacts import s3

    artifact_hash = identity.hash()
    try:
        location = s3.S3Location.of(store, artifact_hash)
        remote = s3.read_remote_manifest(s3.client(), location)
        if remote is not None:
            s3.check_identity(remote, artifact_hash, location.uri(MANIFEST))
            if remote.complete:
                return f"artifact {artifact_hash} already complete at {location.uri()}: nothing to compile"
        manifest, compiled = run_compile(engine, identity, str(cache), settings)
        sent = s3.upload(artifact_dir(str(cache), artifact_hash), manifest, location, show_file("uploaded"))
    except ArtifactError as error:
        fail(str(error))
    return (
        f"compiled {compiled} of {len(manifest.buckets)} graphs, uploaded {sent} of {len(manifest.files)} files: "
        f"artifact {artifact_hash} complete at {location.uri()}"
    )


def download_from_s3(store: str, cache: Path, artifact_hash: str) -> Path:
    """The local copy of an s3:// artifact, downloaded (or completed) first; ``ArtifactError`` when unusable."""
    from neuronfleet.engine.artifacts import s3

    location = s3.S3Location.of(store, artifact_hash)
    local = artifact_dir(str(cache), artifact_hash)
    manifest = s3.download(location, local, artifact_hash, show_file("downloaded"))
    if manifest is None:
        raise ArtifactError(
            f"no compiled artifact at {location.uri()} (no {MANIFEST}): run `neuronfleet-engine compile` first"
        )
    if not manifest.complete:
        raise ArtifactError(
            f"the artifact at {location.uri()} is incomplete: finish it with `neuronfleet-engine compile`"
        )
    return local
