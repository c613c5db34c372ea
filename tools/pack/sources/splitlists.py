"""Official split lists (``--train-list FILE``, ``--val-list FILE``): the split a dataset ships
(Pascal VOC's ``ImageSets/Segmentation/train.txt`` and ``val.txt``) is the split that is packed,
for any reader whose SRC has no split of its own.

A list names one image a line (blank lines and ``#`` comments skipped): its path relative to SRC,
that path without its extension, or its file stem (``2007_000032``). Listed images go to the
list's split; with ``--train-list``, images in no list are skipped (counted in train's *skipped*),
even those the scan rejected (VOC's ``JPEGImages`` holds 17,125 photos, its segmentation lists
the 2,913 that have masks); with ``--val-list`` alone the others are train. Rejects: a line
naming no image of SRC (``listed in val.txt line 3 but not in SRC``), an image in both lists; a
line naming an image the scan rejected keeps the scan's reason (a second path to a file already
packed: ``same file as ...``, by the sources' one identity rule). A stem that names several
images is a one-line error (write their relative paths).
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from stoker.errors import UsageError, arg

from ..options import setting
from .base import Item, Scan
from .csvlist import read_text


def _keys(rel: str) -> set[str]:
    """The names a list line may give ``rel`` by: its path, the path without its extension, its stem."""
    rel = posixpath.normpath(rel)
    stem = posixpath.splitext(rel)[0]
    return {rel, stem, posixpath.basename(stem)}


def _names(path: Path) -> list[tuple[int, str]]:
    return [
        (n, line.strip())
        for n, line in enumerate(read_text(path).splitlines(), start=1)
        if line.strip() and not line.strip().startswith("#")
    ]


def apply_split_lists(found: Scan, train_list: Path | None, val_list: Path | None, val_fraction: float) -> None:
    """Split ``found``'s train items by the lists, in place (scan order kept)."""
    if "val" in found.splits:
        raise UsageError(f"{setting('train_list')}/{setting('val_list')} given but SRC already has {found.val_source}")
    if val_list is not None and val_fraction:
        raise UsageError(f"{setting('val_list')} and {arg('val_fraction')} both choose the val split: give one")
    for lst in (train_list, val_list):
        if lst is not None and not lst.is_file():
            raise UsageError(f"split list {lst} is not a file (one image name, path or stem a line)")
    items = found.splits["train"]
    by_key: dict[str, list[int]] = {}
    for i, it in enumerate(items):
        for key in _keys(it.rel):
            by_key.setdefault(key, []).append(i)
    scan_rejected = {key for rel, _ in found.rejects.get("train", []) for key in _keys(rel)}
    chosen: dict[int, str] = {}
    listed: set[str] = set()
    rejects: dict[str, list[tuple[str, str]]] = {"train": [], "val": []}
    twice: set[int] = set()
    for split, lst in (("train", train_list), ("val", val_list)):
        if lst is None:
            continue
        for lineno, name in _names(lst):
            key = posixpath.normpath(name.replace("\\", "/"))  # ./a.jpg, a//b.jpg
            listed.add(key)
            hits = by_key.get(key, [])
            exact = [
                i for i in hits if posixpath.normpath(items[i].rel) == key or posixpath.splitext(items[i].rel)[0] == key
            ]
            hits = exact or hits
            if not hits:
                if key not in scan_rejected:  # else the scan's reject says why (no mask, say)
                    rejects[split].append((name, f"listed in {lst.name} line {lineno} but not in SRC"))
                continue
            if len(hits) > 1:
                some = ", ".join(items[i].rel for i in hits[:3])
                raise UsageError(
                    f"{lst}: line {lineno} {name!r} names {len(hits)} images ({some}); "
                    "write their paths relative to SRC"
                )
            i = hits[0]
            if chosen.get(i, split) != split:
                twice.add(i)
            chosen[i] = split
    for i in sorted(twice):
        rejects["train"].append((items[i].rel, f"listed in both {train_list.name} and {val_list.name}"))
    # what the scan rejected stays a reject when it is listed (or nothing is left out)
    kept = [r for r in found.rejects.get("train", []) if train_list is None or _keys(r[0]) & listed]
    skipped = len(found.rejects.get("train", [])) - len(kept)
    rejects["train"] = kept + rejects["train"]
    train: list[Item] = []
    val: list[Item] = []
    for i, it in enumerate(items):
        split = chosen.get(i, None if train_list is not None else "train")
        if i in twice:
            continue
        if split is None:
            skipped += 1
        else:
            (train if split == "train" else val).append(it)
    found.splits = {"train": train, "val": val} if val_list is not None else {"train": train}
    found.skipped["train"] = found.skipped.get("train", 0) + skipped
    found.rejects = rejects if val_list is not None else {"train": rejects["train"]}
    found.val_source = setting("val_list")


__all__ = ["apply_split_lists"]
