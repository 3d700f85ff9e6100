"""podman with its own storage under the cache, and the one refusal of this sandbox worked around.

Every call goes through :class:`Podman`, so images never land in the system's store: the store and
the temporary files (buildah writes a layer's diff there while committing it) live under one
directory, the run root in a short one of its own.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from neuronfleet.devcluster.errors import RigError

#: A build is stopped when the disk it writes to falls below this many free bytes (the disk is shared).
MIN_FREE_BYTES = 5 * 10**9


class PodmanError(RigError):
    """A podman command failed, or was stopped because the disk ran low."""


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding ``path``."""
    return shutil.disk_usage(path).free


@dataclass
class DiskGuard:
    """Stops a running process group when free space under ``path`` falls below ``minimum``."""

    path: Path
    minimum: int = MIN_FREE_BYTES
    interval_s: float = 5.0
    tripped_at: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def watch(self, process: subprocess.Popen[bytes]) -> threading.Thread:
        """Poll in a thread until ``process`` exits or space runs low (then SIGTERM its group)."""

        def poll() -> None:
            while not self._stop.wait(self.interval_s) and process.poll() is None:
                free = free_bytes(self.path)
                if free < self.minimum:
                    self.tripped_at = free
                    os.killpg(process.pid, 15)
                    return

        thread = threading.Thread(target=poll, name="disk-guard", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """End the polling thread."""
        self._stop.set()


@dataclass(frozen=True)
class Podman:
    """podman on a private store rooted at ``root``, with the rlimits-stripping runtime."""

    root: Path
    runtime: Path

    @property
    def run_root(self) -> Path:
        """The run root: short, beside the system's temporary files, one per store.

        podman refuses a long one ("the specified runroot is longer than 50 characters"), and a store
        under pytest's temporary directory or a long $HOME is longer than that.
        """
        digest = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"nf-podman-{digest}"

    @property
    def tmpdir(self) -> Path:
        """Where buildah and containers/image write temporary blobs (instead of /var/tmp)."""
        return self.root / "tmp"

    def argv(self, *args: str) -> list[str]:
        """The command line for ``podman args...`` on this store."""
        return [
            "podman",
            "--root",
            str(self.root / "storage"),
            "--runroot",
            str(self.run_root),
            # libpod's own state too (else /run/libpod, which `system reset` would empty for everyone).
            "--tmpdir",
            str(self.root / "libpod"),
            "--storage-driver",
            "overlay",
            "--runtime",
            str(self.runtime),
            # No systemd here, and no journal: plain cgroupfs and a file for events.
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
            *args,
        ]

    def env(self) -> dict[str, str]:
        """The environment podman runs in: its temporary files under the store's root."""
        return {**os.environ, "TMPDIR": str(self.tmpdir)}

    def run(self, *args: str, timeout: float = 600) -> str:
        """Run podman quietly; its stdout, or :class:`PodmanError` with its stderr."""
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            self.argv(*args), capture_output=True, text=True, timeout=timeout, env=self.env(), check=False
        )
        if done.returncode != 0:
            raise PodmanError(f"podman {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def stream(self, args: Sequence[str], guard: DiskGuard, nice: int = 10) -> None:
        """Run podman with its output shown as it comes (a build's progress), under ``guard``."""
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        # Its own process group, so the guard stops buildah's children too.
        with subprocess.Popen(
            ["nice", "-n", str(nice), *self.argv(*args)], env=self.env(), start_new_session=True
        ) as process:
            guard.watch(process)
            try:
                code = process.wait()
            finally:
                guard.stop()
        if guard.tripped_at is not None:
            raise PodmanError(f"stopped: only {guard.tripped_at / 1e9:.1f} GB left free on {guard.path}")
        if code != 0:
            raise PodmanError(f"podman {args[0]} failed with exit status {code}")

    def load(self, archive: Path) -> str:
        """Load an OCI archive into the store; the image's name."""
        loaded = self.run("load", "--input", str(archive))
        names = [line.split(":", 1)[1].strip() for line in loaded.splitlines() if line.startswith("Loaded image")]
        if not names:
            raise PodmanError(f"podman load {archive} named no image: {loaded.strip()}")
        return names[0].split(",")[0].strip()

    def exists(self, image: str) -> bool:
        """Whether the store holds an image called (or with the ID) ``image``."""
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            self.argv("image", "exists", image), capture_output=True, text=True, timeout=60, env=self.env(), check=False
        )
        if done.returncode not in (0, 1):
            raise PodmanError(f"podman image exists failed ({done.returncode}): {done.stderr.strip()}")
        return done.returncode == 0
