"""What ``stoker pack`` reads: scan an ImageFolder tree, a ``train/``+``val/`` tree or
a CSV/TSV of ``path,label`` into per-split sample lists, deterministically.

Order is fixed by the data alone: folders are walked sorted, then each split's list
is shuffled with ``random.Random(seed)``. A sample's key is its position in that
shuffled list, so keys are unique across ``--part``\\ s.

Every path the scan meets ends as an item, a skip (hidden files, files without an
image extension) or a scan reject ``(path, reason)`` that the pack lists in
``rejects.jsonl``. Nothing is dropped silently.

Walking folders:

* Symlinks are followed, but each real folder (by ``st_dev, st_ino``) is walked once
  and each real file is packed once. A link back up to the class folder's parent, the
  split folder or any folder above it (``cls/loop -> ..``) is not followed: reject
  ``"symlink loop to <target>: not followed"``. A link (to a folder or file) that lands
  inside another class's folder is not followed either (its images would get the wrong
  label): reject ``"link into class '<name>': not followed"``; nor one from ``train/``
  into ``val/`` (or back): reject ``"link into val/: not followed"``. A folder or file reached
  again from another class (hard links, two links to one outside folder) is packed
  under the first class in sorted order, the later one is rejected ``"same file as
  <path> (class '<name>')"``; reached again in the same class it is simply packed once.
* Unreadable folders and dangling links are rejects (``"unreadable folder: <error>"``,
  ``"broken symlink"``). FIFOs, sockets and devices with an image name are rejects
  ``"not a regular file (<kind>)"``; they are never opened.
* File names that are not valid UTF-8 are packed. Inside the pack (sample ``json``,
  ``rejects.jsonl``) their name is written with each undecodable byte as ``\\xNN``
  (:func:`display_path`), so every file stoker writes is valid UTF-8.

CSV/TSV lists (``path,label`` per row; tab-separated when the file is ``.tsv`` or its
first line holds a tab):

* The file must be UTF-8 (a BOM is fine); otherwise a one-line error names the file
  and how to convert it (``iconv -f latin1 -t utf-8``).
* The first row is a header, and skipped, when its path cell has no image extension and
  it names a column: ``path/file/filename/filepath/image/img/image_path`` or
  ``label/class/cls/target/category/y``.
* Integer labels: when every label is an ASCII integer (``-?[0-9]+``), labels are kept
  as they are (class ``i`` is index ``i``; class names are ``"0".."max"``). A label
  below 0 or above :data:`MAX_LABEL` (1,000,000) is a reject ``"label <x> out of range
  0..1000000"``.
* Name labels: when every label is a non-integer string (``cat``, ``²``, ``n01440764``),
  class names are the sorted distinct labels and the index is the position.
* Labels that mix both kinds are a one-line error naming an example of each (a column
  of integers with one odd entry is almost always a mistake).
* An empty path or label cell is a reject ``"empty path"``/``"empty label"``; a row with
  fewer than two cells is a one-line error naming the row.

One module past 400 lines because it is one set of rules: every way an input can be walked,
labelled or rejected, which must agree with each other.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from stoker.errors import UsageError

from .sanitize import IMAGE_EXTS

SPLITS = ("train", "val")
MAX_LABEL = 1_000_000  # integer labels above this are rejects: a class list that long is a typo
_PATH_WORDS = {"path", "file", "filename", "filepath", "file_path", "image", "img", "image_path", "image_name"}
_LABEL_WORDS = {"label", "class", "cls", "target", "category", "y", "class_name", "label_name"}
_INT = re.compile(r"-?[0-9]+")


@dataclass(slots=True)  # a million of these stay in memory during a pack: keep them small
class Item:
    """One input: ``rel`` path (posix; relative to SRC, or as written in the CSV) and
    class ``label`` index. The file is ``Source.base / rel``."""

    rel: str
    label: int


@dataclass
class Source:
    """A scanned SRC: class names and, per split, the shuffled items, skip counts and
    scan rejects ``(display path, reason)``. ``base`` is the folder item paths are
    relative to (SRC, or the CSV's folder)."""

    base: Path
    classes: list[str]
    splits: dict[str, list[Item]]
    skipped: dict[str, int] = field(default_factory=dict)
    rejects: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def path(self, item: Item) -> str:
        return os.path.join(self.base, item.rel)

    def digest(self, split: str) -> str:
        """sha256 of a split's (shuffled) sample list: identifies the input of a pack."""
        h = hashlib.sha256()
        for it in self.splits[split]:
            h.update(json.dumps([it.rel, it.label]).encode() + b"\n")
        return h.hexdigest()


def display_path(rel: str) -> str:
    """``rel`` as valid UTF-8 text: bytes of a non-UTF-8 file name become ``\\xNN``."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")


def _hidden(name: str) -> bool:
    return name.startswith(".") or name == "__MACOSX"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class _Walker:
    """Walks the class folders of one split (see the module docstring for the rules)."""

    def __init__(
        self,
        root: Path,
        split_root: Path,
        class_names: list[str],
        skipped: list[int],
        other_splits: tuple[Path, ...] = (),
    ):
        self.root, self.split_root, self.skipped = root, split_root, skipped
        self.split_real = os.path.realpath(split_root)
        self.other_real = {p.name: os.path.realpath(p) for p in other_splits}
        self.class_real = {c: os.path.realpath(split_root / c) for c in class_names}
        self.dirs: dict[tuple[int, int], tuple[str, str]] = {}  # real folder -> (class, rel)
        self.files: dict[tuple[int, int], tuple[str, str]] = {}  # real file -> (class, rel)
        self.rejects: list[tuple[str, str]] = []

    def rel(self, path: str) -> str:
        return Path(os.path.relpath(path, self.root)).as_posix()

    def reject(self, path: str, reason: str) -> None:
        self.rejects.append((display_path(self.rel(path)), reason))

    def _link_target_ok(self, path: str, cls: str) -> bool:
        """For a symlink: False (and a reject) when it loops up or lands in another class."""
        target = os.path.realpath(path)
        if _inside(self.split_real, target):
            self.reject(path, f"symlink loop to {display_path(target)}: not followed")
            return False
        for other, real in self.class_real.items():
            if other != cls and _inside(target, real) and not _inside(target, self.class_real[cls]):
                self.reject(path, f"link into class {other!r}: not followed")
                return False
        for split, real in self.other_real.items():  # train/x -> ../../val/x would leak val into train
            if _inside(target, real):
                self.reject(path, f"link into {split}/: not followed")
                return False
        return True

    def _seen(self, table: dict, key: tuple[int, int], cls: str, path: str, rel: str | None = None) -> bool:
        """True when ``key`` was met before: silently once more in the same class, a
        reject when another class has it. ``rel``: ``path`` relative to root, if known."""
        first = table.get(key)
        if first is None:
            table[key] = (cls, rel or self.rel(path))
            return False
        if first[0] != cls:
            self.reject(path, f"same file as {display_path(first[1])} (class {first[0]!r})")
        return True

    def walk(self, cls: str) -> list[str]:
        """Image paths (relative to root) of class ``cls``, sorted depth-first."""
        out: list[str] = []
        top = str(self.split_root / cls)
        try:
            st = os.stat(top)
        except OSError as e:
            self.reject(top, f"unreadable folder: {e.strerror}")
            return out
        if os.path.islink(top) and not self._link_target_ok(top, cls):  # a class folder linked to SRC itself
            return out
        if self._seen(self.dirs, (st.st_dev, st.st_ino), cls, top):
            return out
        self._walk_dir(top, self.rel(top), st.st_dev, cls, out)
        return out

    def _walk_dir(self, folder: str, rel: str, dev: int, cls: str, out: list[str]) -> None:
        stack = [(folder, rel, dev)]
        while stack:
            d, drel, ddev = stack.pop()
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as e:
                self.reject(d, f"unreadable folder: {e.strerror}")
                continue
            subdirs = []
            for e in entries:
                if _hidden(e.name):
                    if not e.is_dir():
                        self.skipped[0] += 1
                    continue
                erel = f"{drel}/{e.name}"
                try:
                    if e.is_file(follow_symlinks=False):  # the common case: no stat (d_type, d_ino)
                        if os.path.splitext(e.name)[1].lower() not in IMAGE_EXTS:
                            self.skipped[0] += 1
                        elif not self._seen(self.files, (ddev, e.inode()), cls, e.path, erel):
                            out.append(erel)
                        continue
                    link = e.is_symlink()
                    st = os.stat(e.path)  # follows links
                except OSError as ex:
                    self.reject(e.path, "broken symlink" if e.is_symlink() else f"unreadable: {ex.strerror}")
                    continue
                if link and not self._link_target_ok(e.path, cls):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if not self._seen(self.dirs, (st.st_dev, st.st_ino), cls, e.path, erel):
                        subdirs.append((e.path, erel, st.st_dev))
                    continue
                if os.path.splitext(e.name)[1].lower() not in IMAGE_EXTS:
                    self.skipped[0] += 1
                    continue
                if not stat.S_ISREG(st.st_mode):
                    self.reject(e.path, f"not a regular file ({_kind(st.st_mode)})")
                    continue
                if not self._seen(self.files, (st.st_dev, st.st_ino), cls, e.path, erel):
                    out.append(erel)
            stack.extend(reversed(subdirs))  # popped in sorted order


def _scandir(root: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(root) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise UsageError(f"cannot read folder {display_path(str(root))}: {e.strerror}; check its permissions") from None


def _is_dir(e: os.DirEntry) -> bool:
    try:
        return e.is_dir()
    except OSError:
        return False


def _class_dirs(root: Path) -> list[str]:
    return [e.name for e in _scandir(root) if not _hidden(e.name) and _is_dir(e)]


def _loose_files(root: Path) -> int:
    """Files directly in a folder that should hold only class folders (skipped)."""
    return sum(1 for e in _scandir(root) if not _is_dir(e))


def _scan_folder(
    root: Path,
    split_root: Path,
    classes: list[str],
    skipped: list[int],
    rejects: list[tuple[str, str]],
    other_splits: tuple[Path, ...] = (),
) -> list[Item]:
    items = []
    index = {c: i for i, c in enumerate(classes)}
    names = _class_dirs(split_root)
    walker = _Walker(root, split_root, names, skipped, other_splits)
    for cls in names:
        items.extend(Item(rel, index[cls]) for rel in walker.walk(cls))
    rejects.extend(walker.rejects)
    return items


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UsageError(
            f"{path} is not UTF-8 (byte 0x{raw[e.start]:02x} on line {line}); convert it, e.g. "
            f"iconv -f latin1 -t utf-8 {path} > fixed{path.suffix}"
        ) from None


def _is_header(row: list[str]) -> bool:
    first = row[0].strip().lower()
    if os.path.splitext(first)[1] in IMAGE_EXTS:
        return False
    return first in _PATH_WORDS or (len(row) > 1 and row[1].strip().lower() in _LABEL_WORDS)


def _scan_csv(path: Path, rejects: list[tuple[str, str]]) -> tuple[list[str], list[Item]]:
    """Items of a CSV/TSV list (rules in the module docstring) -> class names, items;
    bad rows are appended to ``rejects``."""
    text = _read_text(path)
    first_line = text.split("\n", 1)[0]
    delim = "\t" if path.suffix.lower() == ".tsv" or "\t" in first_line else ","
    rows = [
        (n, r)
        for n, r in enumerate(csv.reader(text.splitlines(), delimiter=delim), start=1)
        if r and any(c.strip() for c in r)
    ]
    if rows and _is_header(rows[0][1]):
        rows = rows[1:]
    good: list[tuple[str, str]] = []
    for lineno, r in rows:
        if len(r) < 2:
            raise UsageError(f"{path}: line {lineno} should be 'path{delim}label', got {delim.join(r)!r}")
        rel, lab = r[0].strip(), r[1].strip()
        if not rel:
            rejects.append((f"{path.name}:{lineno}", "empty path"))
        elif not lab:
            rejects.append((rel, "empty label"))
        else:
            good.append((rel, lab))
    ints = [lab for _, lab in good if _INT.fullmatch(lab)]
    if ints and len(ints) != len(good):
        name = next(lab for _, lab in good if not _INT.fullmatch(lab))
        raise UsageError(
            f"{path}: labels mix integers and names (e.g. {ints[0]!r} and {name!r}); "
            f"use integer class indices or class names, not both"
        )
    items: list[Item] = []
    if ints:
        top = -1
        for rel, lab in good:
            v = int(lab)
            if not 0 <= v <= MAX_LABEL:
                rejects.append((rel, f"label {lab} out of range 0..{MAX_LABEL}"))
                continue
            items.append(Item(Path(rel).as_posix(), v))
            top = max(top, v)
        classes = [str(i) for i in range(top + 1)]
    else:
        classes = sorted({lab for _, lab in good})
        index = {c: i for i, c in enumerate(classes)}
        items = [Item(Path(rel).as_posix(), index[lab]) for rel, lab in good]
    return classes, items


def scan(src: Path, *, seed: int, val_fraction: float = 0.0) -> Source:
    """Scan ``src`` (folder or CSV/TSV) into a :class:`Source`; raise UsageError when
    it does not exist or holds no image."""
    if not src.exists():
        raise UsageError(f"SRC {src} does not exist")
    skipped = {s: [0] for s in SPLITS}
    rejects: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    splits: dict[str, list[Item]]
    if src.is_file():
        if src.suffix.lower() not in (".csv", ".tsv", ".txt"):
            raise UsageError(f"SRC {src} is a file but not a .csv/.tsv list of 'path,label'")
        classes, items = _scan_csv(src, rejects["train"])
        base = src.parent
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
                    others = tuple(src / o for o in SPLITS if o != s and o in top)
                    splits[s] = _scan_folder(src, src / s, classes, skipped[s], rejects[s], others)
            skipped["train"][0] += _loose_files(src)
            if "val" in splits and val_fraction:
                raise UsageError(f"--val-fraction given but {src} already has a val/ folder")
        else:
            classes = top
            skipped["train"][0] += _loose_files(src)
            splits = {"train": _scan_folder(src, src, classes, skipped["train"], rejects["train"])}
        base = src
    if not any(splits.values()):
        loose = (
            []
            if src.is_file()
            else [
                e.name
                for e in _scandir(src)
                if not _is_dir(e) and not _hidden(e.name) and os.path.splitext(e.name)[1].lower() in IMAGE_EXTS
            ]
        )
        if loose:
            raise UsageError(
                f"SRC {src} holds {len(loose):,} images but no class folders; put them in one subfolder "
                f"per class, or list them in a CSV of path,label"
            )
        nrej = sum(len(r) for r in rejects.values())
        why = f" ({nrej} rejected, e.g. {_first(rejects)})" if nrej else ""
        raise UsageError(f"SRC {src} holds no images{why}")
    if val_fraction:
        splits["train"], splits["val"] = stratified_split(splits["train"], val_fraction, seed)
        if not splits["val"]:
            raise UsageError(
                f"--val-fraction {val_fraction} leaves val/ empty: {src} holds only "
                f"{len(splits['train'])} image(s); drop --val-fraction"
            )
    for items in splits.values():
        random.Random(seed).shuffle(items)
    classes = [display_path(c) for c in classes]  # folder names as written into the pack
    return Source(base, classes, splits, {s: skipped[s][0] for s in splits}, {s: rejects[s] for s in splits})


def _first(rejects: dict[str, list[tuple[str, str]]]) -> str:
    path, reason = next(r for rs in rejects.values() for r in rs)
    return f"{path}: {reason}"


def stratified_split(items: list[Item], fraction: float, seed: int) -> tuple[list[Item], list[Item]]:
    """Move ``round(len(items) * fraction)`` items (at least 1 and at most all but one,
    given 2 or more items) from train to val; both keep scan order.

    Each class gives ``floor(n * fraction)`` items; the rest of the total comes from the
    classes with the largest left-over share (seeded tie-break), first from those that
    keep at least one train item, then (only when the classes are too small for that,
    e.g. one image per class) from the others, so the overall fraction always holds.
    """
    by_class: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_class.setdefault(it.label, []).append(i)
    n = len(items)
    total = min(max(round(n * fraction), 1 if fraction > 0 and n >= 2 else 0), max(n - 1, 0))
    rng = random.Random(f"stoker-val-{seed}")
    labels = sorted(by_class)
    take = {lab: int(len(by_class[lab]) * fraction) for lab in labels}
    tie = {lab: rng.random() for lab in labels}
    left = total - sum(take.values())
    if left > 0:

        def order(lab: int) -> tuple:
            share = len(by_class[lab]) * fraction - take[lab]
            return (len(by_class[lab]) - take[lab] < 2, -share, tie[lab])

        for lab in sorted((lab for lab in labels if take[lab] < len(by_class[lab])), key=order)[:left]:
            take[lab] += 1
    to_val: set[int] = set()
    for lab in labels:
        to_val.update(rng.sample(by_class[lab], take[lab]))
    train = [it for i, it in enumerate(items) if i not in to_val]
    val = [it for i, it in enumerate(items) if i in to_val]
    return train, val


def part_range(n: int, part: int, parts: int) -> tuple[int, int]:
    """Contiguous slice ``[start, end)`` of ``n`` items for part ``part`` of ``parts``."""
    return n * part // parts, n * (part + 1) // parts
