"""Real storage servers on 127.0.0.1 for tests: an S3-protocol server (moto's standalone
server, as s3fs's own test suite uses) and a plain HTTP file server.

Both start on a free port and stop on exit::

    with s3_server() as s3:                  # s3.endpoint, s3.env, s3.bucket("name")
        monkeypatch.setenv(...) for k, v in s3.env.items()
    with http_server(folder) as url: ...     # GET url + "/train/stoker.json"
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import socket
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3Server:
    """A running moto server: ``endpoint`` (``http://127.0.0.1:PORT``) and ``env``, the AWS
    variables that point any boto3/s3fs client at it."""

    endpoint: str
    env: dict[str, str] = field(default_factory=dict)

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name=self.env["AWS_DEFAULT_REGION"],
        )

    def bucket(self, name: str = "") -> str:
        """Create a bucket (a fresh unique name by default) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """``{key: bytes}`` of every object in ``bucket`` under ``prefix``."""
        c = self.client()
        out = {}
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                out[o["Key"]] = c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
        return out

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"), timeout=10)


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """Start moto's S3 server on 127.0.0.1 on a free port; stop it on exit."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on stderr
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        yield S3Server(endpoint, {**S3_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint})
    finally:
        server.stop()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no request log on stderr
        pass


@contextlib.contextmanager
def http_server(root: Path) -> Iterator[str]:
    """Serve the files under ``root`` over plain HTTP on 127.0.0.1 (GET and HEAD, with Range
    requests answered whole); yields the base URL ``http://127.0.0.1:PORT``."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


#: the sockets that hold dead_endpoint's ports for the session (bound, never listening)
_HELD_PORTS: list[socket.socket] = []


def dead_endpoint() -> str:
    """``http://127.0.0.1:PORT`` where nothing listens: connections are refused. The port stays bound
    (without listening) for the session, so no server started later (Ray's, moto's) can take it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(s)
    return f"http://127.0.0.1:{s.getsockname()[1]}"
