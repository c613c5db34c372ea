"""The decoded-pixel store: one split's images at their stored size, memory-mapped on a node.

``PixelStore(root, index, decoder=..., channels=...)`` opens (or creates) the cache of a split
under ``root`` (node-local disk or ``/dev/shm``)::

    root/<split name>-<hash of its path>/<key>/
        key.json      what the pixels are: the manifest's sha256, the decoder, the channels, the
                      pixel format, the format version (``<key>`` is its hash: another split, a
                      repacked one or other decode settings is another folder, never read)
        wh.npy        every sample's stored (width, height), read from the image headers once
        pixels.bin    the pixels, sample after sample (HWC uint8), space reserved up front
        masks.bin     a mask split's masks, one byte a pixel
        filled.bin    one byte per sample: 1 once its pixels (and mask) are written in full
        boot          the boot the unsealed markers were written in
        sealed        every cacheable sample filled and flushed to disk (how many)

Crash safety: a sample's marker is set only after its bytes are written (``pwrite``), so a
killed fill leaves unmarked samples, decoded again on the next read. Within one boot the page
cache holds what a killed process wrote; after a reboot only the markers a seal made durable
(data flushed before the seal is written) are trusted, the others are cleared. The ranks of a
node share the folder: ``.lock`` (``flock``) serializes creating, growing and cleaning it,
``.use`` (shared ``flock``) keeps a folder in use from being removed as stale, and a sample
written twice at once gets the same bytes twice (the decode is deterministic).

Space: the bytes to cache are reserved (``posix_fallocate``) before the first batch, so a full
disk is one line at the start, never a crash mid-epoch; ``budget`` caches the first samples of
the split that fit in it and leaves the rest to be decoded each epoch.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import PixelCacheError

from ..fsutil import PathLike, atomic_write
from ..shards.manifest import MANIFEST_NAME

#: the store's layout version (part of the key: a store of another version is another folder)
FORMAT = 1
#: what a pixel is stored as, and its bytes per pixel (see :func:`sample_bytes`)
PIXEL_FORMATS = ("rgb", "yuv420")
#: header positions read at a time while laying out a new store
_CHUNK = 65536


def boot_id() -> str:
    """This boot's id (Linux); ``"unknown"`` elsewhere (markers are then kept across reboots)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def sample_bytes(wh: np.ndarray, channels: int, pixel_format: str = "rgb") -> np.ndarray:
    """Stored bytes of each ``(width, height)`` in ``wh``: ``w * h * channels`` for ``rgb`` (a
    grayscale split stores its luma alone), ``w * h`` of luma plus two chroma planes at half
    resolution (rounded up) for ``yuv420``."""
    w, h = wh[:, 0].astype(np.int64), wh[:, 1].astype(np.int64)
    if pixel_format == "yuv420" and channels == 3:
        return w * h + 2 * ((w + 1) // 2) * ((h + 1) // 2)
    return w * h * channels


def format_bytes(n: float) -> str:
    """``1.5 GB`` (decimal units, as disks are sold)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)  # pragma: no cover


class PixelStore:
    """One split's decoded pixels under ``root``, memory-mapped (see the module's docstring).

    Args:
        root: the cache folder (created).
        index: the split's :class:`~stoker.pipeline.shards.samples.SampleIndex`.
        decoder: what decodes the pixels, with its version (``"pillow 12.1.1, libjpeg-turbo 2.1.5"``):
            part of the key, so pixels of another decoder are never read.
        channels: 3 (RGB) or 1 (the decoder's luma).
        pixel_format: ``"rgb"`` or ``"yuv420"``.
        budget: bytes the store may hold (``None``: the whole split): the first samples of the
            split that fit are cached, the others decoded each time.

    Raises:
        PixelCacheError: the folder cannot be created, or the pixels do not fit its disk (one line
            with the size they need and the fix).
    """

    def __init__(
        self,
        root: PathLike,
        index: Any,
        *,
        decoder: str,
        channels: int = 3,
        pixel_format: str = "rgb",
        budget: int | None = None,
    ):
        if pixel_format not in PIXEL_FORMATS:
            raise ValueError(f"pixel_format={pixel_format!r} must be one of {PIXEL_FORMATS}")
        self.root = Path(root).expanduser()
        self.channels, self.pixel_format, self.budget = channels, pixel_format, budget
        self.masks = bool(index.target.spatial)
        self.num_samples = len(index)
        split = Path(index.split_dir)
        self.key = {
            "format": FORMAT,
            "manifest_sha256": _sha256(split / MANIFEST_NAME),
            "samples": self.num_samples,
            "decoder": decoder,
            "channels": channels,
            "pixel_format": pixel_format,
            "masks": self.masks,
        }
        digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()[:16]
        ident = hashlib.sha256(str(split.resolve()).encode()).hexdigest()[:10]
        self.split_dir = self.root / f"{split.name}-{ident}"
        #: this store's folder
        self.dir = self.split_dir / digest
        self._index = index
        self._fds: dict[str, int] = {}
        self._maps: dict[str, mmap.mmap] = {}
        self._use: int | None = None
        self._lock = threading.Lock()  # the runner's threads map the files at once
        self._sealing: threading.Thread | None = None  # seal_soon's
        self._seal_error: OSError | None = None
        try:
            self.split_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PixelCacheError(f"cannot create the pixel cache {self.split_dir}: {e.strerror}") from None
        with self._locked():
            if not (self.dir / "key.json").exists():
                self._create()
            self._use = os.open(self.dir / ".use", os.O_RDONLY | os.O_CREAT, 0o644)
            fcntl.flock(self._use, fcntl.LOCK_SH)  # in use: never removed as stale while we hold it
            self._remove_stale()
            self._load_layout()
            self._reserve()
            self._check_markers()
        self._index = None  # the layout is written: the store never reads the split again

    # ---- layout ------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(self.split_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _create(self) -> None:
        """Lay out a new store in a folder of its own, renamed into place when complete."""
        tmp = self.split_dir / f".build-{self.dir.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            wh = np.zeros((self.num_samples, 2), np.int32)
            for s in range(0, self.num_samples, _CHUNK):  # the header guard's sizes; (0, 0) for a bad one
                _, wh[s : s + _CHUNK] = self._index.images(np.arange(s, min(s + _CHUNK, self.num_samples)))
            np.save(tmp / "wh.npy", wh)
            for name in ("pixels.bin", "masks.bin") if self.masks else ("pixels.bin",):
                (tmp / name).touch()
            with open(tmp / "filled.bin", "wb") as f:
                f.truncate(self.num_samples)
            with atomic_write(tmp / "key.json", "w") as f:
                json.dump(self.key, f, indent=1)
            os.rename(tmp, self.dir)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise PixelCacheError(f"cannot create the pixel cache {self.dir}: {e.strerror}") from None

    def _remove_stale(self) -> None:
        """Stores of this split under another key (repacked split, other decode settings) that no
        process uses, and builds a killed process left: removed."""
        for other in self.split_dir.iterdir():
            if other == self.dir or not other.is_dir():
                continue
            if other.name.startswith(".build-"):
                pid = other.name.rsplit("-", 1)[-1]
                if pid.isdigit() and not _alive(int(pid)):
                    shutil.rmtree(other, ignore_errors=True)
                continue
            use = other / ".use"
            try:
                fd = os.open(use, os.O_RDONLY | os.O_CREAT, 0o644)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)  # in use by another process: left alone
                continue
            shutil.rmtree(other, ignore_errors=True)
            os.close(fd)

    def _load_layout(self) -> None:
        self.wh = np.asarray(np.load(self.dir / "wh.npy", mmap_mode="r"))  # a plain view: fast indexing
        nbytes = sample_bytes(self.wh, self.channels, self.pixel_format)
        mask_bytes = (self.wh[:, 0].astype(np.int64) * self.wh[:, 1]) if self.masks else np.zeros_like(nbytes)
        #: where each sample's pixels (and mask) start, and end at the next one's start
        self.offsets = np.concatenate([[0], np.cumsum(nbytes)]).astype(np.int64)
        self.mask_offsets = np.concatenate([[0], np.cumsum(mask_bytes)]).astype(np.int64)
        total = self.offsets[1:] + self.mask_offsets[1:]
        #: samples ``0 .. cacheable - 1`` are cached (the budget's prefix of the split)
        self.cacheable = int(np.searchsorted(total, self.budget, side="right")) if self.budget else self.num_samples

    def _reserve(self) -> None:
        """Reserve the disk space of the cacheable samples (grown when a larger budget comes)."""
        need = {"pixels.bin": int(self.offsets[self.cacheable])}
        if self.masks:
            need["masks.bin"] = int(self.mask_offsets[self.cacheable])
        short = sum(max(0, size - os.path.getsize(self.dir / name)) for name, size in need.items())
        if not short:
            return
        stat = os.statvfs(self.dir)
        free = stat.f_bavail * stat.f_frsize
        if short > free:
            raise PixelCacheError(self._no_room(short, free))
        for name, size in need.items():
            fd = os.open(self.dir / name, os.O_RDWR)
            try:
                if os.fstat(fd).st_size < size:
                    os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise PixelCacheError(f"cannot reserve the pixel cache {self.dir / name}: {e.strerror}") from None
                raise PixelCacheError(self._no_room(short, free)) from None
            finally:
                os.close(fd)

    def _no_room(self, short: int, free: int) -> str:
        samples = self.cacheable
        head = (
            f"pixel cache {self.root}: the decoded pixels of {samples:,} samples need {format_bytes(short)} more, "
            f"{format_bytes(free)} is free there"
        )
        budget = self._fitting_budget(free)
        if budget is None:  # not even the first sample fits: a budget would cache nothing
            first = int(self.offsets[1] + self.mask_offsets[1]) if self.num_samples else 0
            return (
                f"{head}, no room for even one sample ({format_bytes(first)}): free space, or point the cache "
                f"at a folder on another disk (node-local disk or /dev/shm)"
            )
        return (
            f"{head}: free space, give another folder (node-local disk or /dev/shm), or cache what fits with "
            f"a budget (--pixel-cache-budget {format_bytes(budget).replace(' ', '')} / pixel_cache_budget={budget})"
        )

    def _fitting_budget(self, free: int) -> int | None:
        """A budget that fits in ``free`` bytes (90% of it, with what the store already holds) and
        caches at least one sample, rounded down to what :func:`format_bytes` writes exactly (so
        the flag's text is that budget); None when no budget of at least one sample fits."""
        held = sum(os.path.getsize(self.dir / n) for n in ("pixels.bin", "masks.bin") if (self.dir / n).exists())
        budget = held + int(free * 0.9)
        scale = 10 ** max(len(str(budget)) - 2, 0)  # two significant digits: 36864 -> 36000 ("36.0 kB")
        budget = budget // scale * scale
        first = int(self.offsets[1] + self.mask_offsets[1]) if self.num_samples else 0
        return budget if budget >= 1 and budget >= first else None

    def _check_markers(self) -> None:
        """After a reboot, markers beyond the seal may name pixels the disk never got: cleared.
        A store about to fill past its seal is unsealed first (its new markers are this boot's)."""
        sealed = self._sealed()
        if sealed >= self.cacheable and self._all_filled(sealed):
            return
        boot = boot_id()
        if _read(self.dir / "boot") != boot:
            with open(self.dir / "filled.bin", "r+b") as f:
                f.seek(sealed)
                f.write(bytes(self.num_samples - sealed))
            with atomic_write(self.dir / "boot", "w") as f:
                f.write(boot + "\n")
        with contextlib.suppress(FileNotFoundError):
            (self.dir / "sealed").unlink()

    def _sealed(self) -> int:
        text = _read(self.dir / "sealed")
        return int(text) if text and text.isdigit() else 0

    def _all_filled(self, upto: int) -> bool:
        with open(self.dir / "filled.bin", "rb") as f:
            done = np.frombuffer(f.read(upto), np.uint8)
        return bool((done[self.offsets[1 : upto + 1] > self.offsets[:upto]] == 1).all())

    # ---- access ------------------------------------------------------------------------
    def _map(self, name: str, write: bool = False) -> mmap.mmap:
        m = self._maps.get(name)
        if m is None:
            fd = self._fd(name)
            with self._lock:
                m = self._maps.get(name)
                if m is None:
                    size = os.fstat(fd).st_size
                    if not size:
                        return memoryview(b"")  # type: ignore[return-value]
                    m = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE if write else mmap.ACCESS_READ)
                    self._maps[name] = m
        return m

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            with self._lock:
                fd = self._fds.get(name)
                if fd is None:
                    fd = self._fds[name] = os.open(self.dir / name, os.O_RDWR)
        return fd

    @property
    def _filled(self) -> np.ndarray:
        return np.frombuffer(self._map("filled.bin", write=True), np.uint8)

    def filled(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` are in the store, whole (their pixels can be read: a process with a
        larger budget may have filled samples past what this one mapped)."""
        ids = np.asarray(ids, np.int64)
        mapped = len(self._map("pixels.bin"))
        return (self._filled[ids] == 1) & (self.offsets[ids + 1] <= mapped)

    def can_cache(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the store keeps once decoded (the budget's share of the split)."""
        ids = np.asarray(ids, np.int64)
        return (ids < self.cacheable) & (self.offsets[ids + 1] > self.offsets[ids])

    def pixels(self, i: int) -> np.ndarray:
        """Sample ``i``'s stored pixels, a read-only zero-copy view: ``[H, W, C]`` uint8 (``rgb``),
        or the flat ``yuv420`` planes (Y ``H*W``, then U and V at half resolution)."""
        a, b = self.offsets[i : i + 2].tolist()
        flat = np.frombuffer(self._map("pixels.bin"), np.uint8, b - a, a)
        if self.pixel_format == "yuv420" and self.channels == 3:
            return flat
        w, h = self.wh[i].tolist()
        return flat.reshape(h, w, self.channels)

    def mask(self, i: int) -> np.ndarray:
        """Sample ``i``'s stored mask, ``[H, W]`` uint8 (a mask split)."""
        a = int(self.mask_offsets[i])
        w, h = (int(v) for v in self.wh[i])
        return np.frombuffer(self._map("masks.bin"), np.uint8, w * h, a).reshape(h, w)

    def put(self, i: int, pixels: Any, mask: np.ndarray | None = None) -> bool:
        """Write sample ``i``'s pixels (bytes-like, exactly its stored size: ``[H, W, C]`` uint8 or
        the ``yuv420`` planes) and a mask split's mask, then mark it filled. False (nothing
        written) when the store does not keep it or the sizes do not match its layout."""
        if not self.can_cache(np.array([i]))[0]:
            return False
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        data = memoryview(pixels).cast("B") if not isinstance(pixels, bytes) else pixels
        if len(data) != b - a or (self.masks and (mask is None or mask.size != self.wh[i][0] * self.wh[i][1])):
            return False
        os.pwrite(self._fd("pixels.bin"), data, a)
        if self.masks:
            os.pwrite(self._fd("masks.bin"), np.ascontiguousarray(mask, np.uint8).data, int(self.mask_offsets[i]))
        self._filled[i] = 1  # after the bytes: a kill before this leaves the sample unfilled
        return True

    def seal(self) -> bool:
        """Flush the pixels to disk and record the seal when every cacheable sample is filled
        (markers then survive a reboot). True when sealed (now or before)."""
        if self._sealed() >= self.cacheable:
            return True
        if not self._all_filled(self.cacheable):
            return False
        for name in ("pixels.bin", "masks.bin") if self.masks else ("pixels.bin",):
            os.fdatasync(self._fd(name))
        m = self._maps.get("filled.bin")
        if m is not None:
            m.flush()
        with atomic_write(self.dir / "sealed", "w") as f:
            f.write(f"{self.cacheable}\n")
        return True

    def seal_soon(self) -> None:
        """:meth:`seal` in a thread of its own, so the flush of a store just completed
        (``fdatasync`` of its pixels: ~0.3 s for 200 MB here) does not hold up the next batches.
        :meth:`close` waits for it; an error it met is raised by the next call or by close."""
        self._end_seal(wait=False)
        if self._sealing is None:
            self._sealing = threading.Thread(target=self._seal_quietly, name="stoker-pixel-seal", daemon=True)
            self._sealing.start()

    def join_seal(self) -> None:
        """Wait for a :meth:`seal_soon` under way (raising what it met)."""
        self._end_seal(wait=True)

    def _seal_quietly(self) -> None:
        try:
            self.seal()
        except OSError as e:  # a disk failing: the caller's next seal_soon or close says so
            self._seal_error = e

    def _end_seal(self, wait: bool) -> None:
        """Forget a finished seal_soon thread (waiting for it if ``wait``); raise what it met."""
        if self._sealing is not None and (wait or not self._sealing.is_alive()):
            self._sealing.join()
            self._sealing = None
        error, self._seal_error = self._seal_error, None
        if error is not None:
            raise PixelCacheError(f"cannot seal the pixel cache {self.dir}: {error.strerror or error}")

    def stats(self) -> dict:
        """``{"samples", "cacheable", "filled", "bytes", "dir"}``: the store's state."""
        filled = self._filled[: self.num_samples] == 1
        return {
            "dir": str(self.dir),
            "samples": self.num_samples,
            "cacheable": self.cacheable,
            "filled": int(filled.sum()),
            "bytes": int(self.offsets[self.cacheable] + self.mask_offsets[self.cacheable]),
        }

    def close(self) -> None:
        """Unmap and release the folder (another process may then remove it as stale)."""
        try:
            self.join_seal()
        finally:
            self._release()

    def _release(self) -> None:
        for m in self._maps.values():
            with contextlib.suppress(BufferError):  # a view still alive: the GC unmaps it
                m.close()
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._use is not None:
            os.close(self._use)
            self._use = None

    # worker processes (spawn/forkserver): reopened lazily, the parent keeps the folder in use
    def __getstate__(self) -> dict:
        d = self.__dict__.copy()
        d.update(_fds={}, _maps={}, _use=None, _index=None, _lock=None, _sealing=None, _seal_error=None)
        return d

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return ""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["FORMAT", "PIXEL_FORMATS", "PixelStore", "boot_id", "format_bytes", "sample_bytes"]
