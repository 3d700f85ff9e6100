"""A local S3-compatible server: versitygw (``tools/s3``) on a loopback port (or in a real node's network
namespace), its posix backend in a directory.

The engine's ``s3://`` artifact stores are tested against it as against S3:
real HTTP, SigV4-signed requests, real objects with metadata. Its posix backend
keeps each bucket as a directory and each object as a file, so a bucket is made
by making a directory, and a test can look at (or damage) what was uploaded.
The credentials are made up per server and given to it in its environment, so
they appear in no command line.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from neuronfleet.devcluster.process.managed import ManagedProcess, free_ports
from neuronfleet.devcluster.process.tools import ToolsMissingError, bin_dir

BINARY = "versitygw"
#: Where versitygw answers GET with 200 once it serves.
HEALTH_PATH = "/health"
REGION = "us-east-1"


def versitygw() -> Path:
    """The pinned versitygw binary, or one line saying how to build it."""
    path = bin_dir("s3") / BINARY
    if not path.is_file():
        raise ToolsMissingError(f"the S3 server is not built ({path} is missing): run `make tools`")
    return path


def answers_in_netns(netns: str, url: str) -> bool:
    """Whether ``url`` answers 200 to a client inside network namespace ``netns``."""
    script = f"import urllib.request; urllib.request.urlopen({url!r}, timeout=2)"
    probe = ["ip", "netns", "exec", netns, "python3", "-I", "-c", script]
    return subprocess.run(probe, capture_output=True, timeout=10, check=False).returncode == 0


@dataclass(frozen=True)
class S3Credentials:
    """The server's root access key and secret (the secret never shows in a repr)."""

    access_key: str
    secret_key: str = field(repr=False)

    @classmethod
    def generate(cls) -> S3Credentials:
        """Fresh random credentials."""
        return cls(access_key=f"NF{secrets.token_hex(9).upper()}", secret_key=secrets.token_urlsafe(30))


@dataclass
class S3Server:
    """A running versitygw: where it listens, where it keeps buckets, and who may use it."""

    process: ManagedProcess
    endpoint: str
    root: Path
    credentials: S3Credentials

    @classmethod
    def start(
        cls, directory: Path, *, host: str = "127.0.0.1", netns: str | None = None, timeout: float = 30.0
    ) -> S3Server:
        """Start a server keeping its buckets in ``directory/buckets`` and its log in ``directory``.

        With ``netns``, it runs inside that network namespace (a real node's, say), listening on ``host``
        there, so the node's pods reach it and nothing outside the namespace does.
        """
        root = directory / "buckets"
        root.mkdir(parents=True, exist_ok=True)
        (port,) = free_ports(1)
        credentials = S3Credentials.generate()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "ROOT_ACCESS_KEY": credentials.access_key,
            "ROOT_SECRET_KEY": credentials.secret_key,
        }
        inside = [] if netns is None else ["ip", "netns", "exec", netns]
        argv = [
            *inside,
            str(versitygw()),
            "--port",
            f"{host}:{port}",
            "--region",
            REGION,
            "--health",
            HEALTH_PATH,
            "--quiet",
            "posix",
            str(root),
        ]
        process = ManagedProcess.spawn("versitygw", argv, directory / "versitygw.log", cwd=directory, env=env)
        server = cls(process, f"http://{host}:{port}", root, credentials)
        health = f"{server.endpoint}{HEALTH_PATH}"
        probe: str | Callable[[], bool] = health if netns is None else partial(answers_in_netns, netns, health)
        try:
            process.wait_ready(probe, timeout=timeout, what="the S3 server to answer")
        except BaseException:
            process.stop(grace=2)
            raise
        return server

    def create_bucket(self, name: str) -> Path:
        """A new empty bucket (a directory of the posix backend); its directory."""
        path = self.root / name
        path.mkdir()
        return path

    def client_env(self) -> dict[str, str]:
        """What an AWS client needs to use this server: its endpoint, region and credentials."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": self.credentials.access_key,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_key,
        }

    def stop(self) -> bool:
        """Stop the server; whether it is gone."""
        return self.process.stop(grace=5)
