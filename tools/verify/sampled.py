"""``stoker verify --sample K``: K random samples of each split checked, at the cost of K
samples, not of the split.

What it checks: the manifest's promises that need no shard read (every shard present with its
size, its ``.idx`` beside it, the split's sample table), then for each of the K samples (found
through the table, :mod:`stoker.pipeline.shards.table`): the tar member headers in front of
its image and its target (their size is the index's), the target (a class in range, a float,
a label list, a mask of its image's size), and the image decoding with the Loader's decoders.
What it skips (run without ``--sample`` for those): each shard's sha256, the full tar scan, the
comparison of every ``.idx`` with its tar, and the samples not drawn.
"""

from __future__ import annotations

import os
import random
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from stoker.errors import IdxFormatError, ManifestError
from stoker.pipeline.shards.idx import read_idx, sample_key
from stoker.pipeline.shards.manifest import Manifest, idx_path
from stoker.pipeline.shards.samples import image_size
from stoker.pipeline.shards.table import SampleTable, manifest_skips, open_table

from .imagecheck import ImageChecker
from .report import ShardReport


def sampled_reports(
    split_dir: Path, k: int, seed: int, *, remote_sizes: dict[str, int] | None = None
) -> list[ShardReport]:
    """One report per shard of ``split_dir``: the shard-list checks, and the checks of the
    samples of the ``k`` drawn (``seed``) that it holds. ``remote_sizes``: the shards' sizes where
    they are stored (a URL's split: only the drawn samples' shards were downloaded)."""
    m = Manifest.load(split_dir)
    split = split_dir.name
    reports = [ShardReport(split, s.name, samples=s.num_samples, sha_ok=None, idx_ok=None) for s in m.shards]
    listed = True
    for rep, info in zip(reports, m.shards, strict=True):
        where, tar = f"{split}/{info.name}", split_dir / info.name
        size = remote_sizes.get(info.name) if remote_sizes is not None else _size(tar)
        if size is None:
            rep.problems.append(f"{where}: missing")
            listed = False
            continue
        rep.bytes = size
        if size != info.bytes:
            rep.problems.append(f"{where}: {size} bytes, manifest says {info.bytes}")
            listed = False
        if not idx_path(tar).exists():
            rep.problems.append(f"{where}: {idx_path(tar).name} is missing (rerun `stoker index {split_dir}`)")
            listed = False
    if not listed:  # the samples cannot be found in a split whose shards are not all there
        return reports
    try:
        table = open_table(split_dir, m, manifest_sizes=remote_sizes is not None)
    except (IdxFormatError, ManifestError) as e:
        bad = next((r for r in reports if f"/{r.name[:-4]}.idx" in str(e)), reports[0])
        bad.problems.append(f"{split}/{bad.name}: {e}")
        return reports
    picks = draw(m.num_samples, k, seed)
    skipped = set(manifest_skips(m, table.starts, split_dir)) & set(picks)
    by_shard: dict[int, list[int]] = defaultdict(list)
    for g, s in zip(picks, np.searchsorted(table.starts, picks, side="right") - 1, strict=True):
        by_shard[int(s)].append(g)
    checker = ImageChecker(require_rgb="indexed_by" not in m.pack)
    for s, positions in sorted(by_shard.items()):
        rep = reports[s]
        rep.skipped = sum(g in skipped for g in positions)
        todo = [g for g in positions if g not in skipped]
        _check_samples(rep, split_dir / m.shards[s].name, table, todo, int(table.starts[s]), m, checker)
    return reports


def draw(num_samples: int, k: int, seed: int) -> list[int]:
    """``k`` distinct positions of ``num_samples``, sorted (``O(k)`` memory)."""
    return sorted(random.Random(seed).sample(range(num_samples), min(k, num_samples)))


def _size(path: Path) -> int | None:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def _check_samples(
    rep: ShardReport,
    tar: Path,
    table: SampleTable,
    positions: list[int],
    start: int,
    m: Manifest,
    checker: ImageChecker,
) -> None:
    where = f"{rep.split}/{rep.name}"
    keys: list[str] = []

    def label(g: int) -> str:  # the key, for a message only: the shard's .idx read then
        if not keys:
            keys.extend(sample_key(s) for s in read_idx(idx_path(tar)))
        return f"{where} sample {g - start} (key {keys[g - start]})"

    def bad(g: int, why: str) -> None:
        rep.bad += 1
        rep.problems.append(f"{label(g)}: {why}")

    target, names = m.target, {c: i for i, c in enumerate(m.classes)}
    pending: list[tuple[int, bytes]] = []
    with open(tar, "rb") as f:
        for g in positions:
            rec = table.records[g]
            if rec["kind"] == 0:
                bad(g, "no image component (or a component repeated)")
                continue
            if rec["tgt_size"] == 0:
                bad(g, target.missing())
                continue
            why = _member_at(f, int(rec["img_off"]), int(rec["img_size"])) or _member_at(
                f, int(rec["tgt_off"]), int(rec["tgt_size"])
            )
            if why:
                bad(g, f"{why} (rerun `stoker index {tar.parent}`)")
                continue
            f.seek(int(rec["img_off"]))
            image = f.read(int(rec["img_size"]))
            off, size = int(rec["tgt_off"]), int(rec["tgt_size"])
            why = target_problem(f, target, off, size, lambda: image, len(m.classes), names)  # noqa: B023 - called now
            if why:
                bad(g, why)
                continue
            pending.append((g, image))
    for (g, _), err in zip(pending, checker.check([d for _, d in pending]), strict=True):
        if err:
            bad(g, err)
        else:
            rep.decoded += 1


def target_problem(f, target, offset: int, size: int, image, num_classes: int, names: dict) -> str | None:
    """Why the target member at ``offset`` of the open tar ``f`` is not a usable target of ``target``'s
    kind (:meth:`~stoker.pipeline.shards.kinds.Target.check`), or None; ``image()``: the sample's
    image bytes (read when the kind needs the image's size)."""
    if size > target.max_bytes:
        return target.oversize(size)
    f.seek(offset)
    raw = f.read(size)
    wh = image_size(image()) if target.sized else None
    return target.check(raw, num_classes=num_classes, image_wh=wh, names=names)


def _member_at(f, offset: int, size: int) -> str | None:
    """Why the 512 bytes before ``offset`` are not the tar header of a ``size``-byte member."""
    if offset < 512:
        return f"the index points at byte {offset:,}, before any tar member"
    f.seek(offset - 512)
    try:
        info = tarfile.TarInfo.frombuf(f.read(512), "utf-8", "surrogateescape")
    except tarfile.TarError:
        return f"the index points at byte {offset:,}, where no tar member starts"
    if info.size != size:
        return f"the tar member at byte {offset:,} has {info.size:,} bytes, the index says {size:,}"
    return None


__all__ = ["draw", "sampled_reports"]
