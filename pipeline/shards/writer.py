"""Write one WebDataset tar shard and its DALI ``.idx`` in a single pass.

Output is deterministic (fixed mtime/owner/mode, caller-chosen keys, sorted
components) and atomic: data goes to ``<name>.tmp`` files that are renamed only
when the shard is complete, so a crash never leaves a shard that looks finished.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path

from stoker.errors import ArgumentError

from .idx import Component, Sample, write_idx
from .manifest import ShardInfo, idx_path

BLOCK = 512
RECORD = 20 * BLOCK  # what tarfile and GNU tar pad archives to
MTIME = 0  # fixed: the same input gives the same bytes


def shard_name(split: str, index: int, part: int = 0, parts: int = 1) -> str:
    """``train-000003.tar``, or ``train-p1of4-000003.tar`` for a part of a split pack."""
    if parts == 1:
        return f"{split}-{index:06d}.tar"
    return f"{split}-p{part}of{parts}-{index:06d}.tar"


class ShardWriter:
    """Context manager writing ``path`` (a ``.tar``) and ``path.with_suffix('.idx')``.

    >>> with ShardWriter(out / "train-000000.tar") as w:
    ...     w.write("000000017", {"jpg": jpeg_bytes, "cls": b"3", "json": b"{}"})
    >>> w.info.num_samples
    1
    """

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.samples: list[Sample] = []
        self.info: ShardInfo | None = None
        self._sha = hashlib.sha256()
        self._pos = 0
        self._f: io.BufferedWriter | None = None

    def __enter__(self) -> ShardWriter:
        self._f = open(self.tmp, "wb")
        return self

    def _emit(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as e:  # e.g. ENOSPC: name the shard
            raise OSError(e.errno, e.strerror, str(self.tmp)) from e
        self._sha.update(data)
        self._pos += len(data)

    def write(self, key: str, components: Mapping[str, bytes]) -> None:
        """Append one sample; ``key`` must have no dot or slash (WebDataset's rule)."""
        if not key or "." in key or "/" in key:
            raise ArgumentError(f"sample key {key!r} must be non-empty without '.' or '/'")
        sample: Sample = []
        for ext in sorted(components):
            data = components[ext]
            name = f"{key}.{ext}"
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mtime = MTIME
            ti.mode = 0o444
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = ""
            self._emit(ti.tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict"))
            sample.append(Component(ext, self._pos, len(data), name))
            self._emit(data)
            pad = -len(data) % BLOCK
            if pad:
                self._emit(b"\0" * pad)
        self.samples.append(sample)

    @property
    def bytes_written(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self.samples)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            if self._f is not None:
                self._f.close()
            self.tmp.unlink(missing_ok=True)
            return
        end = 2 * BLOCK
        end += -(self._pos + end) % RECORD
        self._emit(b"\0" * end)
        f, self._f = self._f, None
        try:
            f.flush()
            os.fsync(f.fileno())
            f.close()
        except OSError as e:
            f.close()
            self.tmp.unlink(missing_ok=True)
            raise OSError(e.errno, e.strerror, str(self.tmp)) from e
        # The .idx lands first: a .tar under its final name always has its index.
        write_idx(idx_path(self.path), self.samples)
        os.replace(self.tmp, self.path)
        self.info = ShardInfo(self.path.name, len(self.samples), self._pos, self._sha.hexdigest())
