"""What a scan of SRC yields: the inputs of a pack (:class:`Item`) per split (:class:`Source`)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from stoker.pipeline.shards.targets import Target

SPLITS = ("train", "val")
MAX_LABEL = 1_000_000  # integer labels above this are rejects: a class list that long is a typo


@dataclass(slots=True)  # a million of these stay in memory during a pack: keep them small
class Item:
    """One input: ``rel`` path (posix; relative to SRC, or as written in the CSV) and its target:
    the class ``label`` index; ``target``, the float values or the multi-label class indices;
    ``mask``, the mask file (relative to :attr:`Source.mask_base`). The file is
    ``Source.base / rel``."""

    rel: str
    label: int = 0
    target: tuple | None = None
    mask: str | None = None


@dataclass
class Source:
    """A scanned SRC: the target kind and class names and, per split, the shuffled items, skip
    counts and scan rejects ``(display path, reason)``. ``base`` is the folder item paths are
    relative to (SRC, or the CSV's folder); ``mask_base`` the folder of the masks' paths."""

    base: Path
    classes: list[str]
    splits: dict[str, list[Item]]
    skipped: dict[str, int] = field(default_factory=dict)
    rejects: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    target: Target = field(default_factory=Target)
    mask_base: Path | None = None

    def path(self, item: Item) -> str:
        return os.path.join(self.base, item.rel)

    def mask_path(self, item: Item) -> str | None:
        return None if item.mask is None else os.path.join(self.mask_base, item.mask)

    def jobs(self, items: list[Item]) -> list[tuple[str, str | None]]:
        """``(image path, mask path or None)`` of each item: what a sanitizer reads."""
        return [(self.path(it), self.mask_path(it)) for it in items]

    def digest(self, split: str) -> str:
        """sha256 of a split's (shuffled) sample list: identifies the input of a pack."""
        h = hashlib.sha256()
        for it in self.splits[split]:
            row = [it.rel, it.label]
            if it.target is not None or it.mask is not None:  # a class split's digest is as it always was
                row += [list(it.target or ()), it.mask]
            h.update(json.dumps(row).encode() + b"\n")
        return h.hexdigest()


def display_path(rel: str) -> str:
    """``rel`` as valid UTF-8 text: bytes of a non-UTF-8 file name become ``\\xNN``."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")


__all__ = ["MAX_LABEL", "SPLITS", "Item", "Source", "display_path"]
