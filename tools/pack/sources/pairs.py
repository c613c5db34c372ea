"""The pairs reader: a CSV of ``image,mask`` rows, for datasets whose masks are not named after
their images (Cityscapes ``*_leftImg8bit.png`` ↔ ``*_gtFine_labelIds.png``, ADE20K). Paths are
relative to the CSV's folder.

It reads a CSV whose header names a mask column (``image,mask``; ``mask``, ``mask_path``,
``annotation``, ``segmentation``, ``label_path``), or, without a header, whose second cells all
name image files: such a CSV is never read as classes named after mask files. Rejects, each with
its reason: an empty image or mask cell, an image listed again (``listed again on line 9 (first
on line 3)``; by another path to the same file, :func:`~.base.input_identity`: ``same file as
a.png (line 3)``: packed once) or listed again with another mask (neither packed), a mask that is
missing (``mask unreadable: errno 2 ...``) or is not a mask (:mod:`stoker.tools.pack.masks`).
"""

from __future__ import annotations

import os
from pathlib import Path

from stoker.errors import UsageError
from stoker.pipeline.shards.kinds import MaskKind

from ..options import setting
from ..sanitize import IMAGE_EXTS
from .base import FileReader, Item, Scan, input_identity, repeated_row
from .csvlist import csv_rows

_MASK_WORDS = {"mask", "mask_path", "masks", "annotation", "annotation_path", "segmentation", "label_path", "seg"}


def _is_image_name(cell: str) -> bool:
    return os.path.splitext(cell.strip())[1].lower() in IMAGE_EXTS


def _pairs_rows(path: Path) -> tuple[str, list[tuple[int, list[str]]], list[str] | None]:
    """:func:`~.csvlist.csv_rows`, with a first row naming a mask column taken as the header."""
    delim, rows, header = csv_rows(path)
    if header is None and rows and len(rows[0][1]) >= 2 and rows[0][1][1].strip().lower() in _MASK_WORDS:
        header, rows = [c.strip() for c in rows[0][1]], rows[1:]
    return delim, rows, header


def _pairs_layout(path: Path) -> bool:
    """A CSV of image,mask rows: a header naming a mask column, or second cells all image files."""
    try:
        _, rows, header = _pairs_rows(path)
    except UsageError:
        return False
    if header is not None:
        return len(header) >= 2 and header[1].strip().lower() in _MASK_WORDS
    sample = [r for _, r in rows[:200] if len(r) >= 2]
    return bool(sample) and all(_is_image_name(r[0]) and _is_image_name(r[1]) for r in sample)


class PairsReader(FileReader):
    """A CSV of ``image,mask`` rows (paths relative to its folder)."""

    name, priority = "pairs", 35
    summary = "a CSV of image,mask rows (segmentation with masks named unlike their images)"
    takes_masks = True
    path_rule = "paths in a CSV are relative to the CSV's folder ({base})"

    def __init__(self, src, options):
        super().__init__(src, options)
        self.base = self.mask_base = self.src.parent

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return (
            isinstance(src, Path) and src.is_file() and src.suffix.lower() in (".csv", ".tsv", ".txt")
        ) and _pairs_layout(src)

    def scan(self) -> Scan:
        path, opts = self.src, self.options
        if opts.targets != "auto":
            raise UsageError(f"{setting('targets')} is for a CSV's target columns; in {path} the target is the mask")
        delim, rows, _ = _pairs_rows(path)
        rejects: list[tuple[str, str]] = []
        first: dict[tuple, tuple[int, str, str]] = {}  # an image's first row: (line, mask, path)
        items: dict[tuple, Item] = {}
        conflicting: set[tuple] = set()
        for lineno, r in rows:
            cells = [c.strip() for c in r]
            if len(cells) != 2 and any(cells[2:]):
                raise UsageError(
                    f"{path}: line {lineno} has {len(cells)} cells; a pairs CSV's rows are image{delim}mask"
                )
            if len(cells) < 2:
                raise UsageError(f"{path}: line {lineno} should be 'image{delim}mask', got {delim.join(r)!r}")
            image, mask = cells[0], cells[1]
            if not image:
                rejects.append((f"{path.name}:{lineno}", "empty path"))
                continue
            if not mask:
                rejects.append((image, "empty mask path"))
                continue
            key = input_identity(os.path.join(path.parent, image))  # two paths to one file are one image
            if key not in first:
                first[key] = (lineno, mask, image)
                items[key] = Item(Path(image).as_posix(), mask=Path(mask).as_posix())
                continue
            line, was, first_image = first[key]
            same = was == mask or input_identity(os.path.join(path.parent, was)) == input_identity(
                os.path.join(path.parent, mask)
            )
            differ = f"on lines {line} ({was}) and {lineno} ({mask}) with different masks"
            repeated_row(rejects, conflicting, key, (first_image, line), (image, lineno), same=same, differ=differ)
        kept = [it for key, it in items.items() if key not in conflicting]
        classes = [str(i) for i in range(opts.num_classes)] if opts.num_classes else []
        target = MaskKind.of(num_classes=opts.num_classes, ignore_index=opts.ignore_index)
        return Scan(classes, {"train": kept}, {"train": 0}, {"train": rejects}, target)


__all__ = ["PairsReader"]
