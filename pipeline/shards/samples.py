"""Random access to the samples of one split, by global position, out of mmap'd tars.

The split's table (:mod:`.table`, ``stoker.index``: built from the ``.idx`` files) gives each
member's data offset and size, so a sample is read with two slices of a memory map (its image
and its target, :mod:`.targets`): no tar scanning, no per-sample Python objects. The table is
itself mapped: opening a split reads no per-sample data, and a rank pages in only the records
of the samples it reads (``BYTES_PER_SAMPLE`` bytes each).

A cheap structural guard (:func:`image_size`) reads the image header: JPEG SOI, a frame
header and EOI; PNG signature, IHDR and IEND. It yields the stored width and height
(which the crop parameters need before decoding) and rejects truncated or foreign bytes
without decoding them.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from stoker.errors import ArgumentError, ShardChangedError

from ..fsutil import PathLike
from .headers import image_size
from .idx import IMAGE_EXTS, read_idx, sample_key
from .kinds import ClassKind, ensure_kind
from .manifest import Manifest, check_shards, idx_path
from .table import KIND_JPEG, KIND_NONE, KIND_PNG, RECORD, SampleTable, open_table, read_records
from .targets import Target, TargetStats

#: shard maps a split keeps open at most (a batch of a global order reads ~one shard a sample)
MAX_MAPS = 4096
#: bytes of the mapped table per sample (image and target offsets and sizes, the image kind)
BYTES_PER_SAMPLE = RECORD.itemsize


class SampleIndex:
    """All samples of a split, addressable by global position ``0 .. len-1``.

    Args:
        split_dir: a directory with ``stoker.json``, the shards and their ``.idx`` files.
        manifest: the loaded manifest (loaded from ``split_dir`` when ``None``).
        with_json: allow :meth:`meta` (the ``json`` component, located from a shard's ``.idx``
            when first asked).
        manifest_sizes: check the ``.idx`` offsets against the manifest's shard sizes, not the
            files' (a shard cache: shards are fetched later and verified against the manifest).

    Samples with no image (``jpg``/``jpeg``/``png``) or no target (``manifest.target.member``:
    ``cls`` for a class, ``target.npy``, ``labels.npy``, ``mask.png``), with a repeated
    component (which image goes with which label is unknowable), and those listed in the
    manifest's ``pack["skip"]`` (``[shard, index, reason]``, as written by ``stoker index``
    for bad samples of foreign shards), are marked invalid:
    :attr:`valid` holds the positions the loader draws from, :attr:`num_skipped` counts
    the rest.
    """

    def __init__(
        self,
        split_dir: PathLike,
        manifest: Manifest | None = None,
        *,
        with_json: bool = False,
        manifest_sizes: bool = False,
    ):
        self.split_dir = Path(split_dir)
        self.manifest = manifest if manifest is not None else Manifest.load(self.split_dir)
        self.with_json = with_json
        self._maps: dict[int, mmap.mmap] = {}
        #: most shard maps kept open (oldest closed first); ``None``: all. A global order reaches
        #: every shard of a split, and a process may hold only so many maps (Linux: 65,530 by
        #: default); a bounded shard cache lowers it, so a shard it evicts does not stay allocated
        #: on disk through an old map.
        self.max_maps: int | None = MAX_MAPS
        #: read samples through shared maps of the shards (zero-copy), or, ``False``, with
        #: ``pread`` (a copy; what a Loader reads with): a shard truncated or rewritten while it
        #: is read is then one line naming it (:class:`ShardChangedError`), where a map's read past
        #: a truncated file's end is a SIGBUS that kills the process with nothing said
        self.mapped = True
        self._files: dict[int, tuple[int, tuple]] = {}  # shard -> (fd, (size, mtime) when opened)
        self._keys: dict[int, list[str]] = {}  # shard -> sample keys, loaded for messages only
        self.shard_names = [s.name for s in self.manifest.shards]
        #: the split's target kind and member
        self.target: Target = self.manifest.target
        self._manifest_sizes = manifest_sizes
        self._json: dict[int, np.ndarray] = {}  # shard -> (json offset, size) rows, read for meta() only
        self._valid: np.ndarray | None = None
        self._bind(open_table(self.split_dir, self.manifest, manifest_sizes=manifest_sizes))

    def _bind(self, table: SampleTable) -> None:
        """Point the per-sample views at ``table`` (nothing per sample is read here)."""
        self._table = table
        rec = table.records
        #: per-sample views of the mapped table (read, and paged in, only where indexed)
        self.img_off, self.img_size, self.kind = rec["img_off"], rec["img_size"], rec["kind"]
        self.tgt_off, self.tgt_size = rec["tgt_off"], rec["tgt_size"]
        #: global position where each shard starts (plus the total at the end)
        self.shard_start = np.array(table.starts, np.int64)
        #: samples left out (no image or target, a repeated component, the manifest's skips)
        self.num_skipped = len(table.left_out)

    @property
    def num_valid(self) -> int:
        """Samples the loader draws from."""
        return self._table.num_loadable

    def valid_at(self, k) -> np.ndarray:
        """``valid[k]`` without building :attr:`valid`: the global positions of the loadable
        samples ``k`` (``0 .. num_valid - 1``, in stored order)."""
        return self._table.loadable(k)

    def valid_position(self, g: int) -> int:
        """``k`` such that ``valid[k] == g``, for a loadable sample ``g``."""
        return self._table.position_of(g)

    @property
    def valid(self) -> np.ndarray:
        """Positions the loader draws from, all of them (``arange(len)`` when nothing is skipped):
        built on first use, ``8 * num_valid`` bytes; the Loader uses :meth:`valid_at`."""
        if self._valid is None:
            keep = np.ones(len(self), bool)
            keep[self._table.left_out] = False
            self._valid = np.flatnonzero(keep).astype(np.int64)
        return self._valid

    def valid_counts(self) -> np.ndarray:
        """Loadable samples per shard."""
        return self._table.loadable_per_shard()

    def __len__(self) -> int:
        return int(self.shard_start[-1])

    @property
    def nbytes(self) -> int:
        """Bytes this index holds in memory: the shard starts (and :attr:`valid` once built); the
        per-sample table is mapped, paged in only where read."""
        return self.shard_start.nbytes + (self._valid.nbytes if self._valid is not None else 0)

    # pickling (DataLoader workers with the spawn start method): maps are reopened lazily
    def __getstate__(self):
        d = self.__dict__.copy()
        d["_maps"] = {}
        d["_files"] = {}
        d["_keys"] = {}
        d["_json"] = {}
        d["_kind"] = type(self.target)  # a worker process knows a kind registered in this one
        if isinstance(self._table.buf, mmap.mmap):  # a mapped table is mapped again, not copied
            for k in ("_table", "img_off", "img_size", "kind", "tgt_off", "tgt_size"):
                d[k] = None
        return d

    def __setstate__(self, d):
        ensure_kind(d.pop("_kind"))
        self.__dict__.update(d)
        if self._table is None:
            self._bind(open_table(self.split_dir, self.manifest, manifest_sizes=self._manifest_sizes))

    def shard_of(self, i: int) -> int:
        return int(np.searchsorted(self.shard_start, i, side="right") - 1)

    def shard_path(self, i: int) -> Path:
        return self.split_dir / self.shard_names[self.shard_of(i)]

    def _map(self, shard: int) -> mmap.mmap:
        m = self._maps.get(shard)
        if m is None:
            with open(self.split_dir / self.shard_names[shard], "rb") as f:
                m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(mmap, "MADV_RANDOM"):
                m.madvise(mmap.MADV_RANDOM)  # samples are read out of order
            if self.max_maps is not None:
                while len(self._maps) >= self.max_maps:
                    _close_map(self._maps.pop(next(iter(self._maps))))
            self._maps[shard] = m
        return m

    def _file(self, shard: int) -> int:
        """The open file of ``shard`` (read with ``pread``), checked unchanged since it was opened."""
        got = self._files.get(shard)
        if got is None:
            path = self.split_dir / self.shard_names[shard]
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            st = os.fstat(fd)
            if self.max_maps is not None:
                while len(self._files) >= self.max_maps:
                    os.close(self._files.pop(next(iter(self._files)))[0])
            self._files[shard] = got = (fd, (st.st_size, st.st_mtime_ns))
        return got[0]

    def _check_unchanged(self, shards) -> None:
        """The shards ``shards`` read by ``pread`` have the size and time they had when opened."""
        for s in set(shards):
            got = self._files.get(s)
            if got is not None:
                st = os.fstat(got[0])
                if (st.st_size, st.st_mtime_ns) != got[1]:
                    now, was = st.st_size, got[1][0]
                    raise self._changed(
                        s,
                        f"{now:,} of its {was:,} bytes left: truncated"  # as a short pread says it
                        if now < was
                        else f"rewritten: {now:,} bytes now, {was:,} when first read, a new mtime",
                    )

    def _changed(self, shard: int, why: str) -> ShardChangedError:
        path = self.split_dir / self.shard_names[shard]
        return ShardChangedError(
            f"{path} changed while it was read ({why}): a shard must not be rewritten or truncated during an "
            "epoch; restore it (stoker verify checks a split), then make a new Loader (load_state_dict resumes)"
        )

    def _bytes(self, shard: int, off: int, size: int) -> np.ndarray:
        """``size`` bytes of ``shard`` at ``off``: a view of its map, or a ``pread`` copy."""
        if self.mapped:
            m = self._maps.get(shard) or self._map(shard)
            return np.frombuffer(m, np.uint8, size, off)
        raw = os.pread(self._file(shard), size, off)
        if len(raw) != size:
            raise self._changed(shard, f"{len(raw):,} of {size:,} bytes at offset {off:,} left: truncated")
        return np.frombuffer(raw, np.uint8)

    def image(self, i: int) -> np.ndarray:
        """The encoded image bytes of sample ``i`` as a uint8 array (a zero-copy view of the map
        when :attr:`mapped`)."""
        return self._bytes(self.shard_of(i), int(self.img_off[i]), int(self.img_size[i]))

    @property
    def has_sizes(self) -> bool:
        """The split's table records each image's stored size (:meth:`stored_sizes`)."""
        return self._table.has_sizes

    def stored_sizes(self, idx) -> np.ndarray:
        """``(width, height)`` of the stored images at positions ``idx``, from the table alone (no
        shard is read; ``(0, 0)`` where none was recorded). Raises ``IdxFormatError`` with the
        ``stoker index`` to run when the table records none."""
        return self._table.sizes(idx)

    def images(self, idx: np.ndarray) -> tuple[list, np.ndarray]:
        """Encoded views and ``(width, height)`` for many samples; ``wh`` is ``(0, 0)`` for a
        sample that fails the structural guard."""
        shards = np.searchsorted(self.shard_start, idx, side="right") - 1
        out, wh = [], np.zeros((len(idx), 2), np.int64)
        rows = zip(shards.tolist(), self.img_off[idx].tolist(), self.img_size[idx].tolist(), strict=True)
        for k, (s, off, size) in enumerate(rows):
            if self.mapped:
                m = self._maps.get(s) or self._map(s)
                dims, raw = image_size(m, off, size), np.frombuffer(m, np.uint8, size, off)
            else:
                raw = self._bytes(s, off, size)
                dims = image_size(raw)
            if dims is not None:
                wh[k] = dims
            out.append(raw)
        if not self.mapped:
            self._check_unchanged(shards.tolist())
        return out, wh

    def _members(self, idx: np.ndarray) -> list:
        """The target members' bytes of the samples at ``idx`` (zero-copy views of the maps, or
        ``pread`` copies)."""
        shards = np.searchsorted(self.shard_start, idx, side="right") - 1
        rows = zip(shards.tolist(), self.tgt_off[idx].tolist(), self.tgt_size[idx].tolist(), strict=True)
        out = [self._bytes(s, off, size) for s, off, size in rows]
        if not self.mapped:
            self._check_unchanged(shards.tolist())
        return out

    def label(self, i: int) -> int:
        return int(self.labels(np.array([i], np.int64))[0])

    def labels(self, idx: np.ndarray) -> np.ndarray:
        """Class indices of the samples at positions ``idx`` (a class split).

        Raises:
            TargetError: one line naming the shard and key of a sample whose ``cls`` is not
                an integer in ``0 .. len(classes) - 1`` (``stoker index`` marks such samples
                to skip).
        """
        return self._decode(ClassKind(), idx)

    def targets(self, idx: np.ndarray) -> np.ndarray:
        """The targets of the samples at ``idx``, as the Loader yields them (on the CPU), read by
        the split's kind (:meth:`.kinds.Target.decode`): class indices int64 ``[N]``; float32
        ``[N]`` (one column) or ``[N, K]``; multi-hot float32 ``[N, C]``. A spatial kind's
        targets (masks) are images: :meth:`masks`.

        Raises:
            TargetError: one line naming the shard and key of a sample whose target does not
                parse, has the wrong width, is not finite, or names a class past the split's.
        """
        if self.target.spatial:
            raise ArgumentError(f"a {self.target.kind} split's targets are images: use masks()")
        return self._decode(self.target, idx)

    def _decode(self, target, idx: np.ndarray) -> np.ndarray:
        return target.decode(
            self._members(idx),
            classes=self.manifest.classes,
            where=lambda k: self.describe(int(idx[k])),
            split=self.split_dir,
        )

    def target_stats(self) -> TargetStats | None:
        """The statistics of the split's kind (:meth:`.kinds.Target.accumulator`) over its
        loadable samples, read from every target (what a manifest without ``target.stats`` leaves
        to compute); ``None`` for a kind that keeps none."""
        acc = self.target.accumulator()
        if acc is None:
            return None
        for s in range(0, self.num_valid, 65536):
            acc.add_many(self.targets(self.valid_at(np.arange(s, min(s + 65536, self.num_valid)))))
        return acc.result()

    def masks(self, idx: np.ndarray) -> tuple[list, np.ndarray]:
        """A mask split: the encoded masks (zero-copy views) of the samples at ``idx`` and their
        ``(width, height)`` from the PNG header (``(0, 0)`` for bytes that are not a complete PNG)."""
        raws = self._members(idx)
        wh = np.zeros((len(idx), 2), np.int64)
        for k, raw in enumerate(raws):
            dims = image_size(raw)
            if dims is not None and raw[0] == 0x89:
                wh[k] = dims
        return raws, wh

    def key(self, i: int) -> str:
        """The WebDataset key (from the ``.idx``, read once per shard when first asked)."""
        shard = self.shard_of(i)
        keys = self._keys.get(shard)
        if keys is None:
            path = idx_path(self.split_dir / self.shard_names[shard])
            keys = self._keys[shard] = [sample_key(sample) for sample in read_idx(path)]
        return keys[i - int(self.shard_start[shard])]

    def meta(self, i: int) -> bytes:
        """The raw ``json`` component (``b""`` when absent); needs ``with_json=True``."""
        if not self.with_json:
            raise ArgumentError("meta() needs SampleIndex(..., with_json=True)")
        shard = self.shard_of(i)
        rows = self._json.get(shard)
        if rows is None:
            path = idx_path(self.split_dir / self.shard_names[shard])
            rows = self._json[shard] = read_records(path, self.target.member.lower().encode(), True)[1]
        off, size = (int(v) for v in rows[i - int(self.shard_start[shard])])
        return bytes(self._bytes(shard, off, size))

    def describe(self, i: int) -> str:
        """``"shard-000001.tar key 000000017"``, for messages."""
        return f"{self.shard_path(i)} key {self.key(i)}"

    def close(self) -> None:
        for m in self._maps.values():
            _close_map(m)
        self._maps.clear()
        for fd, _ in self._files.values():
            os.close(fd)
        self._files.clear()


def _close_map(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a view handed out is still alive; the GC closes it
        pass


def open_split(split_dir: PathLike, *, sha256: bool = False, with_json: bool = False) -> SampleIndex:
    """Load the manifest, check every shard (size, ``.idx``; ``sha256`` optional) and index it.

    Raises:
        ManifestError: naming the first missing, truncated or corrupt shard.
    """
    split_dir = Path(split_dir)
    manifest = Manifest.load(split_dir)
    check_shards(split_dir, manifest, sha256=sha256)
    return SampleIndex(split_dir, manifest, with_json=with_json)


__all__ = [
    "SampleIndex",
    "ShardChangedError",
    "open_split",
    "image_size",
    "BYTES_PER_SAMPLE",
    "IMAGE_EXTS",
    "KIND_JPEG",
    "KIND_NONE",
    "KIND_PNG",
]
