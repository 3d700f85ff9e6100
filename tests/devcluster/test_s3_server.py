"""The tests' S3 server (versitygw): it serves signed requests, keeps its secret off its command line, and stops."""

from __future__ import annotations

from pathlib import Path

import boto3
import psutil
import pytest
from botocore.exceptions import ClientError

from neuronfleet.devcluster.addons.s3_server import S3Server


def test_the_server_answers_signed_requests_and_only_with_its_credentials(tmp_path: Path) -> None:
    server = S3Server.start(tmp_path)
    try:
        bucket = server.create_bucket("neff")
        env = server.client_env()
        s3 = boto3.session.Session(
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_REGION"],
        ).client("s3", endpoint_url=server.endpoint)
        s3.put_object(Bucket="neff", Key="a/b.neff", Body=b"graph", Metadata={"sha256": "x"})
        assert (bucket / "a" / "b.neff").read_bytes() == b"graph"
        assert s3.head_object(Bucket="neff", Key="a/b.neff")["Metadata"] == {"sha256": "x"}

        stranger = boto3.session.Session(
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key="wrong", region_name=env["AWS_REGION"]
        ).client("s3", endpoint_url=server.endpoint)
        with pytest.raises(ClientError, match="SignatureDoesNotMatch"):
            stranger.get_object(Bucket="neff", Key="a/b.neff")

        # The secret reaches the server through its environment, never its command line or its repr.
        assert server.credentials.secret_key not in " ".join(psutil.Process(server.process.pid).cmdline())
        assert server.credentials.secret_key not in repr(server.credentials)
    finally:
        assert server.stop()
    assert not server.process.alive()
