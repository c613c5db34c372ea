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

CSV/TSV lists are :mod:`.csvlist`'s rules, mask trees :mod:`.masks`'s.

"""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

from stoker.errors import UsageError
from stoker.pipeline.shards.targets import IGNORE_INDEX, Target

from .csvlist import scan_csv
from .items import SPLITS, Item, Source, display_path
from .sanitize import IMAGE_EXTS


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
                erel = e.name if drel == "." else f"{drel}/{e.name}"
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


def scan(
    src: Path,
    *,
    seed: int,
    val_fraction: float = 0.0,
    targets: str = "auto",
    masks: Path | None = None,
    num_classes: int | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> Source:
    """Scan ``src`` (folder or CSV/TSV; with ``masks``, an image tree and its parallel mask tree)
    into a :class:`Source`; raise UsageError when it does not exist or holds no image."""
    if not src.exists():
        raise UsageError(f"SRC {src} does not exist")
    skipped = {s: [0] for s in SPLITS}
    rejects: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    splits: dict[str, list[Item]]
    target, mask_base = Target(), None
    if masks is not None:
        splits = _scan_masks(src, Path(masks), skipped, rejects, val_fraction)
        classes = [str(i) for i in range(num_classes)] if num_classes else []
        target, mask_base, base = Target.of("mask", num_classes=num_classes, ignore_index=ignore_index), masks, src
    elif src.is_file():
        if src.suffix.lower() not in (".csv", ".tsv", ".txt"):
            raise UsageError(f"SRC {src} is a file but not a .csv/.tsv list of 'path,label'")
        classes, items, target = scan_csv(src, rejects["train"], targets)
        base = src.parent
        splits = {"train": items}
    else:
        if targets not in ("auto", "class"):
            raise UsageError(
                f"--targets {targets} needs a CSV of path,values (a folder's subfolders are classes; "
                "a mask tree is --masks)"
            )
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
            if src.is_file() or masks is not None
            else [
                e.name
                for e in _scandir(src)
                if not _is_dir(e) and not _hidden(e.name) and os.path.splitext(e.name)[1].lower() in IMAGE_EXTS
            ]
        )
        if loose:
            raise UsageError(
                f"SRC {src} holds {len(loose):,} images but no class folders; put them in one subfolder "
                f"per class, list them in a CSV of path,label, or give their masks with --masks"
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
    return Source(
        base,
        classes,
        splits,
        {s: skipped[s][0] for s in splits},
        {s: rejects[s] for s in splits},
        target=target,
        mask_base=mask_base,
    )


def _stem(rel: str) -> str:
    return os.path.splitext(rel)[0]


def _walk_tree(root: Path, split_root: Path, skipped: list[int], rejects: list, others: tuple) -> list[str]:
    """Every image under ``split_root`` at any depth (relative to ``root``), by the walk's rules."""
    walker = _Walker(root, split_root, [""], skipped, others)
    found = walker.walk("")
    rejects.extend(walker.rejects)
    return found


def _scan_masks(src: Path, masks: Path, skipped: dict, rejects: dict, val_fraction: float) -> dict[str, list[Item]]:
    """Images of ``src`` paired with the masks at the same relative path and stem in ``masks``
    (any image extension): one item each, with its mask. An image with no mask, a mask with no
    image, and two files of one stem on either side are rejects."""
    if not masks.is_dir():
        raise UsageError(f"--masks {masks} is not a folder (a tree parallel to SRC: same relative paths and stems)")
    if not src.is_dir():
        raise UsageError(f"--masks needs SRC to be a folder of images, not {src}")
    rs, rm = src.resolve(), masks.resolve()
    if rs == rm or rs in rm.parents or rm in rs.parents:
        raise UsageError(f"--masks {masks} and SRC {src} overlap: keep the images and the masks in two folders")
    top = _class_dirs(src)
    names = [s for s in SPLITS if s in top] if "train" in top and set(top) <= set(SPLITS) else [None]
    if names != [None] and "val" in names and val_fraction:
        raise UsageError(f"--val-fraction given but {src} already has a val/ folder")
    splits: dict[str, list[Item]] = {}
    for name in names:
        split = name or "train"
        image_root, mask_root = (src / name, masks / name) if name else (src, masks)
        others = tuple(src / o for o in names if o and o != name)
        images = _walk_tree(src, image_root, skipped[split], rejects[split], others)
        found = _walk_tree(masks, mask_root, [0], rejects[split], ()) if mask_root.is_dir() else []
        prefix = f"{name}/" if name else ""
        by_stem: dict[str, list[str]] = {}
        for rel in found:
            by_stem.setdefault(_stem(rel[len(prefix) :]), []).append(rel)
        image_stems: dict[str, list[str]] = {}
        for rel in images:
            image_stems.setdefault(_stem(rel[len(prefix) :]), []).append(rel)
        items = []
        for stem, rels in image_stems.items():
            mask = by_stem.get(stem, [])
            if len(rels) > 1:
                rejects[split].extend((display_path(r), f"{len(rels)} images share the stem {stem!r}") for r in rels)
            elif not mask:
                rejects[split].append((display_path(rels[0]), f"no mask: expected {prefix}{stem}.png in {masks}"))
            elif len(mask) > 1:
                rejects[split].append((display_path(rels[0]), f"{len(mask)} masks share its stem: {', '.join(mask)}"))
            else:
                items.append(Item(rels[0], mask=mask[0]))
        for stem, rels in by_stem.items():
            if stem not in image_stems:
                rejects[split].extend((f"{masks.name}/{display_path(r)}", "mask with no image") for r in rels)
        splits[split] = items
        if images and found and not items:
            example = _stem(images[0][len(prefix) :])
            raise UsageError(
                f"no image of {image_root} has a mask in {mask_root}: masks must have the image's relative path "
                f"and stem (for {images[0]}: {prefix}{example}.png), e.g. {found[0]} has no image"
            )
    return splits


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
