"""Where bytes live: local paths and fsspec URLs (``s3://``, ``gs://``, ``https://``, ``file://``).

fsspec does the work; this module only picks the filesystem for a URL, fills in
the settings a batch job needs (connect and read timeouts, a bounded retry, the
endpoint from ``AWS_ENDPOINT_URL``), makes uploads atomic for readers and turns
every storage failure into one line naming the URL.

Credentials come the ecosystem's way: the standard environment variables
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``,
``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...) and a
``storage_options`` dict passed to the fsspec filesystem (CLI:
``--storage-option K=V``, repeated; dotted keys nest, ``config_kwargs.read_timeout=30``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from stoker.errors import MissingExtraError, StokerError, StorageError, StorageOptionError, arg, one_line

#: protocol -> (package that implements it, stoker extra that installs it)
_EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "http": ("aiohttp", "http"),
    "https": ("aiohttp", "http"),
}
#: stores where one PUT is atomic for readers (an object appears whole or not at all)
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oss"}
CONNECT_TIMEOUT = 10.0  # seconds: an unreachable endpoint fails fast instead of hanging
READ_TIMEOUT = 120.0
RETRIES = 3  # attempts per request, with the SDK's backoff


def is_url(path: Any) -> bool:
    """True for ``scheme://...`` (``s3://b/k``, ``file:///x``); False for local paths."""
    return isinstance(path, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def protocol(url: str) -> str:
    """``"s3"`` for ``s3://b/k``; ``"file"`` for local paths."""
    return url.split("://", 1)[0].lower() if is_url(url) else "file"


def default_cache_dir() -> Path:
    """``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else ``~/.cache/stoker``."""
    if os.environ.get("STOKER_CACHE_DIR"):
        return Path(os.environ["STOKER_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stoker"


def url_key(url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """A short stable hash of a URL and the endpoint it resolves to (a local folder name)."""
    endpoint = (storage_options or {}).get("endpoint_url") or _env_endpoint(protocol(url)) or ""
    return hashlib.sha256(f"{url.rstrip('/')}\n{endpoint}".encode()).hexdigest()[:16]


def parse_storage_options(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``["anon=true", "config_kwargs.read_timeout=30"]`` -> ``{"anon": True, "config_kwargs":
    {"read_timeout": 30}}``. Values are JSON when they parse as JSON, else strings.

    Raises:
        StorageOptionError: a pair without ``=`` (the message names it; a ValueError too).
    """
    options: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise StorageOptionError(
                f"--storage-option {pair!r} should be KEY=VALUE, e.g. endpoint_url=http://host:9000"
            )
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        node = options
        *parents, leaf = key.strip().split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return options


def _env_endpoint(proto: str) -> str | None:
    if proto in ("s3", "s3a"):
        return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return None


def _merge(base: dict, extra: Mapping) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _defaults(proto: str) -> dict[str, Any]:
    """Timeouts and a bounded retry per protocol, so a batch job never hangs on a dead server."""
    if proto in ("s3", "s3a"):
        opts: dict[str, Any] = {
            "config_kwargs": {
                "connect_timeout": CONNECT_TIMEOUT,
                "read_timeout": READ_TIMEOUT,
                "retries": {"max_attempts": RETRIES, "mode": "standard"},
            },
        }
        if _env_endpoint(proto):  # older botocore ignores AWS_ENDPOINT_URL: pass it on
            opts["endpoint_url"] = _env_endpoint(proto)
        return opts
    # gs:// keeps gcsfs's own retry policy (its timeout knobs are not a stable API)
    if proto in ("http", "https"):
        import aiohttp

        return {
            "client_kwargs": {
                "timeout": aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
            }
        }
    return {}


def _missing(proto: str, name: str) -> MissingExtraError:
    pkg, extra = _EXTRAS.get(proto, (name, ""))
    fix = f"pip install stoker[{extra}]" if extra else f"pip install {pkg}"
    return MissingExtraError(f"reading or writing {proto}:// URLs needs {pkg}, which is not installed: {fix}")


_SECRET_NAMES = ("key", "secret", "token", "password", "passwd", "credential", "session")


def redact_options(options: Mapping[str, Any] | None) -> dict | None:
    """``storage_options`` fit to be written down (a run's config.json, a checkpoint): the value
    of every option whose name suggests a credential (``key``, ``secret``, ``token``,
    ``password``, ...), at any depth, is replaced by ``"***"``."""
    if options is None:
        return None
    return {
        name: "***"
        if any(word in name.lower() for word in _SECRET_NAMES)
        else redact_options(value)
        if isinstance(value, Mapping)
        else value
        for name, value in options.items()
    }


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path inside it: ``(fs, "bucket/key")``.

    Raises:
        MissingExtraError: fsspec or the protocol's package (s3fs, gcsfs, aiohttp) is missing.
        StorageError: the protocol is unknown or the options are invalid.
    """
    proto = protocol(url)
    try:
        import fsspec
    except ImportError:
        raise _missing(proto, "fsspec") from None
    try:
        options = _merge(_defaults(proto), storage_options or {})
        fs, path = fsspec.core.url_to_fs(url, **options)
        if hasattr(fs, "retries"):  # s3fs's own retry loop around the SDK's (class default 5)
            fs.retries = RETRIES
        return fs, path
    except ImportError as e:
        raise _missing(proto, getattr(e, "name", None) or proto) from None
    except (ValueError, TypeError) as e:
        raise StorageError(f"cannot open {url}: {one_line(e)} (check the URL and {arg('storage_options')})") from None


def _describe(e: BaseException, url: str) -> StorageError:
    """One line for any failure of a storage request."""
    name = type(e).__name__
    text = one_line(e)
    # a 403 status as a word: a port in the message ("127.0.0.1:40312") is no refusal
    if isinstance(e, PermissionError) or "AccessDenied" in text or "Forbidden" in text or re.search(r"\b403\b", text):
        return StorageError(
            f"access denied to {url}: check the credentials (AWS_ACCESS_KEY_ID, ...) and the bucket's permissions"
        )
    if name == "NoCredentialsError":
        return StorageError(
            f"no credentials for {url}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            f"or {arg('storage_options')} anon=true for a public bucket"
        )
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return StorageError(f"{url}: the bucket does not exist (create it first)")
    if name in (
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ClientConnectorError",
        "ConnectionError",
        "ServerTimeoutError",
        "ReadTimeoutError",
        "FSTimeoutError",
        "TimeoutError",
    ) or isinstance(e, (ConnectionError, TimeoutError)):
        return StorageError(f"cannot reach the server of {url}: {text}")
    return StorageError(f"{url}: {name}: {text}")


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """Turn any storage failure inside the block into a :class:`StorageError` naming ``url``
    (``FileNotFoundError`` passes through: callers decide what missing means)."""
    try:
        yield
    except (StokerError, FileNotFoundError, KeyboardInterrupt):
        raise
    except Exception as e:  # boundary: any storage library's failure, raised here as one StorageError naming the URL
        raise _describe(e, url) from None


class Store:
    """A folder of objects under one URL: list sizes, read, and upload atomically.

    >>> store = Store("s3://bucket/ds")
    >>> store.put_file(Path("train-000000.tar"), "train/train-000000.tar")
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None):
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url, storage_options)
        self.root = self.root.rstrip("/")
        self.atomic_put = protocol(self.url) in _OBJECT_STORES

    def url_of(self, rel: str) -> str:
        return f"{self.url}/{rel}" if rel else self.url

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def check(self) -> None:
        """Reach the server once (the folder need not exist yet). Raises StorageError."""
        with storage_errors(self.url):
            try:
                self.fs.ls(self._path(""), detail=False)
            except FileNotFoundError:
                parent = self.root.rsplit("/", 1)[0] if "/" in self.root else self.root
                if parent != self.root:
                    try:
                        self.fs.ls(parent, detail=False)
                    except FileNotFoundError:
                        if "/" not in parent and protocol(self.url) in _OBJECT_STORES:
                            raise StorageError(
                                f"{self.url}: the bucket {parent} does not exist (create it first)"
                            ) from None

    def sizes(self, rel: str = "") -> dict[str, int]:
        """``{name: bytes}`` of the files directly under ``rel`` (``{}`` when it does not exist)."""
        with storage_errors(self.url_of(rel)):
            self.fs.invalidate_cache()
            try:
                entries = self.fs.ls(self._path(rel), detail=True)
            except FileNotFoundError:
                return {}
            return {
                e["name"].rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0)
                for e in entries
                if e.get("type") == "file"
            }

    def is_empty(self) -> bool:
        """True when nothing is stored under the URL."""
        with storage_errors(self.url):
            self.fs.invalidate_cache()
            try:
                return not self.fs.ls(self._path(""), detail=False)
            except FileNotFoundError:
                return True

    def read_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        with storage_errors(self.url_of(rel)):
            try:
                return self.fs.cat_file(self._path(rel))
            except FileNotFoundError:
                return None

    def put_file(self, local: Path, rel: str) -> None:
        """Upload ``local`` to ``rel``: readers see the old object or the whole new one, never
        part of it (object stores: one PUT, or a multipart upload completed at once; other
        filesystems: a temporary name renamed into place)."""
        dest = self._path(rel)
        with storage_errors(self.url_of(rel)):
            parent = dest.rsplit("/", 1)[0]
            if not self.atomic_put:
                self.fs.makedirs(parent, exist_ok=True)
                tmp = f"{dest}.tmp-{uuid.uuid4().hex[:8]}"
                try:
                    self.fs.put_file(str(local), tmp)
                    self.fs.mv(tmp, dest)
                except BaseException:
                    with contextlib.suppress(Exception):
                        self.fs.rm_file(tmp)
                    raise
            else:
                self.fs.put_file(str(local), dest)

    def get_file(self, rel: str, local: Path) -> None:
        """Download ``rel`` to ``local`` through ``local.tmp``: a crash never leaves a partial ``local``."""
        tmp = local.with_name(f"{local.name}.tmp-{uuid.uuid4().hex[:8]}")
        with storage_errors(self.url_of(rel)):
            try:
                self.fs.get_file(self._path(rel), str(tmp))
                os.replace(tmp, local)
            finally:
                tmp.unlink(missing_ok=True)
