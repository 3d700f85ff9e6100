"""pytest fixtures for a real local S3-compatible server (versitygw, ``neuronfleet.devcluster.addons.s3_server``).

Loaded for every test by ``tests/conftest.py``; the server starts on first use (well under a second) and
stops with the session. ``s3_bucket`` gives each test a fresh bucket and the environment that reaches it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from neuronfleet.devcluster.addons.s3_server import S3Server


@dataclass(frozen=True)
class Bucket:
    """One test's bucket: its name, its directory on the server, and the AWS environment that reaches it."""

    name: str
    path: Path
    env: dict[str, str]

    def store(self, prefix: str = "artifacts") -> str:
        """``s3://NAME/PREFIX``: an artifact store in this bucket."""
        return f"s3://{self.name}/{prefix}"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One S3 server for the session."""
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Bucket:
    """A fresh bucket on the session's S3 server."""
    name = f"test-{secrets.token_hex(4)}"
    return Bucket(name, s3_server.create_bucket(name), s3_server.client_env())
