"""A split's samples grouped for balance, as tables cached beside the split: a class split's
samples by class, a multi-label split's by each sample's rarest label (:func:`class_members`),
and any per-split array (:func:`cached_table`; the per-sample weights of
:mod:`.sampleweights`). Built once by the first rank under a lock, memory-mapped after."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import numpy as np

from .fsutil import atomic_write
from .shards.samples import SampleIndex
from .shards.table import manifest_digest

CLASSES_NAME = "stoker.classes"
RAREST_NAME = "stoker.rarest"


def class_members(index: SampleIndex) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, members)`` of a split its kind groups by class (``Target.balance_groups``): its
    loadable positions sorted by group (stable; a class split's by class, a multi-label split's by
    rarest label, then those with none), and where each group begins in them. Memory-mapped from
    ``stoker.classes.<manifest digest>.npy`` beside the split's table (built once, under a lock);
    in memory when the folder cannot be written."""
    num_classes = len(index.manifest.classes)
    if index.target.balance_groups == "rarest":  # by each sample's rarest label; one more group: no label
        table = cached_table(index, RAREST_NAME, lambda: _sorted(_rarest_labels(index, num_classes), num_classes + 1))
        return table[: num_classes + 2], table[num_classes + 2 :]
    table = cached_table(index, CLASSES_NAME, lambda: _build(index, num_classes))
    return table[: num_classes + 1], table[num_classes + 1 :]


def _rarest_labels(index: SampleIndex, num_classes: int) -> np.ndarray:
    """A multi-label split's samples each by its rarest label (the label fewest samples carry;
    ties to the lower index), ``num_classes`` for a sample with none: two passes over the
    targets, a chunk of samples at a time."""
    chunks = [np.arange(lo, min(lo + 65536, index.num_valid)) for lo in range(0, index.num_valid, 65536)]
    carried = np.zeros(num_classes, np.int64)
    for k in chunks:
        carried += (index.targets(index.valid_at(k)) > 0).sum(0)
    labels = np.empty(index.num_valid, np.int64)
    for k in chunks:
        hot = index.targets(index.valid_at(k)) > 0
        rarest = np.where(hot, carried, np.iinfo(np.int64).max).argmin(1)
        labels[k] = np.where(hot.any(1), rarest, num_classes)
    return labels


def cached_table(index: SampleIndex, name: str, build) -> np.ndarray:
    """The array ``build()`` makes of a split, memory-mapped from ``<name>.<manifest digest>.npy``
    beside its table: built once by the first rank under a lock, in memory when the folder
    cannot be written."""
    split = Path(index.split_dir)
    path = split / f"{name}.{manifest_digest(split).hex()[:16]}.npy"
    table = _open(path)
    if table is not None:
        return table
    try:
        lock = os.open(split / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only split: every rank builds it
        return build()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        table = _open(path)
        if table is None:
            built = build()
            try:
                with atomic_write(path) as f:
                    np.save(f, built)
                table = _open(path)
            except PermissionError:
                table = built
    finally:
        os.close(lock)
    return table


def _open(path: Path) -> np.ndarray | None:
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None


def _build(index: SampleIndex, num_classes: int) -> np.ndarray:
    """Every loadable sample's class read once (the split's ``cls`` members), sorted: a shard at a
    time, its digit members parsed in one vectorized pass (:func:`_digit_labels`), any other
    shard by the split's own decoder (which names a bad member in one line)."""
    labels = np.empty(index.num_valid, np.int64)
    ends = np.cumsum(index.valid_counts())
    for shard, (lo, hi) in enumerate(zip(np.concatenate([[0], ends[:-1]]).tolist(), ends.tolist(), strict=True)):
        if hi > lo:
            g = index.valid_at(np.arange(lo, hi))
            fast = _digit_labels(index, shard, g, num_classes)
            labels[lo:hi] = fast if fast is not None else index.labels(g)
    return _sorted(labels, num_classes)


def _sorted(labels: np.ndarray, groups: int) -> np.ndarray:
    """``starts`` (``groups + 1`` values) then the positions sorted by ``labels`` (stable), one array."""
    dtype = np.int32 if len(labels) < 2**31 else np.int64  # half the pages a rank's draws touch
    members = np.argsort(labels, kind="stable").astype(dtype)
    starts = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=groups))]).astype(dtype)
    return np.concatenate([starts, members])


def _digit_labels(index: SampleIndex, shard: int, g: np.ndarray, num_classes: int) -> np.ndarray | None:
    """The classes of shard ``shard``'s samples ``g`` when every ``cls`` member is 1 to 9 ASCII
    digits naming a class (what ``stoker pack`` writes), read from the shard's bytes at the table's
    offsets in one pass; else ``None``."""
    size = np.asarray(index.tgt_size[g], np.int64)
    if not len(g) or size.min() < 1 or size.max() > 9:
        return None
    data = np.memmap(f"{index.split_dir}{os.sep}{index.shard_names[shard]}", np.uint8, mode="r")
    at = np.asarray(index.tgt_off[g], np.int64)[:, None] + np.arange(int(size.max()))
    inside = np.arange(int(size.max())) < size[:, None]
    digits = data[np.minimum(at, len(data) - 1)].astype(np.int64) - ord("0")
    if not np.all(((digits >= 0) & (digits <= 9)) | ~inside):
        return None
    power = 10 ** np.clip(size[:, None] - 1 - np.arange(int(size.max())), 0, None)
    value = np.where(inside, digits * power, 0).sum(1)
    return value if value.max() < num_classes else None


class ClassSlots:
    """A balanced split's slot members: ``(class, place)`` to the split's loadable position."""

    def __init__(self, starts: np.ndarray, members: np.ndarray):
        self.starts, self.members = starts, members

    def __call__(self, klass: np.ndarray, place: np.ndarray) -> np.ndarray:
        return np.asarray(self.members[np.asarray(self.starts, np.int64)[klass] + place], np.int64)

    def counts(self) -> np.ndarray:
        return np.diff(np.asarray(self.starts, np.int64))
