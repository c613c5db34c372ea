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

from .base import Item, Scan, Source, SourceOptions, SourceReader, display_path
from .csvlist import CsvReader
from .detection import CocoReader, VocReader, YoloReader
from .folder import FolderReader
from .masktree import MaskTreeReader
from .pairs import PairsReader
from .parquet import ParquetReader
from .trainval import TrainValReader

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
            raise UsageError(f"{arg('source')} {name!r} must be one of {', '.join(reader_names())}")
        return cls(src, options)
    for cls in readers():
        if cls.recognizes(src, options):
            return cls(src, options)
    if isinstance(src, Path) and src.is_file():
        raise UsageError(
            f"SRC {src} is a file but not a .csv/.tsv list of 'path,label' (or name its reader: {arg('source')})"
        )
    names = ", ".join(reader_names()[1:])
    raise UsageError(f"no pack source reads SRC {src} (sources: {names}); choose one with {arg('source')}")


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
            raise UsageError(
                f"{arg('val_fraction', val_fraction)} leaves val/ empty: {src} holds only "
                f"{len(splits['train'])} image(s); drop {arg('val_fraction')}"
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
    )


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


__all__ = ["ENTRY_POINTS", "Scan", "choose_reader", "reader_names", "readers", "register_reader", "scan"]
