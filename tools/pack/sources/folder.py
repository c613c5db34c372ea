"""The ImageFolder reader: one subfolder per class (``SRC/<class>/.../*.jpg``), class index =
position of the folder name in sorted order; folders are walked by :mod:`.walk`'s rules."""

from __future__ import annotations

import os
from pathlib import Path

from stoker.errors import UsageError, arg
from stoker.pipeline.shards.kinds import ClassKind

from ..options import setting
from ..sanitize import IMAGE_EXTS
from .base import FileReader, Item, Scan, SourceOptions
from .walk import Seen, Walker, class_dirs, hidden, hidden_dirs, is_dir, loose_files, scandir_sorted


def scan_class_folders(
    root: Path,
    split_root: Path,
    classes: list[str],
    skipped: list[int],
    rejects: list[tuple[str, str]],
    other_splits: tuple[Path, ...] = (),
    *,
    seen: Seen | None = None,
    hidden_found: list[str] | None = None,
) -> list[Item]:
    """The items of the class folders of ``split_root`` (paths relative to ``root``); ``seen``:
    what the walks of the other splits met; the hidden folders left out (hidden class folders
    too) are appended to ``hidden_found``."""
    items = []
    index = {c: i for i, c in enumerate(classes)}
    names = class_dirs(split_root)
    walker = Walker(root, split_root, names, skipped, other_splits, seen)
    for cls in names:
        items.extend(Item(rel, index[cls]) for rel in walker.walk(cls))
    rejects.extend(walker.rejects)
    if hidden_found is not None:
        prefix = Path(os.path.relpath(split_root, root)).as_posix()
        hidden_found.extend(hidden_dirs(split_root, "" if prefix == "." else f"{prefix}/"))
        hidden_found.extend(walker.hidden)
    return items


def check_class_targets(options: SourceOptions) -> None:
    if options.targets not in ("auto", ClassKind.name):
        raise UsageError(
            f"{setting('targets', options.targets)} needs a CSV of path,values (a folder's subfolders are classes; "
            f"a mask tree is {arg('masks')})"
        )


def targets_beside(src: Path, classes: list[str]) -> None:
    """One class folder beside a CSV is a folder of images and their targets, not an ImageFolder:
    a one-line error naming the CSV to pack (it would be packed as one class, silently)."""
    if len(classes) != 1:
        return
    tables = [
        e.name
        for e in scandir_sorted(src)
        if not is_dir(e) and not hidden(e.name) and os.path.splitext(e.name)[1].lower() in (".csv", ".tsv")
    ]
    if tables:
        raise UsageError(
            f"SRC {src} holds {tables[0]} beside a single folder of images ({classes[0]}/): pack the "
            f"CSV for its targets (stoker pack {Path(src) / tables[0]} OUT), or add one folder per class"
        )


def no_class_folders(src: Path) -> None:
    """A folder that yielded no image: a one-line error when it holds loose images (not an
    ImageFolder), else nothing (the caller says it holds no images)."""
    loose = [
        e.name
        for e in scandir_sorted(src)
        if not is_dir(e) and not hidden(e.name) and os.path.splitext(e.name)[1].lower() in IMAGE_EXTS
    ]
    if loose:
        raise UsageError(
            f"SRC {src} holds {len(loose):,} images but no class folders; put them in one subfolder "
            f"per class, list them in a CSV of path,label, or give their masks with {arg('masks')}"
        )


class FolderReader(FileReader):
    """An ImageFolder tree: one subfolder per class."""

    name, priority = "folder", 60
    summary = "an ImageFolder tree: one subfolder per class"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return isinstance(src, Path) and src.is_dir()

    def scan(self) -> Scan:
        check_class_targets(self.options)
        src = self.src
        classes = class_dirs(src)
        skipped = [loose_files(src)]
        rejects: list[tuple[str, str]] = []
        found: list[str] = []
        targets_beside(src, classes)
        items = scan_class_folders(src, src, classes, skipped, rejects, hidden_found=found)
        return Scan(classes, {"train": items}, {"train": skipped[0]}, {"train": rejects}, hidden=found)

    def nothing_found(self) -> None:
        no_class_folders(self.src)
