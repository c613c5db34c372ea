"""``stoker.index``: a split's samples as one binary, memory-mapped table.

The ``.idx`` files stay (DALI's reader reads them); this table is what stoker's own reader maps,
so a rank's start-up and memory grow with the share it reads, not with the split: opening it
reads a header, the shard starts and the sorted list of left-out samples, and a sample's record
is read (paged in) only when asked for. It is derived data, written by ``stoker pack`` and
``stoker index`` after the manifest and rebuilt from the ``.idx`` files on first use when it is
missing or does not match the manifest or an ``.idx`` file's size (a split packed by an older
stoker, a re-index, a damaged index: the rebuild names it).

Layout (little-endian; sections 8-byte aligned)::

    header     128 B   magic, version, samples, shards, left out, record size, manifest sha256
    starts     int64 x (shards + 1)   global position where each shard starts, then the total
    idx_bytes  int64 x shards         each shard's .idx size when the table was built
    records    32 B x samples         image offset, target offset (i64), image size, target size
                                      (u32), image kind (u8: 0 none, 1 JPEG, 2 PNG), the stored
                                      image's width and height (u16 each, 0: not recorded), 3 reserved

The header's flags say whether the sizes were recorded: ``stoker pack`` and ``stoker index`` read
each image's header once while writing the table (a few microseconds a sample); a table rebuilt on
first use, or written by an older stoker, has none, and :meth:`SampleTable.sizes` says to re-index.
The sizes live in bytes the record had reserved, so a table with them is no larger.
    left_out   int64 x K              sorted positions of the samples the Loader leaves out
    shift      int64 x K              left_out[j] - j: loadable position k is global k + #(shift <= k)

A sample is left out when it has no image or no target member, repeats a component (which image
goes with which label is unknowable), or is listed by the manifest's skips (``pack.skip``).
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import mmap
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from stoker.errors import IdxFormatError

from ..fsutil import PathLike, atomic_write
from .idx import IMAGE_EXTS, bad_idx, idx_fields, idx_lines, read_idx, sample_key
from .manifest import MANIFEST_NAME, Manifest, idx_name, idx_path, iter_skips

TABLE_NAME = "stoker.index"
MAGIC = b"STOKIDX\x00"
VERSION = 1
HEADER = struct.Struct("<8sIIQQQ32s")  # magic, version, record size, samples, shards, left out, manifest sha256
FLAGS = struct.Struct("<I")  # after HEADER, in its zero padding (a table written before it reads 0)
FLAG_SIZES = 1  # the records hold each image's stored width and height
HEADER_BYTES = 128
MAX_RECORDED_SIDE = 0xFFFF  # a side past it is recorded as 0 (not recorded)
RECORD = np.dtype(
    [
        ("img_off", "<i8"),
        ("tgt_off", "<i8"),
        ("img_size", "<u4"),
        ("tgt_size", "<u4"),
        ("kind", "u1"),
        ("width", "<u2"),
        ("height", "<u2"),
        ("reserved", "V3"),
    ]
)
KIND_NONE, KIND_JPEG, KIND_PNG = 0, 1, 2
_KIND = {ext.encode(): KIND_PNG if ext == "png" else KIND_JPEG for ext in IMAGE_EXTS}
_OTHER_SPACE = re.compile(rb"[\t\r\x0b\x0c]")


def manifest_digest(split_dir: PathLike) -> bytes:
    """sha256 of the split's ``stoker.json`` bytes: the table belongs to exactly that manifest."""
    return hashlib.sha256((Path(split_dir) / MANIFEST_NAME).read_bytes()).digest()


# ---- reading an .idx into records --------------------------------------------------------
def _parse_lines(path: Path, member: bytes, with_json: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """An ``.idx`` as records, one line at a time (any layout; names the bad line)."""
    lines = idx_lines(path)
    rec = np.zeros(len(lines), RECORD)
    js = np.zeros((len(lines), 2), np.int64) if with_json else None
    for i, line in enumerate(lines):
        comps = idx_fields(path, i + 2, line)
        exts = [c[0].lower() for c in comps]
        if len(set(exts)) != len(exts):
            continue  # a repeated component (a.jpg a.cls a.jpg): never paired, left out
        for ext, (_, offset, size, _name) in zip(exts, comps, strict=True):
            if offset >= 1 << 63 or size >= 1 << 32:
                raise bad_idx(path, f"line {i + 2}: offset/size out of range")
            if ext in _KIND and not rec["kind"][i]:
                rec["kind"][i], rec["img_off"][i], rec["img_size"][i] = _KIND[ext], offset, size
            elif ext == member:
                rec["tgt_off"][i], rec["tgt_size"][i] = offset, size
            elif js is not None and ext == b"json":
                js[i] = offset, size
    return rec, js


def _parse_uniform(data: bytes, member: bytes, with_json: bool):
    """The common ``.idx`` (every line the same components, single spaces) parsed column-wise,
    about 3x faster than line by line; ``None`` for any other, which :func:`_parse_lines` reads."""
    head, _, body = data.partition(b"\n")
    fields = head.split()
    if len(fields) != 2 or not fields[1].isdigit() or _OTHER_SPACE.search(data):
        return None
    n = int(fields[1])
    lines = body.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    if n == 0 or len(lines) != n:
        return None
    first = lines[0].split(b" ")
    width = len(first)
    exts = [e.lower() for e in first[0::4]]
    if width % 4 or len(set(exts)) != len(exts):
        return None
    spaces = np.fromiter(map(bytes.count, lines, itertools.repeat(b" ")), np.int64, n)
    if (spaces != width - 1).any():
        return None
    tokens = b" ".join(lines).split(b" ")
    if len(tokens) != n * width:
        return None
    cols = {}
    for j, ext in enumerate(exts):
        if any(t.lower() != ext for t in set(tokens[4 * j :: width])):
            return None
        off_text, size_text = tokens[4 * j + 1 :: width], tokens[4 * j + 2 :: width]
        if not (b"".join(off_text).isdigit() and b"".join(size_text).isdigit()):
            return None  # the line-by-line reader names the line
        try:
            off, size = np.array(off_text).astype(np.int64), np.array(size_text).astype(np.int64)
        except (ValueError, OverflowError):
            return None
        if size.max() >= 1 << 32:
            return None
        cols[ext] = (off, size)
    rec = np.zeros(n, RECORD)
    image = next((e for e in exts if e in _KIND), None)
    if image is not None:
        rec["kind"], (rec["img_off"], rec["img_size"]) = _KIND[image], cols[image]
    if member in cols and member != image:
        rec["tgt_off"], rec["tgt_size"] = cols[member]
    js = None
    if with_json:
        js = np.zeros((n, 2), np.int64)
        if b"json" in cols and b"json" not in (image, member):
            js[:, 0], js[:, 1] = cols[b"json"]
    return rec, js


def read_records(path: PathLike, member: bytes, with_json: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """One ``.idx`` as :data:`RECORD` rows (and ``(json offset, size)`` rows with ``with_json``).

    Raises:
        IdxFormatError: one line naming the file (and line) of a damaged index.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise bad_idx(path, f"cannot be read: {e.strerror}") from None
    parsed = _parse_uniform(data, member, with_json)
    return parsed if parsed is not None else _parse_lines(path, member, with_json)


def check_bounds(path: Path, tar_bytes: int, rec: np.ndarray) -> None:
    """Every component an ``.idx`` lists must lie inside its tar, after a header."""
    for present, off, size in (
        (rec["kind"] > 0, rec["img_off"], rec["img_size"]),
        (rec["tgt_size"] > 0, rec["tgt_off"], rec["tgt_size"]),
    ):
        off, end = off[present].astype(np.int64), off[present].astype(np.int64) + size[present]
        if len(off) and (off.min() < 512 or end.max() > tar_bytes):
            bad = int(np.flatnonzero(present)[np.argmax((off < 512) | (end > tar_bytes))])
            raise bad_idx(path, f"sample {bad} points outside its tar ({tar_bytes:,} bytes)")


# ---- writing the table ---------------------------------------------------------------------
def manifest_skips(manifest: Manifest, starts: np.ndarray, split_dir: Path) -> Iterator[int]:
    """Global positions the manifest's skips list (``pack.skip`` or its skip file):
    ``[shard name, index in shard, reason]`` (what ``stoker index`` writes; the reason optional),
    a global position (int) or a sample key (str)."""
    shard_no = {s.name: k for k, s in enumerate(manifest.shards)}
    keys = set()
    for s in iter_skips(split_dir, manifest):
        if isinstance(s, (list, tuple)) and len(s) in (2, 3) and s[0] in shard_no and isinstance(s[1], int):
            k = shard_no[s[0]]
            if 0 <= s[1] < starts[k + 1] - starts[k]:
                yield int(starts[k]) + s[1]
        elif isinstance(s, int) and 0 <= s < starts[-1]:
            yield s
        elif isinstance(s, str):
            keys.add(s)
    for k, info in enumerate(manifest.shards) if keys else ():
        for i, sample in enumerate(read_idx(idx_path(split_dir / info.name))):
            if sample_key(sample) in keys:
                yield int(starts[k]) + i


def write_table(
    f: BinaryIO, split_dir: PathLike, manifest: Manifest, *, manifest_sizes: bool = False, sizes: bool = False
) -> None:
    """Write the table of ``split_dir`` (its manifest ``manifest``) to ``f``, shard by shard
    (memory: one shard's records and the left-out list). ``sizes``: record each image's stored
    width and height, read from its headers in the local tar (what pack and index do).

    Raises:
        IdxFormatError: a damaged ``.idx``, or one that disagrees with the manifest; names it.
    """
    split_dir = Path(split_dir)
    counts = np.array([s.num_samples for s in manifest.shards], np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)]).astype("<i8")
    member = manifest.target.member.lower().encode()
    f.write(b"\0" * HEADER_BYTES)
    f.write(starts.tobytes())
    f.write(_idx_sizes(split_dir, manifest).astype("<i8").tobytes())
    left_out = []
    for k, info in enumerate(manifest.shards):
        path = idx_path(split_dir / info.name)
        rec, _ = read_records(path, member)
        if len(rec) != info.num_samples:
            raise IdxFormatError(
                f"index of shard {split_dir / info.name} lists {len(rec)} samples, "
                f"manifest says {info.num_samples} (rerun `stoker index {split_dir}`)"
            )
        size = info.bytes if manifest_sizes else _size(split_dir / info.name, info.bytes)
        check_bounds(path, size, rec)
        if sizes:
            record_sizes(split_dir / info.name, rec)
        left_out.append(np.flatnonzero((rec["kind"] == KIND_NONE) | (rec["tgt_size"] == 0)) + starts[k])
        f.write(rec.tobytes())
    skips = np.fromiter(manifest_skips(manifest, starts, split_dir), np.int64)
    out = np.unique(np.concatenate([*left_out, skips])).astype("<i8")
    f.write(out.tobytes())
    f.write((out - np.arange(len(out), dtype=np.int64)).astype("<i8").tobytes())
    f.seek(0)
    f.write(
        HEADER.pack(
            MAGIC,
            VERSION,
            RECORD.itemsize,
            int(starts[-1]),
            len(counts),
            len(out),
            manifest_digest(split_dir),
        )
    )
    f.write(FLAGS.pack(FLAG_SIZES if sizes else 0))


def record_sizes(shard: Path, rec: np.ndarray) -> None:
    """Fill ``rec``'s width and height from the image headers in ``shard`` (0 where an image is
    missing, does not parse, or has a side past :data:`MAX_RECORDED_SIDE`)."""
    from .headers import image_size

    with open(shard, "rb") as fh:
        m = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        present = np.flatnonzero(rec["kind"] > 0)
        offsets, lengths = rec["img_off"][present].tolist(), rec["img_size"][present].tolist()
        for i, off, size in zip(present.tolist(), offsets, lengths, strict=True):
            dims = image_size(m, off, size)
            if dims is not None and max(dims) <= MAX_RECORDED_SIDE:
                rec["width"][i], rec["height"][i] = dims
    finally:
        m.close()


def _idx_sizes(split_dir: Path, manifest: Manifest) -> np.ndarray:
    """Each shard's ``.idx`` size (-1 when missing): one ``stat`` a shard."""
    base = str(split_dir)
    return np.array([_size(idx_name(os.path.join(base, s.name)), -1) for s in manifest.shards], np.int64)


def _size(path: Path, default: int) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # reported by check_shards / when the shard is mapped
        return default


def write_split_table(split_dir: PathLike, manifest: Manifest | None = None, *, sizes: bool = True) -> Path:
    """Write ``split_dir/stoker.index`` for its current manifest (atomically): what ``stoker pack``
    and ``stoker index`` call once the manifest is written; with the images' stored sizes unless
    ``sizes=False``."""
    split_dir = Path(split_dir)
    manifest = manifest if manifest is not None else Manifest.load(split_dir)
    with atomic_write(split_dir / TABLE_NAME) as f:
        write_table(f, split_dir, manifest, sizes=sizes)
    return split_dir / TABLE_NAME


# ---- reading the table ---------------------------------------------------------------------
class SampleTable:
    """The mapped table: :attr:`records` (a view of the map: only what is read is paged in),
    :attr:`starts`, :attr:`left_out` and :attr:`shift` (views too), and the loadable positions'
    mapping :meth:`loadable`."""

    def __init__(self, buf, *, where: Path):
        magic, version, rsize, n, shards, k, digest = HEADER.unpack_from(buf, 0)
        if magic != MAGIC or version != VERSION or rsize != RECORD.itemsize:
            raise IdxFormatError(f"{where} is not a table this stoker reads (rerun `stoker index {where.parent}`)")
        need = HEADER_BYTES + 8 * (2 * shards + 1) + RECORD.itemsize * n + 16 * k
        if len(buf) != need:
            raise IdxFormatError(f"{where} has {len(buf):,} bytes, its header says {need:,} (a partial copy?)")
        self.buf, self.digest, self.where = buf, digest, where
        #: the records hold each image's stored width and height (:meth:`sizes`)
        self.has_sizes = bool(FLAGS.unpack_from(buf, HEADER.size)[0] & FLAG_SIZES)
        pos = HEADER_BYTES
        #: global position where each shard starts, then the total
        self.starts = np.frombuffer(buf, "<i8", shards + 1, pos)
        pos += 8 * (shards + 1)
        #: each shard's ``.idx`` size when the table was built
        self.idx_bytes = np.frombuffer(buf, "<i8", shards, pos)
        pos += 8 * shards
        #: one :data:`RECORD` per sample (a view of the map)
        self.records = np.frombuffer(buf, RECORD, n, pos)
        pos += RECORD.itemsize * n
        #: sorted positions of the samples left out
        self.left_out = np.frombuffer(buf, "<i8", k, pos)
        self.shift = np.frombuffer(buf, "<i8", k, pos + 8 * k)

    def __len__(self) -> int:
        return len(self.records)

    @property
    def num_loadable(self) -> int:
        return len(self.records) - len(self.left_out)

    def loadable(self, k) -> np.ndarray:
        """Global positions of the loadable samples ``k`` (positions ``0 .. num_loadable - 1``
        into the loadable ones, in stored order): ``O(log left out)`` each."""
        k = np.asarray(k, np.int64)
        return k + np.searchsorted(self.shift, k, side="right") if len(self.shift) else k

    def position_of(self, g: int) -> int:
        """The loadable position of the loadable sample at global position ``g`` (the inverse of
        :meth:`loadable`)."""
        return int(g) - int(np.searchsorted(self.left_out, g))

    def sizes(self, positions) -> np.ndarray:
        """``(width, height)`` int64 rows of the stored images at global ``positions`` (``(0, 0)``:
        no size recorded for that sample, e.g. an image that does not parse).

        Raises:
            IdxFormatError: the table records no sizes (written by an older stoker or rebuilt on
                first use): one line saying to re-index.
        """
        if not self.has_sizes:
            raise IdxFormatError(
                f"{self.where} records no image sizes (written by an older stoker, or rebuilt on first use): "
                f"rerun `stoker index {self.where.parent}` to record them"
            )
        positions = np.asarray(positions, np.int64)
        n = len(positions)
        if n and positions[-1] - positions[0] == n - 1 and (np.diff(positions) == 1).all():
            rows = self.records[positions[0] : positions[0] + n]  # a run: a view, no gather
        else:
            rows = self.records[positions]
        out = np.empty((n, 2), np.int64)
        out[:, 0], out[:, 1] = rows["width"], rows["height"]
        return out

    def loadable_per_shard(self) -> np.ndarray:
        """Loadable samples of each shard."""
        cut = np.searchsorted(self.left_out, self.starts)
        return np.diff(self.starts) - np.diff(cut)


def _open_map(path: Path):
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if hasattr(mmap, "MADV_RANDOM"):
        m.madvise(mmap.MADV_RANDOM)  # a rank reads its records out of order
    return m


def _fresh(path: Path, digest: bytes, manifest: Manifest) -> SampleTable | None:
    """The table at ``path`` when it belongs to this manifest and these ``.idx`` files (their
    sizes), else ``None``."""
    try:
        m = _open_map(path)
    except (OSError, ValueError):  # missing, or empty (mmap of 0 bytes)
        return None
    try:
        table = SampleTable(m, where=path)
    except (IdxFormatError, struct.error):
        return None
    ok = table.digest == digest and len(table.starts) == len(manifest.shards) + 1
    ok = ok and int(table.starts[-1]) == manifest.num_samples
    return table if ok and np.array_equal(table.idx_bytes, _idx_sizes(path.parent, manifest)) else None


def open_table(split_dir: PathLike, manifest: Manifest, *, manifest_sizes: bool = False) -> SampleTable:
    """The split's table: mapped when ``stoker.index`` belongs to this manifest, else built from
    the ``.idx`` files first (one process at a time, under a lock; the others wait and map it).
    A split folder that cannot be written gets the table in memory (every rank builds it: write it
    once with ``stoker index``)."""
    split_dir = Path(split_dir)
    path = split_dir / TABLE_NAME
    digest = manifest_digest(split_dir)
    table = _fresh(path, digest, manifest)
    if table is not None:
        return table
    try:
        lock = os.open(split_dir / f".{TABLE_NAME}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only split
        return _in_memory(split_dir, manifest, manifest_sizes, path)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        table = _fresh(path, digest, manifest)  # another process built it meanwhile
        if table is not None:
            return table
        try:
            with atomic_write(path) as f:
                write_table(f, split_dir, manifest, manifest_sizes=manifest_sizes)
        except PermissionError:
            return _in_memory(split_dir, manifest, manifest_sizes, path)
        return _fresh(path, digest, manifest) or _in_memory(split_dir, manifest, manifest_sizes, path)
    finally:
        os.close(lock)  # releases the lock


def _in_memory(split_dir: Path, manifest: Manifest, manifest_sizes: bool, path: Path) -> SampleTable:
    import io

    buf = io.BytesIO()
    write_table(buf, split_dir, manifest, manifest_sizes=manifest_sizes)
    return SampleTable(buf.getvalue(), where=path)


__all__ = [
    "KIND_JPEG",
    "KIND_NONE",
    "KIND_PNG",
    "RECORD",
    "TABLE_NAME",
    "SampleTable",
    "check_bounds",
    "manifest_digest",
    "manifest_skips",
    "open_table",
    "record_sizes",
    "read_records",
    "write_split_table",
    "write_table",
]
