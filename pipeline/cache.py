"""The local shard cache behind ``Loader("s3://bucket/ds/train", ...)``.

A split in object storage (any fsspec URL: ``s3://``, ``gs://``, ``https://``, ``file://``) is
read through a local directory that looks exactly like a local split: ``stoker.json``, the
``.idx`` files and the shards the current epoch needs. Shards are fetched whole, checked
against the manifest's size and sha256 before they are used, and renamed into place only
then (a crash leaves a ``.part`` file, never a shard that looks complete). A download whose
bytes differ from the manifest is fetched once more, then refused.

Several processes on one node share one cache directory (the ranks of a ``torchrun`` job):

* ``.<shard>.fetch.lock`` (``flock`` exclusive) while one process downloads a shard: the
  others wait and then find it there, so no shard is fetched twice;
* ``.<shard>.pin.lock`` (``flock`` shared) while a process needs a shard (its current and
  next window); eviction takes it exclusive without blocking and skips a shard it cannot get;
* ``.<shard>.ok`` records the sha256, size and mtime the shard was verified with; its own
  mtime is the shard's last use (what ``cache_limit`` evicts by, oldest first).

One module past 400 lines because it is one protocol: fetching, checking, sharing between
processes and evicting shards all work on the same directory, locks and LRU record.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stoker.errors import CacheError, ManifestError, one_line

from . import storage
from .fsutil import PathLike, atomic_write
from .shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, idx_path
from .storage import is_url

#: bytes read from storage per call while streaming a shard to disk
CHUNK = 8 << 20
#: attempts per shard (a failed or mismatching download is fetched once more; each attempt's
#: requests are retried by the storage layer too)
ATTEMPTS = 2
#: downloads in flight at once per process
FETCH_THREADS = 8


def default_cache_dir(url: str, storage_options: dict | None = None) -> Path:
    """``~/.cache/stoker/shards/<hash of the split URL and its endpoint>`` (``$STOKER_CACHE_DIR``
    and ``$XDG_CACHE_HOME`` respected)."""
    return storage.default_cache_dir() / "shards" / storage.url_key(url, storage_options)


def read_manifest(split: PathLike | str, storage_options: dict | None = None) -> Manifest:
    """The ``stoker.json`` of a split, local or at a URL (one small request; nothing cached):
    what ``stoker train``/``bench``/``diagnose`` read for class names and sample counts.

    Raises:
        ManifestError: no manifest there (or not a valid one); one line naming the place.
        StorageError: the server cannot be reached (one line naming the URL).
    """
    if not is_url(split):
        return Manifest.load(split)
    url = str(split).rstrip("/")
    data = storage.Store(url, storage_options).read_bytes(MANIFEST_NAME)
    if data is None:
        raise ManifestError(f"no {MANIFEST_NAME} at {url}: pack it with `stoker pack` (or check the URL)")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="stoker-manifest-") as tmp:
        (Path(tmp) / MANIFEST_NAME).write_bytes(data)
        try:
            return Manifest.load(tmp)
        except ManifestError as e:
            raise ManifestError(str(e).replace(str(Path(tmp) / MANIFEST_NAME), f"{url}/{MANIFEST_NAME}")) from None


def _write(f, data: bytes) -> None:
    """One chunk to the cache disk (a seam for the disk-full test)."""
    f.write(data)


def _reason(e: BaseException) -> str:
    return one_line(e, with_type=True)


class ShardCache:
    """The local copy of one remote split.

    Args:
        url: the split's URL (the folder holding ``stoker.json``).
        storage_options: passed to fsspec (credentials, ``endpoint_url`` ...); the standard
            environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID`` ...) work too.
        cache_dir: where the copy lives (default :func:`default_cache_dir`).
        cache_limit: bytes of shards kept; least recently used unpinned shards are evicted to
            stay under it. ``None``: no limit.
    """

    def __init__(
        self,
        url: str,
        *,
        storage_options: dict | None = None,
        cache_dir: PathLike | None = None,
        cache_limit: int | None = None,
    ):
        self.url = str(url).rstrip("/")
        self.fs, self.root = storage.filesystem(self.url, storage_options)
        self.root = str(self.root).rstrip("/")
        self.dir = (
            Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir(self.url, storage_options)
        )
        self.cache_limit = cache_limit
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(f"cannot create the shard cache {self.dir}: {e.strerror} (set cache_dir=)") from None
        self.manifest: Manifest | None = None
        self._info: dict[str, ShardInfo] = {}
        self._pins: dict[str, int] = {}  # shard name -> fd holding its pin lock (shared)
        self._lock = threading.Lock()
        self._room = threading.Lock()  # eviction and the bytes this process is downloading
        self._inflight = 0
        #: what this process downloaded: file names (shards, .idx, stoker.json) and bytes
        self.fetched: list[str] = []
        self.fetched_bytes = 0

    # ---- manifest and indexes ------------------------------------------------------------
    def open(self) -> Manifest:
        """Fetch ``stoker.json`` (always: a repacked split is noticed) and every ``.idx`` not
        cached for the shard the manifest names (their sha256 is the key)."""
        self._remove_dead_parts()
        remote = f"{self.root}/{MANIFEST_NAME}"
        try:
            data = self._fetch_bytes(remote, MANIFEST_NAME)
        except FileNotFoundError:
            raise ManifestError(
                f"no {MANIFEST_NAME} at {self.url}: pack it with `stoker pack` (or check the URL)"
            ) from None
        local = self.dir / MANIFEST_NAME
        if not local.exists() or local.read_bytes() != data:
            with self._disk(MANIFEST_NAME), atomic_write(local) as f:
                f.write(data)
        try:
            self.manifest = Manifest.load(self.dir)
        except ManifestError as e:
            raise ManifestError(str(e).replace(str(local), f"{self.url}/{MANIFEST_NAME}")) from None
        self._info = {s.name: s for s in self.manifest.shards}
        stale = [s for s in self.manifest.shards if self._idx_key(s) != s.sha256]
        self._parallel(self._fetch_idx, stale)
        skip_file = self.manifest.pack.get("skip_file")
        if skip_file:  # the samples to skip, when too many for the manifest (read once, into the table)
            with self._disk(skip_file), atomic_write(self.dir / skip_file) as f:
                f.write(self._fetch_bytes(f"{self.root}/{skip_file}", skip_file))
        return self.manifest

    def _remove_dead_parts(self) -> None:
        """Downloads a killed process left (``.<shard>.<pid>.<thread>.part``): removed once
        that process is gone (a live one may still be writing its own)."""
        for part in self.dir.glob(".*.part"):
            try:
                pid = int(part.name.rsplit(".", 3)[-3])
                os.kill(pid, 0)
            except ProcessLookupError:
                _unlink(part)
            except (ValueError, IndexError, PermissionError):
                continue

    def _idx_key(self, info: ShardInfo) -> str | None:
        try:
            return (self.dir / f".{idx_path(info.name).name}.ok").read_text().strip()
        except OSError:
            return None

    def _fetch_idx(self, info: ShardInfo) -> None:
        name = idx_path(info.name).name
        with self._flock(f".{name}.fetch.lock", fcntl.LOCK_EX):
            if self._idx_key(info) == info.sha256:
                return  # another process fetched it meanwhile
            try:
                data = self._fetch_bytes(f"{self.root}/{name}", name)
            except FileNotFoundError:
                raise ManifestError(
                    f"index {self.url}/{name} is missing (run `stoker index` on the split and upload it)"
                ) from None
            with self._disk(name):
                with atomic_write(self.dir / name) as f:
                    f.write(data)
                with atomic_write(self.dir / f".{name}.ok", "w") as f:
                    f.write(info.sha256 + "\n")

    def _fetch_bytes(self, remote: str, name: str) -> bytes:
        """A small file (manifest, ``.idx``) in one request (retried by the storage layer)."""
        with storage.storage_errors(f"{self.url}/{name}"):
            data = self.fs.cat_file(remote)
        self._count(name, len(data))
        return data

    # ---- shards --------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.dir / name

    def is_cached(self, name: str) -> bool:
        """The shard is in the cache and verified against this manifest (cheap: stat + marker)."""
        info = self._info[name]
        try:
            st = os.stat(self.dir / name)
            mark = (self.dir / f".{name}.ok").read_text().split()
        except OSError:
            return False
        return mark == [info.sha256, str(info.bytes), str(st.st_mtime_ns)] and st.st_size == info.bytes

    def ensure(self, names: Iterable[str]) -> None:
        """Pin ``names`` and fetch the ones not cached (in parallel). Pinned shards are never
        evicted, by this process or another, until :meth:`unpin`."""
        names = list(dict.fromkeys(names))
        for name in names:
            self._pin(name)
        self._parallel(self._ensure_one, names)

    def unpin(self, names: Iterable[str]) -> None:
        for name in names:
            with self._lock:
                fd = self._pins.pop(name, None)
            if fd is not None:
                os.close(fd)  # releases the shared lock

    def pinned(self) -> set:
        with self._lock:
            return set(self._pins)

    def _pin(self, name: str) -> None:
        with self._lock:
            if name in self._pins:
                return
        fd = os.open(self.dir / f".{name}.pin.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an evictor deletes the shard
        with self._lock:
            if name in self._pins:
                os.close(fd)
            else:
                self._pins[name] = fd

    def _ensure_one(self, name: str) -> None:
        if self.is_cached(name):
            self._touch(name)
            return
        with self._flock(f".{name}.fetch.lock", fcntl.LOCK_EX):
            if self.is_cached(name):  # another process fetched it while we waited
                self._touch(name)
                return
            info = self._info[name]
            with self._room:  # parallel downloads count each other's bytes
                self._make_room(info.bytes + self._inflight)
                self._inflight += info.bytes
            try:
                self._download(info)
            finally:
                with self._room:
                    self._inflight -= info.bytes

    def _download(self, info: ShardInfo) -> None:
        name, url = info.name, f"{self.url}/{info.name}"
        final = self.dir / name
        tmp = self.dir / f".{name}.{os.getpid()}.{threading.get_ident()}.part"
        mismatch = None
        for _ in range(ATTEMPTS):
            h, n = hashlib.sha256(), 0
            try:
                with self._disk(name), open(tmp, "wb") as dst:
                    with self.fs.open(f"{self.root}/{name}", "rb", **self._open_kwargs()) as src:
                        while True:
                            chunk = src.read(CHUNK)
                            if not chunk:
                                break
                            h.update(chunk)
                            n += len(chunk)
                            _write(dst, chunk)
                    dst.flush()
                    os.fsync(dst.fileno())
            except CacheError:
                _unlink(tmp)
                raise
            except FileNotFoundError:
                _unlink(tmp)
                raise CacheError(f"shard {name} is missing at {url} (the manifest lists it)") from None
            except Exception as e:  # boundary: a network library's failure: retried, then raised as a CacheError
                _unlink(tmp)
                self._count(name, n)
                mismatch = f"download failed: {_reason(e)}"
                continue
            self._count(name, n)
            if n == info.bytes and h.hexdigest() == info.sha256:
                os.replace(tmp, final)
                st = os.stat(final)
                with self._disk(name), atomic_write(self.dir / f".{name}.ok", "w") as f:
                    f.write(f"{info.sha256} {info.bytes} {st.st_mtime_ns}\n")
                return
            _unlink(tmp)
            mismatch = (
                f"got {n:,} bytes with sha256 {h.hexdigest()[:16]}..., the manifest says "
                f"{info.bytes:,} bytes with sha256 {info.sha256[:16]}..."
            )
        if mismatch.startswith("download failed"):
            raise CacheError(f"cannot fetch shard {name} from {url} after {ATTEMPTS} attempts: {mismatch[17:]}")
        raise CacheError(
            f"shard {name} at {url} does not match its {MANIFEST_NAME} ({mismatch}): refused; "
            "re-upload the shard or re-pack the split"
        )

    def _open_kwargs(self) -> dict:
        # stream the object front to back: no range requests (a plain HTTP server need not
        # support them) and no read-ahead cache holding a second copy
        if "http" in _protocols(self.fs):
            return {"block_size": 0}
        return {"block_size": CHUNK, "cache_type": "none"}

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.fetched.append(name)
            self.fetched_bytes += n

    def _touch(self, name: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.dir / f".{name}.ok")

    # ---- eviction ------------------------------------------------------------------------
    def cached_bytes(self) -> int:
        """Bytes of verified shards in the cache directory (any process's)."""
        return sum(size for _, size, _ in self._entries())

    def _entries(self) -> list:
        """``(last use, bytes, name)`` of every verified shard file in the directory."""
        out = []
        for mark in self.dir.glob(".*.ok"):
            name = mark.name[1:-3]
            if name.endswith(".idx"):
                continue
            try:
                out.append((mark.stat().st_mtime_ns, os.path.getsize(self.dir / name), name))
            except OSError:
                continue
        return sorted(out)

    def _make_room(self, incoming: int) -> None:
        """Evict least recently used shards nobody pins until ``incoming`` more bytes fit."""
        if self.cache_limit is None:
            return
        entries = self._entries()
        used = sum(size for _, size, _ in entries)
        mine = self.pinned()
        for _, size, name in entries:
            if used + incoming <= self.cache_limit:
                return
            if name in mine:
                continue
            try:
                fd = os.open(self.dir / f".{name}.pin.lock", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # pinned by another process: skip
            except OSError:
                os.close(fd)
                continue
            try:
                _unlink(self.dir / f".{name}.ok")  # marker first: a half-evicted shard is never "cached"
                _unlink(self.dir / name)
                used -= size
            finally:
                os.close(fd)

    # ---- helpers -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _flock(self, lock_name: str, how: int):
        fd = os.open(self.dir / lock_name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _disk(self, name: str):
        """A full cache disk is one line naming the file, the cache and what to do."""
        try:
            yield
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise CacheError(
                    f"the shard cache {self.dir} is full: cannot write {name} from {self.url} "
                    "(free space there, or pass cache_dir= on a larger disk or a smaller "
                    "cache_limit= with shuffle='block')"
                ) from None
            raise

    def _parallel(self, fn, items: list) -> None:
        if len(items) <= 1:
            for item in items:
                fn(item)
            return
        with ThreadPoolExecutor(min(FETCH_THREADS, len(items)), thread_name_prefix="stoker-fetch") as pool:
            for f in [pool.submit(fn, item) for item in items]:
                f.result()  # the first failure, in submission order

    def close(self) -> None:
        self.unpin(list(self.pinned()))

    def __del__(self) -> None:  # pragma: no cover - pins are fds: released with the process anyway
        with contextlib.suppress(Exception):
            self.close()


def _protocols(fs: Any) -> tuple:
    p = getattr(fs, "protocol", ())
    return (p,) if isinstance(p, str) else tuple(p)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


__all__ = ["CHUNK", "CacheError", "ShardCache", "default_cache_dir", "is_url", "read_manifest"]


def local_copy(split: PathLike | str, storage_options: dict | None = None, cache_dir: PathLike | None = None) -> Path:
    """The folder to read ``split`` from: a local split as it is, a URL fetched whole into the
    shard cache (checked against its manifest). For tools that read every shard (bench,
    diagnose); the Loader streams through :class:`ShardCache` itself."""
    if not storage.is_url(split):
        return Path(split)
    cache = ShardCache(str(split), storage_options=storage_options, cache_dir=cache_dir)
    try:
        manifest = cache.open()
        names = [s.name for s in manifest.shards]
        cache.ensure(names)
        cache.unpin(names)
    finally:
        cache.close()
    return cache.dir
