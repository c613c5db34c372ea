"""Fixtures of the tools tests: real storage servers on 127.0.0.1 (see tests/storage_servers.py)."""

import pytest
from storage_servers import S3Server, s3_server


@pytest.fixture(scope="session")
def s3_session() -> S3Server:
    """One moto S3 server for the whole session (started on first use)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with s3_server() as server:
        yield server


@pytest.fixture
def s3(s3_session, monkeypatch, tmp_path) -> S3Server:
    """The S3 server, with the AWS_* variables pointing every client at it and stoker's cache
    (pack staging) under tmp_path. Make a bucket with ``s3.bucket()``."""
    for k, v in s3_session.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "stoker-cache"))
    return s3_session
