"""Random access to the samples of one split, by global position, out of mmap'd tars.

The ``.idx`` files give each member's data offset and size, so a sample is read with
two slices of a memory map (its image and its target, :mod:`.targets`): no tar scanning, no
per-sample Python objects kept around. Bookkeeping is a handful of flat numpy arrays
(``BYTES_PER_SAMPLE`` bytes per sample).

A cheap structural guard (:func:`image_size`) reads the image header: JPEG SOI, a frame
header and EOI; PNG signature, IHDR and IEND. It yields the stored width and height
(which the crop parameters need before decoding) and rejects truncated or foreign bytes
without decoding them.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np

from stoker.errors import ArgumentError, IdxFormatError

from ..fsutil import PathLike
from .idx import IMAGE_EXTS, MAX_CLS_BYTES, bad_idx, idx_fields, idx_lines, read_idx, sample_key
from .manifest import Manifest, check_shards, idx_path
from .targets import Target, bad_target, fast_float_reader, parse_float, parse_labels

KIND_NONE, KIND_JPEG, KIND_PNG = 0, 1, 2
_KIND = {ext.encode(): KIND_PNG if ext == "png" else KIND_JPEG for ext in IMAGE_EXTS}

#: bytes of index arrays per sample: img offset (8) + size (4) + target offset (8) + size (4)
#: + kind (1) + loadable-position list (8) [+ json offset (8) + size (4) when ``with_json``]
BYTES_PER_SAMPLE = 33

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers carry the image size; C4 (DHT), C8 (JPG), CC (DAC) do not.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# ... and the ones both decoders (libjpeg-turbo in DALI and pillow) handle: 8-bit Huffman
# baseline, extended, progressive. Lossless / arithmetic / 12-bit count as undecodable.
_SOF_OK = frozenset({0xC0, 0xC1, 0xC2})


def _parse_idx(path: Path, with_json: bool, member: bytes = b"cls"):
    """An ``.idx`` as per-sample arrays (no per-sample objects kept); ``member`` is the target's."""
    lines = idx_lines(path)
    n = len(lines)
    img_off = np.zeros(n, np.int64)
    img_size = np.zeros(n, np.uint32)
    tgt_off = np.zeros(n, np.int64)
    tgt_size = np.zeros(n, np.uint32)
    kind = np.zeros(n, np.uint8)
    js_off = np.zeros(n, np.int64) if with_json else None
    js_size = np.zeros(n, np.uint32) if with_json else None
    for i, line in enumerate(lines):
        comps = idx_fields(path, i + 2, line)
        exts = [c[0].lower() for c in comps]
        if len(set(exts)) != len(exts):
            continue  # a repeated component (a.jpg a.cls a.jpg): never paired, left invalid
        try:
            for ext, (_, offset, size, _name) in zip(exts, comps, strict=True):
                if ext in _KIND and not kind[i]:
                    kind[i] = _KIND[ext]
                    img_off[i] = offset
                    img_size[i] = size
                elif ext == member:
                    tgt_off[i] = offset
                    tgt_size[i] = size
                elif with_json and ext == b"json":
                    js_off[i] = offset
                    js_size[i] = size
        except OverflowError:
            raise bad_idx(path, f"line {i + 2}: offset/size out of range") from None
    return img_off, img_size, tgt_off, tgt_size, kind, js_off, js_size


def _check_bounds(path: Path, tar_bytes: int, part) -> None:
    """Every component an ``.idx`` lists must lie inside its tar, after a header."""
    img_off, img_size, tgt_off, tgt_size, kind = part[:5]
    for present, off, size in ((kind > 0, img_off, img_size), (tgt_size > 0, tgt_off, tgt_size)):
        off, end = off[present], off[present] + size[present]
        if len(off) and (off.min() < 512 or end.max() > tar_bytes):
            bad = int(np.flatnonzero(present)[np.argmax((off < 512) | (end > tar_bytes))])
            raise bad_idx(path, f"sample {bad} points outside its tar ({tar_bytes:,} bytes)")


def image_size(buf, start: int = 0, size: int | None = None) -> tuple[int, int] | None:
    """``(width, height)`` of a JPEG or PNG in ``buf[start:start+size]``, or ``None`` when
    the bytes are not a structurally complete JPEG/PNG (truncated, foreign, empty).

    Reads only the headers (and the last bytes for the end marker): microseconds.
    """
    end = len(buf) if size is None else start + size
    if end - start < 24:
        return None
    if buf[start] == 0xFF and buf[start + 1] == 0xD8:
        # EOI must end the data (allow trailing padding some writers add)
        tail = bytes(buf[max(start, end - 64) : end])
        if b"\xff\xd9" not in tail:
            return None
        pos = start + 2
        while pos + 10 <= end:
            if buf[pos] != 0xFF:
                return None
            marker = buf[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            if marker in _SOF:
                if marker not in _SOF_OK or buf[pos + 4] != 8 or buf[pos + 9] not in (1, 3, 4):
                    return None
                h, w = struct.unpack_from(">HH", buf, pos + 5)
                return (w, h) if w and h else None
            if marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:
                pos += 2  # markers without a length
                continue
            if marker in (0xD9, 0xDA):  # EOI or scan data before any frame header
                return None
            (seglen,) = struct.unpack_from(">H", buf, pos + 2)
            pos += 2 + seglen
        return None
    if bytes(buf[start : start + 8]) == _PNG_SIG and bytes(buf[start + 12 : start + 16]) == b"IHDR":
        if b"IEND" not in bytes(buf[max(start, end - 16) : end]):
            return None
        w, h = struct.unpack_from(">II", buf, start + 16)
        return (w, h) if w and h else None
    return None


def _size(path: Path, default: int) -> int:
    try:
        return os.path.getsize(path)
    except OSError:  # reported by check_shards / when the shard is mapped
        return default


class SampleIndex:
    """All samples of a split, addressable by global position ``0 .. len-1``.

    Args:
        split_dir: a directory with ``stoker.json``, the shards and their ``.idx`` files.
        manifest: the loaded manifest (loaded from ``split_dir`` when ``None``).
        with_json: also index the ``json`` component (for :meth:`meta`).
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
        #: most shard maps kept open (oldest closed first); ``None``: all. A bounded shard cache
        #: sets it, so a shard it evicts does not stay allocated on disk through an old map.
        self.max_maps: int | None = None
        self._keys: dict[int, list[str]] = {}  # shard -> sample keys, loaded for messages only
        self.shard_names = [s.name for s in self.manifest.shards]
        #: the split's target kind and member
        self.target: Target = self.manifest.target
        member = self.target.member.lower().encode()
        #: a ``cls`` that is a class name (foreign tars indexed with their names) -> its index
        self._class_index = {c.encode("utf-8", "surrogateescape"): i for i, c in enumerate(self.manifest.classes)}
        # (size, header) of the float32 .npy pack writes: read with one frombuffer, no parse
        self._fast_float = fast_float_reader(self.target.width) if self.target.kind == "float" else None
        parts = [_parse_idx(idx_path(self.split_dir / name), with_json, member) for name in self.shard_names]
        for name, part, info in zip(self.shard_names, parts, self.manifest.shards, strict=True):
            if len(part[0]) != info.num_samples:
                raise IdxFormatError(
                    f"index of shard {self.split_dir / name} lists {len(part[0])} samples, "
                    f"manifest says {info.num_samples} (rerun `stoker index {self.split_dir}`)"
                )
            size = info.bytes if manifest_sizes else _size(self.split_dir / name, info.bytes)
            _check_bounds(idx_path(self.split_dir / name), size, part)
        cat = lambda k, dt: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, dt)  # noqa: E731
        self.img_off = cat(0, np.int64)
        self.img_size = cat(1, np.uint32)
        self.tgt_off = cat(2, np.int64)
        self.tgt_size = cat(3, np.uint32)
        self.kind = cat(4, np.uint8)
        self.json_off = cat(5, np.int64) if with_json else None
        self.json_size = cat(6, np.uint32) if with_json else None
        counts = np.array([len(p[0]) for p in parts], np.int64)
        #: global position where each shard starts (plus the total at the end)
        self.shard_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        bad = (self.kind == KIND_NONE) | (self.tgt_size == 0)
        bad |= self._manifest_skips()
        self.num_skipped = int(bad.sum())
        #: positions the loader draws from (``arange(len)`` when nothing is skipped)
        self.valid = np.flatnonzero(~bad).astype(np.int64)

    def _manifest_skips(self) -> np.ndarray:
        """``pack["skip"]`` entries: ``[shard name, index in shard, reason]`` (what ``stoker
        index`` writes; the reason is optional), a global position (int) or a sample key (str)."""
        mask = np.zeros(len(self), bool)
        keys = set()
        shard_no = {name: k for k, name in enumerate(self.shard_names)}
        for s in self.manifest.pack.get("skip") or []:
            if isinstance(s, (list, tuple)) and len(s) in (2, 3) and s[0] in shard_no and isinstance(s[1], int):
                k = shard_no[s[0]]
                if 0 <= int(s[1]) < self.shard_start[k + 1] - self.shard_start[k]:
                    mask[self.shard_start[k] + int(s[1])] = True
            elif isinstance(s, int) and 0 <= s < len(self):
                mask[s] = True
            elif isinstance(s, str):
                keys.add(s)
        for i in range(len(self)) if keys else ():
            if self.key(i) in keys:
                mask[i] = True
        return mask

    def __len__(self) -> int:
        return int(self.shard_start[-1])

    @property
    def nbytes(self) -> int:
        """Bytes held by the per-sample arrays (the bookkeeping bound in the docs)."""
        arrays = [self.img_off, self.img_size, self.tgt_off, self.tgt_size, self.kind, self.valid]
        if self.with_json:
            arrays += [self.json_off, self.json_size]
        return sum(a.nbytes for a in arrays)

    # pickling (DataLoader workers with the spawn start method): maps are reopened lazily
    def __getstate__(self):
        d = self.__dict__.copy()
        d["_maps"] = {}
        d["_keys"] = {}
        return d

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

    def image(self, i: int) -> np.ndarray:
        """The encoded image bytes of sample ``i`` as a zero-copy uint8 view of the map."""
        m = self._map(self.shard_of(i))
        return np.frombuffer(m, np.uint8, int(self.img_size[i]), int(self.img_off[i]))

    def images(self, idx: np.ndarray) -> tuple[list, np.ndarray]:
        """Encoded views and ``(width, height)`` for many samples; ``wh`` is ``(0, 0)`` for a
        sample that fails the structural guard."""
        shards = np.searchsorted(self.shard_start, idx, side="right") - 1
        out, wh = [], np.zeros((len(idx), 2), np.int64)
        for k, (i, s) in enumerate(zip(idx.tolist(), shards.tolist(), strict=True)):
            m = self._maps.get(s) or self._map(s)
            off, size = int(self.img_off[i]), int(self.img_size[i])
            dims = image_size(m, off, size)
            if dims is not None:
                wh[k] = dims
            out.append(np.frombuffer(m, np.uint8, size, off))
        return out, wh

    def _members(self, idx: np.ndarray) -> list:
        """The target members' bytes of the samples at ``idx`` (zero-copy views of the maps)."""
        shards = np.searchsorted(self.shard_start, idx, side="right") - 1
        out = []
        for i, s in zip(idx.tolist(), shards.tolist(), strict=True):
            m = self._maps.get(s) or self._map(s)
            off = int(self.tgt_off[i])
            out.append(np.frombuffer(m, np.uint8, int(self.tgt_size[i]), off))
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
        shards = np.searchsorted(self.shard_start, idx, side="right") - 1
        out = np.empty(len(idx), np.int64)
        for k, (i, s) in enumerate(zip(idx.tolist(), shards.tolist(), strict=True)):
            m = self._maps.get(s) or self._map(s)
            off, size = int(self.tgt_off[i]), int(self.tgt_size[i])
            raw = m[off : off + size] if size <= MAX_CLS_BYTES else b"x"
            try:
                out[k] = int(raw) if raw.strip().isdigit() else self._class_index.get(bytes(raw).strip(), -1)
            except ValueError:  # digits Python will not convert (e.g. too long)
                out[k] = -1
        bad = (out < 0) | (out >= len(self.manifest.classes))
        if bad.any():
            i = int(idx[int(np.argmax(bad))])
            m = self._map(self.shard_of(i))
            raw = bytes(m[int(self.tgt_off[i]) : int(self.tgt_off[i]) + min(int(self.tgt_size[i]), MAX_CLS_BYTES)])
            raise bad_target(
                self.describe(i),
                f"cls {raw.decode('utf-8', 'replace')!r} is not a class index below {len(self.manifest.classes)}",
                self.split_dir,
            )
        return out

    def targets(self, idx: np.ndarray) -> np.ndarray:
        """The targets of the samples at ``idx``, as the Loader yields them (on the CPU): class
        indices int64 ``[N]``; float32 ``[N]`` (one column) or ``[N, K]``; multi-hot float32
        ``[N, C]``. Masks are images: :meth:`masks`.

        Raises:
            TargetError: one line naming the shard and key of a sample whose target does not
                parse, has the wrong width, is not finite, or names a class past the split's.
        """
        kind = self.target.kind
        if kind == "class":
            return self.labels(idx)
        if kind == "mask":
            raise ArgumentError("a mask split's targets are images: use masks()")
        raws = self._members(idx)
        member = self.target.member
        if kind == "float":
            width = self.target.width
            out = np.empty((len(idx), width), np.float32)
            size, header = self._fast_float
            for k, raw in enumerate(raws):
                if len(raw) == size and raw[: len(header)].tobytes() == header:  # what pack wrote
                    out[k] = np.frombuffer(raw, "<f4", width, len(header))
                    if np.isfinite(out[k]).all():
                        continue
                value = parse_float(raw.tobytes(), member, width)
                if isinstance(value, str):
                    raise bad_target(self.describe(int(idx[k])), value, self.split_dir)
                out[k] = value
            return out[:, 0] if width == 1 else out
        num_classes = len(self.manifest.classes)
        out = np.zeros((len(idx), num_classes), np.float32)
        for k, raw in enumerate(raws):
            labels = parse_labels(raw.tobytes(), member, num_classes)
            if isinstance(labels, str):
                raise bad_target(self.describe(int(idx[k])), labels, self.split_dir)
            out[k, labels] = 1.0
        return out

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
        m = self._map(self.shard_of(i))
        off = int(self.json_off[i])
        return bytes(m[off : off + int(self.json_size[i])])

    def describe(self, i: int) -> str:
        """``"shard-000001.tar key 000000017"``, for messages."""
        return f"{self.shard_path(i)} key {self.key(i)}"

    def close(self) -> None:
        for m in self._maps.values():
            _close_map(m)
        self._maps.clear()


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


__all__ = ["SampleIndex", "open_split", "image_size", "BYTES_PER_SAMPLE"]
