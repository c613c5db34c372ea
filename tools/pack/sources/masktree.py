"""The mask-tree reader (``stoker pack IMAGES OUT --masks MASKS``): images at any depth, each paired
with the mask at the same relative path and stem in a parallel tree (any image extension, usually
``.png``; ``train/`` and ``val/`` on both sides when IMAGES has them). An image with no mask, a
mask with no image, and two files of one stem on either side are rejects. The per-mask work at
pack time is :mod:`stoker.tools.pack.masks`."""

from __future__ import annotations

import os
from pathlib import Path

from stoker.errors import UsageError, arg
from stoker.pipeline.shards.kinds import MaskKind

from .base import SPLITS, FileReader, Item, Scan, display_path
from .walk import Seen, class_dirs, hidden_dirs, walk_tree


def _stem(rel: str) -> str:
    return os.path.splitext(rel)[0]


def scan_masks(
    src: Path, masks: Path, skipped: dict, rejects: dict, hidden: list[str] | None = None
) -> dict[str, list[Item]]:
    """Images of ``src`` paired with the masks at the same relative path and stem in ``masks``
    (any image extension): one item each, with its mask. An image with no mask, a mask with no
    image, and two files of one stem on either side are rejects; an image reached again (a hard
    link, a second link) is a reject ``"same file as <first>"``, while one mask may serve several
    images. The hidden folders of ``src`` left out are appended to ``hidden``."""
    if not masks.is_dir():
        raise UsageError(
            f"{arg('masks', str(masks))} is not a folder (a tree parallel to SRC: same relative paths and stems)"
        )
    if not src.is_dir():
        raise UsageError(f"{arg('masks')} needs SRC to be a folder of images, not {src}")
    rs, rm = src.resolve(), masks.resolve()
    if rs == rm or rs in rm.parents or rm in rs.parents:
        raise UsageError(
            f"{arg('masks', str(masks))} and SRC {src} overlap: keep the images and the masks in two folders"
        )
    top = class_dirs(src)
    names = [s for s in SPLITS if s in top] if "train" in top and set(top) <= set(SPLITS) else [None]
    splits: dict[str, list[Item]] = {}
    seen = Seen()  # an image reached from train/ and from val/ is packed once, in train
    if hidden is not None and names != [None]:
        hidden.extend(hidden_dirs(src))
    for name in names:
        split = name or "train"
        image_root, mask_root = (src / name, masks / name) if name else (src, masks)
        others = tuple(src / o for o in names if o and o != name)
        images = walk_tree(src, image_root, skipped[split], rejects[split], others, seen, hidden)
        mask_seen = Seen(files_once=False)
        found = walk_tree(masks, mask_root, [0], rejects[split], (), mask_seen) if mask_root.is_dir() else []
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


class MaskTreeReader(FileReader):
    """Images and a parallel mask tree (``--masks MASKS``)."""

    name, priority = "mask-tree", 10
    summary = "images at any depth and a mask tree parallel to them (--masks)"
    takes_masks = True

    def __init__(self, src, options):
        super().__init__(src, options)
        self.mask_base = Path(options.masks) if options.masks is not None else None

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return options.masks is not None

    def scan(self) -> Scan:
        if self.mask_base is None:
            raise UsageError(f"the mask-tree source needs {arg('masks')} (a tree parallel to SRC)")
        src, masks, opts = self.src, self.mask_base, self.options
        skipped = {s: [0] for s in SPLITS}
        rejects: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
        found: list[str] = []
        splits = scan_masks(src, masks, skipped, rejects, found)
        classes = [str(i) for i in range(opts.num_classes)] if opts.num_classes else []
        target = MaskKind.of(num_classes=opts.num_classes, ignore_index=opts.ignore_index)
        return Scan(
            classes,
            splits,
            {s: skipped[s][0] for s in splits},
            {s: rejects[s] for s in splits},
            target,
            hidden=found,
        )

    def identity(self) -> dict:
        return {**super().identity(), "masks": str(self.mask_base.resolve())}
