"""The ``train/``+``val/`` reader: a folder whose only subfolders are ``train/`` (and ``val/``),
each an ImageFolder; class names are the sorted union of both, so train and val share indices."""

from __future__ import annotations

from pathlib import Path

from .base import SPLITS, FileReader, Scan
from .folder import check_class_targets, no_class_folders, scan_class_folders
from .walk import Seen, class_dirs, hidden_dirs, loose_files


def split_folders(src: Path) -> list[str] | None:
    """``["train", "val"]`` (or ``["train"]``) when ``src``'s subfolders are splits, else None."""
    top = class_dirs(src)
    if "train" in top and set(top) <= set(SPLITS):
        return [s for s in SPLITS if s in top]
    return None


class TrainValReader(FileReader):
    """A tree with ``train/`` and ``val/`` subtrees, each an ImageFolder."""

    name, priority = "train-val", 50
    summary = "a tree of train/ and val/ ImageFolders (shared class names)"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return isinstance(src, Path) and src.is_dir() and split_folders(src) is not None

    def scan(self) -> Scan:
        check_class_targets(self.options)
        src = self.src
        names = split_folders(src) or []
        found = set(class_dirs(src / "train"))
        if "val" in names:
            found |= set(class_dirs(src / "val"))
        classes = sorted(found)
        skipped = {s: [0] for s in SPLITS}
        rejects: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
        splits = {}
        seen = Seen()  # a file reached from train/ and from val/ is packed once, in train
        found = hidden_dirs(src)
        for s in names:
            skipped[s][0] += loose_files(src / s)
            others = tuple(src / o for o in names if o != s)
            splits[s] = scan_class_folders(
                src, src / s, classes, skipped[s], rejects[s], others, seen=seen, hidden_found=found
            )
        skipped["train"][0] += loose_files(src)
        return Scan(classes, splits, {s: skipped[s][0] for s in splits}, {s: rejects[s] for s in splits}, hidden=found)

    def nothing_found(self) -> None:
        no_class_folders(self.src)
