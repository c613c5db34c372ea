"""What ``stoker pack`` reads: scan an ImageFolder tree, a ``train/``+``val/`` tree or
a CSV/TSV of ``path,label`` into per-split sample lists, deterministically.

Order is fixed by the data alone: folders are walked sorted (symlinks followed),
then each split's list is shuffled with ``random.Random(seed)``. A sample's key is
its position in that shuffled list, so keys are unique across ``--part``\\ s.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError
from .sanitize import IMAGE_EXTS

SPLITS = ("train", "val")


@dataclass(slots=True)  # a million of these stay in memory during a pack: keep them small
class Item:
    """One input: ``rel`` path (posix; relative to SRC, or as written in the CSV) and
    class ``label`` index. The file is ``Source.base / rel``."""

    rel: str
    label: int


@dataclass
class Source:
    """A scanned SRC: class names and, per split, the shuffled items and skip counts.
    ``base`` is the folder item paths are relative to (SRC, or the CSV's folder)."""

    base: Path
    classes: list[str]
    splits: dict[str, list[Item]]
    skipped: dict[str, int] = field(default_factory=dict)

    def path(self, item: Item) -> str:
        return os.path.join(self.base, item.rel)

    def digest(self, split: str) -> str:
        """sha256 of a split's (shuffled) sample list: identifies the input of a pack."""
        h = hashlib.sha256()
        for it in self.splits[split]:
            h.update(json.dumps([it.rel, it.label]).encode() + b"\n")
        return h.hexdigest()


def _hidden(name: str) -> bool:
    return name.startswith(".") or name == "__MACOSX"


def _walk_files(top: Path, skipped: list[int]) -> list[Path]:
    """All non-hidden image files under ``top``, sorted, symlinks followed (loops cut)."""
    out: list[Path] = []
    seen: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in seen:  # a symlink loop or a second link to the same folder
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(d for d in dirnames if not _hidden(d))
        for name in sorted(filenames):
            if _hidden(name) or os.path.splitext(name)[1].lower() not in IMAGE_EXTS:
                skipped[0] += 1
                continue
            out.append(Path(dirpath) / name)
    return out


def _class_dirs(root: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(root) if not _hidden(e.name) and e.is_dir())


def _loose_files(root: Path) -> int:
    """Files directly in a folder that should hold only class folders (skipped)."""
    return sum(1 for e in os.scandir(root) if not e.is_dir())


def _scan_folder(root: Path, split_root: Path, classes: list[str], skipped: list[int]) -> list[Item]:
    items = []
    index = {c: i for i, c in enumerate(classes)}
    for cls in _class_dirs(split_root):
        for p in _walk_files(split_root / cls, skipped):
            items.append(Item(p.relative_to(root).as_posix(), index[cls]))
    return items


def _scan_csv(path: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Rows ``(path, label)`` of a CSV/TSV (header optional) -> class names, rows."""
    text = path.read_text(encoding="utf-8-sig")
    delim = "\t" if path.suffix.lower() == ".tsv" or ("\t" in text.split("\n", 1)[0]) else ","
    rows = [r for r in csv.reader(text.splitlines(), delimiter=delim) if r and any(c.strip() for c in r)]
    if rows and rows[0][0].strip().lower() in ("path", "file", "filename", "image"):
        rows = rows[1:]
    out = []
    for lineno, r in enumerate(rows, start=1):
        if len(r) < 2:
            raise UsageError(f"{path}: row {lineno} should be 'path,label', got {r!r}")
        out.append((r[0].strip(), r[1].strip()))
    labels = {lab for _, lab in out}
    if labels and all(lab.isdigit() for lab in labels):
        classes = [str(i) for i in range(max(int(lab) for lab in labels) + 1)]
    else:
        classes = sorted(labels)
    return classes, out


def scan(src: Path, *, seed: int, val_fraction: float = 0.0) -> Source:
    """Scan ``src`` (folder or CSV/TSV) into a :class:`Source`; raise UsageError when
    it does not exist or holds no image."""
    if not src.exists():
        raise UsageError(f"SRC {src} does not exist")
    skipped = {s: [0] for s in SPLITS}
    splits: dict[str, list[Item]]
    if src.is_file():
        if src.suffix.lower() not in (".csv", ".tsv", ".txt"):
            raise UsageError(f"SRC {src} is a file but not a .csv/.tsv list of 'path,label'")
        classes, rows = _scan_csv(src)
        index = {c: i for i, c in enumerate(classes)}
        base = src.parent
        items = [Item(Path(p).as_posix(), index[lab] if lab in index else int(lab)) for p, lab in rows]
        splits = {"train": items}
    else:
        top = _class_dirs(src)
        if "train" in top and set(top) <= set(SPLITS):
            names = set(_class_dirs(src / "train"))
            if "val" in top:
                names |= set(_class_dirs(src / "val"))
            classes = sorted(names)
            splits = {}
            for s in SPLITS:
                if s in top:
                    skipped[s][0] += _loose_files(src / s)
                    splits[s] = _scan_folder(src, src / s, classes, skipped[s])
            skipped["train"][0] += _loose_files(src)
            if "val" in splits and val_fraction:
                raise UsageError(f"--val-fraction given but {src} already has a val/ folder")
        else:
            classes = top
            skipped["train"][0] += _loose_files(src)
            splits = {"train": _scan_folder(src, src, classes, skipped["train"])}
        base = src
    if not any(splits.values()):
        raise UsageError(f"SRC {src} holds no images")
    if val_fraction:
        splits["train"], splits["val"] = stratified_split(splits["train"], val_fraction, seed)
    for items in splits.values():
        random.Random(seed).shuffle(items)
    return Source(base, classes, splits, {s: skipped[s][0] for s in splits})


def stratified_split(items: list[Item], fraction: float, seed: int) -> tuple[list[Item], list[Item]]:
    """Move a seeded ``fraction`` of each class (rounded) from train to val; both keep
    scan order."""
    by_class: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_class.setdefault(it.label, []).append(i)
    rng = random.Random(f"stoker-val-{seed}")
    to_val: set[int] = set()
    for label in sorted(by_class):
        idx = by_class[label]
        k = round(len(idx) * fraction)
        to_val.update(rng.sample(idx, k))
    train = [it for i, it in enumerate(items) if i not in to_val]
    val = [it for i, it in enumerate(items) if i in to_val]
    return train, val


def part_range(n: int, part: int, parts: int) -> tuple[int, int]:
    """Contiguous slice ``[start, end)`` of ``n`` items for part ``part`` of ``parts``."""
    return n * part // parts, n * (part + 1) // parts
