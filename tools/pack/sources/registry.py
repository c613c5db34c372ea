"""The pack sources, each a reader in one registry that ``stoker pack`` asks.

:func:`scan` picks the reader (``--source NAME``, or the first by priority that recognizes
SRC), lets it scan, then does what every source shares: official split lists
(:mod:`.splitlists`), the seeded stratified ``--val-fraction`` split, the seeded shuffle of each
split (a sample's key is its position in that list, so keys are unique across ``--part``\\ s),
and the "holds no images" error. A reader of your own is a subclass registered once::

    class JsonLinesReader(FileReader):
        name, priority = "jsonl", 35
        summary = "a JSON-lines list of {path, label} objects"

        @classmethod
        def recognizes(cls, src, options):
            return src.suffix == ".jsonl"

        def scan(self):
            ...  # -> Scan(classes, {"train": items})

    register_reader(JsonLinesReader)

Its name is then a ``--source`` choice, and SRCs it recognizes pack through it (in other
processes too when a package names it under the ``stoker.pack_sources`` entry points).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from stoker.errors import UsageError, arg
from stoker.pipeline.registry import Registry
from stoker.pipeline.storage import is_url

from ..options import setting
from .base import Item, Scan, Source, SourceOptions, SourceReader, display_path
from .coco import CocoReader
from .csvlist import CsvReader
from .detection import VocReader, annotations_beside
from .folder import FolderReader
from .masktree import MaskTreeReader
from .pairs import PairsReader
from .parquet import ParquetReader
from .trainval import TrainValReader
from .yolo import YoloReader

#: the entry-point group a package names its readers in (``[project.entry-points."stoker.pack_sources"]
#: mine = "mypkg.source:MyReader"``): registered the first time the registry is asked
ENTRY_POINTS = "stoker.pack_sources"
_REGISTRY: Registry[SourceReader] = Registry("pack source", SourceReader, ENTRY_POINTS, reserved=("auto",))


def register_reader(cls: type[SourceReader]) -> type[SourceReader]:
    """Add a source reader class (usable as a decorator). Its name must be new."""
    return _REGISTRY.register(cls)


for _cls in (MaskTreeReader, ParquetReader, PairsReader, CsvReader, TrainValReader, FolderReader):
    register_reader(_cls)
for _cls in (CocoReader, YoloReader, VocReader):  # detection: boxes
    register_reader(_cls)


def readers() -> list[type[SourceReader]]:
    """Every registered reader class, in auto-detection order."""
    return sorted(_REGISTRY, key=lambda c: (c.priority, c.name))


def reader_names() -> tuple[str, ...]:
    """The ``--source`` values (``"auto"`` first)."""
    return ("auto",) + tuple(c.name for c in readers())


def choose_reader(src: str | Path, options: SourceOptions, name: str = "auto") -> SourceReader:
    """The reader of ``src``: the one named, or the first (by priority) that recognizes it."""
    if name != "auto":
        cls = _REGISTRY.get(name)
        if cls is None:
            raise UsageError(f"{setting('source')} {name!r} must be one of {', '.join(reader_names())}")
        return cls(src, options)
    for cls in readers():
        if cls.recognizes(src, options):
            if cls.name in ("folder", "train-val"):  # plain classes: unless SRC holds an annotation file
                from .walk import class_dirs

                annotations_beside(src, class_dirs(src))
            return cls(src, options)
    if isinstance(src, Path) and src.is_file():
        raise UsageError(
            f"SRC {src} is a file but not a .csv/.tsv list of 'path,label' nor a COCO JSON (images, annotations, "
            f"categories) nor a YOLO data.yaml (or name its reader: {setting('source')})"
        )
    names = ", ".join(reader_names()[1:])
    raise UsageError(f"no pack source reads SRC {src} (sources: {names}); choose one with {setting('source')}")


def scan(
    src: str | Path,
    *,
    seed: int,
    val_fraction: float = 0.0,
    source: str = "auto",
    targets: str = "auto",
    masks: Path | None = None,
    num_classes: int | None = None,
    ignore_index: int | None = None,
    **options: Any,
) -> Source:
    """Scan ``src`` into a :class:`~.base.Source` with the reader ``source`` (``"auto"``: the
    first that recognizes it); ``options`` are the other :class:`~.base.SourceOptions`. Raises
    UsageError when SRC does not exist, no reader reads it, or it holds no image."""
    if not is_url(src):
        src = Path(src)
        if not src.exists():
            raise UsageError(f"SRC {src} does not exist")
    extra = {} if ignore_index is None else {"ignore_index": ignore_index}
    opts = SourceOptions(
        targets=targets, masks=Path(masks) if masks is not None else None, num_classes=num_classes, **extra, **options
    )
    reader = choose_reader(src, opts, source)
    if opts.weight_column is not None and reader.name != "csv":
        raise UsageError(f"{setting('weight_column')} reads a CSV/TSV SRC; {src} is read by the {reader.name} source")
    found = reader.scan()
    splits = found.splits
    if "val" in splits and val_fraction:
        raise UsageError(f"{arg('val_fraction')} given but {src} already has {found.val_source}")
    if opts.train_list is not None or opts.val_list is not None:
        from .splitlists import apply_split_lists

        apply_split_lists(found, opts.train_list, opts.val_list, val_fraction)
        splits = found.splits
    if not any(splits.values()):
        reader.nothing_found()
        nrej = sum(len(r) for r in found.rejects.values())
        why = f" ({nrej} rejected, e.g. {_first(found.rejects)})" if nrej else ""
        raise UsageError(f"SRC {src} holds no images{why}")
    if val_fraction:
        splits["train"], splits["val"] = stratified_split(splits["train"], val_fraction, seed)
        if not splits["val"]:
            n = len(splits["train"])
            why = (
                f"{src} holds only {n} image(s)"
                if n < 2
                else f"each class of {src} holds a single image, which stays in train (a class needs 2 to give val one)"
            )
            raise UsageError(
                f"{arg('val_fraction', val_fraction)} leaves val/ empty: {why}; drop {arg('val_fraction')}"
            )
    for items in splits.values():
        random.Random(seed).shuffle(items)
    classes = [display_path(c) for c in found.classes]  # folder names as written into the pack
    return Source(
        reader,
        classes,
        splits,
        {s: found.skipped.get(s, 0) for s in splits},
        {s: found.rejects.get(s, []) for s in splits},
        target=found.target,
        hidden=list(found.hidden),
        val_only=val_only_classes(splits, classes),
        notes=list(found.notes),
        class_ids=found.class_ids,
    )


def _first(rejects: dict[str, list[tuple[str, str]]]) -> str:
    path, reason = next(r for rs in rejects.values() for r in rs)
    return f"{path}: {reason}"


def stratified_split(items: list[Item], fraction: float, seed: int) -> tuple[list[Item], list[Item]]:
    """Move a seeded, stratified ``fraction`` of ``items`` from train to val; both keep scan order.

    A class of ``n >= 2`` items gives ``floor(n * fraction)`` of them, at most ``n - 1``: it keeps
    one train item at least. The rest, up to ``round`` of the eligible classes' summed shares (and
    at least 1), comes one item each from the classes with the largest left-over share (seeded
    tie-break; largest remainder), so 2-image classes at ``fraction=0.1`` give val one image in
    five classes, and no class gives more than its share rounded up. A class with one item keeps
    it in train: a class seen only in val could never be learnt.
    """
    by_class: dict[int, list[int]] = {}
    for i, it in enumerate(items):
        by_class.setdefault(it.label, []).append(i)
    rng = random.Random(f"stoker-val-{seed}")
    labels = sorted(by_class)
    tie = {lab: rng.random() for lab in labels}
    room = {lab: len(by_class[lab]) - 1 for lab in labels}  # what a class gives and keeps one train item
    share = {lab: len(by_class[lab]) * fraction for lab in labels if room[lab] > 0}
    take = {lab: min(int(share.get(lab, 0.0)), room[lab]) for lab in labels}
    total = max(round(sum(share.values())), 1 if share and fraction > 0 else 0)
    # a class rounds its share up or down, never past it: what a capped class cannot give stays in train
    open_classes = [lab for lab in share if take[lab] < min(room[lab], share[lab])]
    open_classes.sort(key=lambda lab: (take[lab] - share[lab], tie[lab]))
    for lab in open_classes[: max(total - sum(take.values()), 0)]:
        take[lab] += 1
    to_val: set[int] = set()
    for lab in labels:
        to_val.update(rng.sample(by_class[lab], take[lab]))
    train = [it for i, it in enumerate(items) if i not in to_val]
    val = [it for i, it in enumerate(items) if i in to_val]
    return train, val


def val_only_classes(splits: dict[str, list[Item]], classes: list[str]) -> list[str]:
    """The classes with val items but no train item (a split list, a val/ folder of their own):
    a model trained on train/ cannot learn them, so ``stoker pack`` names them."""
    if not classes or "val" not in splits:
        return []
    seen = {it.label for it in splits.get("train", [])}
    missing = sorted({it.label for it in splits["val"]} - seen)
    return [classes[lab] if 0 <= lab < len(classes) else str(lab) for lab in missing]


__all__ = ["ENTRY_POINTS", "Scan", "choose_reader", "reader_names", "readers", "register_reader", "scan"]
