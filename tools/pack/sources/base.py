"""What a pack source is: a reader that scans SRC into items and reads each item's bytes.

A reader (:class:`SourceReader`) says its ``name``, how it recognizes its SRC (or is chosen by
``--source NAME``), :meth:`~SourceReader.scan` (SRC → per-split :class:`Item` lists, skips and
scan rejects) and :meth:`~SourceReader.read` / :meth:`~SourceReader.read_mask` (an item's image
and mask bytes). An item's ``rel`` is the reader's own reference of it: a path relative to SRC
for files, ``<file>#<row>`` for a parquet row; it is also the name shown in ``rejects.jsonl`` and
in the sample's ``json``. Reading runs in the pack's worker processes (or Ray tasks): a reader is
pickled with each chunk of work, so it holds only small, picklable state.

**One input, packed once.** Every reader tells two references of one input apart by one rule,
:func:`input_identity`: a local file is its ``(st_dev, st_ino)`` (a relative and an absolute path,
a symlink and a hard link reach the same file), a URL its normalized form. The first reference of
an input is packed; a later one is a reject ``"same file as <first>"`` (:class:`FirstSeen`).
**Damaged inputs** are rejects: a reader catches what reading a bad input raises
(:data:`stoker.pipeline.imagedecode.DAMAGED_INPUT`), never ``Exception``, so a bug raises instead of emptying the pack.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from stoker.errors import UsageError
from stoker.pipeline.shards.targets import IGNORE_INDEX, Target
from stoker.pipeline.storage import is_url

from ..options import setting
from ..sanitize import Sanitized, Settings, _sanitize_read, read_input

SPLITS = ("train", "val")
MAX_LABEL = 1_000_000  # integer labels above this are rejects: a class list that long is a typo
#: ``box_frame``: which frame an EXIF-rotated image's boxes were drawn in when its annotated size
#: fits both (``auto``: the upright one, as labelling tools show a photo)
BOX_FRAMES = ("auto", "raw", "upright")


def repeated_row(
    rejects: list, conflicting: set, key, first: tuple[str, int], row: tuple[str, int], *, same: bool, differ: str
) -> None:
    """A list's ``row`` (path, line) reaching the input of an earlier row ``first`` (its path,
    line), by the same path or another one (:func:`input_identity`). With the ``same`` target it
    is a listed reject (the input is packed once); with another (``differ`` says how) which one is
    right cannot be told: neither is packed (``key`` joins ``conflicting``), both are listed."""
    (first_rel, line), (rel, lineno) = first, row
    again = os.path.normpath(first_rel) == os.path.normpath(rel)
    if same:
        rejects.append(
            (
                rel,
                f"listed again on line {lineno} (first on line {line})"
                if again
                else same_file(first_rel, f"line {line}"),
            )
        )
        return
    if again:
        rejects.append((rel, f"listed {differ}"))
    else:
        rejects.append((rel, f"{same_file(first_rel)}, listed {differ}"))
        if key not in conflicting:  # the first path is not packed either: said once
            rejects.append((first_rel, f"{same_file(rel)}, listed {differ}"))
    conflicting.add(key)


def normalized_url(url: str) -> str:
    """``url`` with its scheme and host lowercased and its ``.``/``..`` segments resolved (empty
    segments kept: ``a//b`` is another object key than ``a/b``); no fragment."""
    parts = urlsplit(url)
    out: list[str] = []
    for seg in parts.path.split("/"):
        if seg == ".":
            continue
        if seg == ".." and len(out) > 1:
            out.pop()
        elif seg != "..":
            out.append(seg)
    path = "/".join(out) or ("/" if parts.path.startswith("/") else "")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def input_identity(location: str | os.PathLike) -> tuple:
    """The one identity rule of every pack source: two references are one input when their keys
    are equal. A local file is its ``(st_dev, st_ino)``, links followed (a relative and an
    absolute path, a symlink and a hard link are one file); a URL is :func:`normalized_url`; a
    local path that cannot be stat'ed is its absolute normalized path (reading it says why)."""
    location = os.fspath(location)
    if is_url(location):
        return ("url", normalized_url(location))
    try:
        st = os.stat(location)
    except (OSError, ValueError):  # missing, unreadable, or a NUL in the name: read() says why
        return ("path", os.path.normpath(os.path.abspath(location)))
    return stat_identity(st.st_dev, st.st_ino)


def stat_identity(dev: int, ino: int) -> tuple:
    """:func:`input_identity` of a local file whose ``st_dev, st_ino`` are known (a folder walk)."""
    return ("file", dev, ino)


class FirstSeen:
    """Which reference reached each input first (keys of :func:`input_identity`)."""

    def __init__(self) -> None:
        self._first: dict[tuple, Any] = {}

    def first(self, key: tuple, ref: Any) -> Any | None:
        """None when ``key`` is met for the first time (``ref`` is recorded as its first
        reference), else the first reference."""
        if key in self._first:
            return self._first[key]
        self._first[key] = ref
        return None


def same_file(first: str, where: str = "") -> str:
    """The reject reason of an input reached again: ``same file as <first> (<where>)``."""
    return f"same file as {display_path(first)}" + (f" ({where})" if where else "")


@dataclass(slots=True)  # a million of these stay in memory during a pack: keep them small
class Item:
    """One input: ``rel``, the reader's reference of it (a posix path relative to SRC or as written
    in the CSV; ``<file>#<row>`` for a parquet row), and its target: the class ``label`` index;
    ``target``, the float values or the multi-label class indices; ``mask``, the reader's reference
    of its mask; ``weight``, its sampling weight (``--weight-column``), or ``None``."""

    rel: str
    label: int = 0
    target: tuple | None = None
    mask: str | None = None
    weight: float | None = None


@dataclass(frozen=True)
class SourceOptions:
    """What ``stoker pack`` was told about SRC; each reader reads the options it knows.

    Attributes:
        targets: what target columns hold (``auto``, ``class``, ``float``, ``multilabel``).
        masks: a mask tree parallel to SRC (``--masks``).
        num_classes: masks: the declared class count.
        ignore_index: masks: the "no class" value.
        image_column: a table's image column (``--image-column``).
        target_column: a table's target column(s), comma-separated (``--target-column``).
        weight_column: a CSV's column of per-sample sampling weights (``--weight-column``).
        train_list, val_list: official split lists (``--train-list``, ``--val-list``).
        storage_options: fsspec options of a URL SRC.
        box_frame: boxes: the frame an EXIF-rotated image's boxes were drawn in when its
            annotated size fits both (``auto``: upright, ``raw``, ``upright``; ``--box-frame``).
    """

    targets: str = "auto"
    masks: Path | None = None
    num_classes: int | None = None
    ignore_index: int = IGNORE_INDEX
    image_column: str | None = None
    target_column: str | None = None
    weight_column: str | None = None
    train_list: Path | None = None
    val_list: Path | None = None
    storage_options: dict = field(default_factory=dict, compare=False)
    box_frame: str = "auto"

    def __post_init__(self) -> None:
        if self.box_frame not in BOX_FRAMES:
            raise UsageError(f"{setting('box_frame', self.box_frame)} must be one of {', '.join(BOX_FRAMES)}")


@dataclass
class Scan:
    """What a reader's :meth:`~SourceReader.scan` found, before the val split and the shuffle:
    per split, the items in a fixed order, the skip counts (not images) and the scan rejects
    ``(display path, reason)``; the class names and the target kind."""

    classes: list[str]
    splits: dict[str, list[Item]]
    skipped: dict[str, int] = field(default_factory=dict)
    rejects: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    target: Target = field(default_factory=Target)
    #: what SRC's own val split is, for "--val-fraction given but SRC already has ..."
    val_source: str = "a val/ folder"
    #: hidden folders (``.*``, ``__MACOSX``) left out, relative to SRC with a trailing ``/``
    hidden: list[str] = field(default_factory=list)
    #: what ``stoker pack`` says of the scan (a split left out, images without a label file)
    notes: list[str] = field(default_factory=list)
    #: the dataset's own id of each class (COCO's category ids), in class order; None: the index
    class_ids: list | None = None


class Job(NamedTuple):
    """One input as a worker reads it: its reader and the item's image (and mask) reference."""

    reader: SourceReader
    rel: str
    mask: str | None = None

    @property
    def where(self) -> str:
        """Where the input is, for error messages (a path, or ``file#row``)."""
        return self.reader.where(self.rel)


class SourceReader:
    """A kind of SRC. Subclass it, set ``name`` (and ``summary``, ``priority``), implement
    :meth:`recognizes`, :meth:`scan` and :meth:`read`, and register it with
    :func:`~.registry.register_reader`.

    Attributes:
        name: the ``--source`` value.
        summary: one line for ``--help`` and the docs.
        priority: auto-detection asks readers in this order (lowest first).
        takes_masks: its items may carry masks (``--num-classes``/``--ignore-index`` apply).
        path_rule: what its item paths are relative to, said when most inputs cannot be read
            (``{base}`` is filled in).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    priority: ClassVar[int] = 100
    takes_masks: ClassVar[bool] = False
    path_rule: ClassVar[str] = ""

    def __init__(self, src: str | Path, options: SourceOptions):
        self.src, self.options = src, options

    @classmethod
    def recognizes(cls, src: str | Path, options: SourceOptions) -> bool:
        """True when this reader reads ``src`` (auto-detection; cheap: look, do not scan)."""
        return False

    def scan(self) -> Scan:
        """The items of SRC per split (a fixed order), skips, scan rejects, classes and target.
        Raises :class:`~stoker.errors.UsageError` (one line) for a SRC it cannot read."""
        raise NotImplementedError

    def nothing_found(self) -> None:
        """Called when the scan found no image: raise a more specific one-line error than
        "SRC holds no images" when there is one to say."""

    def read(self, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        """The image bytes of item ``rel``, or ``(None, reason)``; never raises for a bad input."""
        raise NotImplementedError

    def read_mask(self, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        """The mask bytes of an item whose ``mask`` is ``rel``, or ``(None, reason)``."""
        return None, "this source has no masks"

    def where(self, rel: str) -> str:
        """Where item ``rel`` is, in full (error messages)."""
        return rel

    def identity(self) -> dict[str, Any]:
        """What identifies this SRC in the pack's settings (a rerun into OUT must match)."""
        return {"source": str(self.src)}

    def describe_path_rule(self) -> str:
        """:attr:`path_rule` with its placeholders filled in."""
        return self.path_rule


class FileReader(SourceReader):
    """A reader whose items are files under a folder (``base``; masks under ``mask_base``)."""

    def __init__(self, src: str | Path, options: SourceOptions):
        super().__init__(Path(src), options)
        self.base: Path = self.src
        self.mask_base: Path | None = None

    def read(self, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        return read_input(os.path.join(self.base, rel), max_bytes)

    def read_mask(self, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        return read_input(os.path.join(self.mask_base, rel), max_bytes)

    def where(self, rel: str) -> str:
        return os.path.join(self.base, rel)

    def identity(self) -> dict[str, Any]:
        return {"source": str(Path(self.src).resolve())}

    def describe_path_rule(self) -> str:
        return self.path_rule.format(base=self.base)


@dataclass
class Source:
    """A scanned SRC: its reader, the target kind and class names and, per split, the shuffled
    items, skip counts and scan rejects ``(display path, reason)``."""

    reader: SourceReader
    classes: list[str]
    splits: dict[str, list[Item]]
    skipped: dict[str, int] = field(default_factory=dict)
    rejects: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    target: Target = field(default_factory=Target)
    #: hidden folders the scan left out (:attr:`Scan.hidden`)
    hidden: list[str] = field(default_factory=list)
    #: the classes with val items but no train item (named by ``stoker pack``)
    val_only: list[str] = field(default_factory=list)
    #: :attr:`Scan.notes`
    notes: list[str] = field(default_factory=list)
    #: :attr:`Scan.class_ids`
    class_ids: list | None = None

    def path(self, item: Item) -> str:
        """Where ``item`` is (a file path for file sources)."""
        return self.reader.where(item.rel)

    def jobs(self, items: list[Item]) -> list[Job]:
        """What a sanitizer reads for each item."""
        return [Job(self.reader, it.rel, it.mask) for it in items]

    def digest(self, split: str) -> str:
        """sha256 of a split's (shuffled) sample list: identifies the input of a pack."""
        h = hashlib.sha256()
        for it in self.splits[split]:
            row = [it.rel, it.label]
            if it.target is not None or it.mask is not None:  # a class split's digest is as it always was
                row += [list(it.target or ()), it.mask]
            h.update(json.dumps(row).encode() + b"\n")
        return h.hexdigest()


def sanitize_item(job: Job, settings: Settings) -> Sanitized:
    """The sanitized JPEG (and mask PNG) of one input, its bytes read by its source's reader
    (:class:`Job`), or a reject reason. Never raises for a bad input. It lives with the sources:
    :mod:`~stoker.tools.pack.sanitize` knows bytes and paths, not readers."""
    reader = job.reader
    data, reason = reader.read(job.rel, settings.max_bytes)
    read_mask = None if job.mask is None else lambda: reader.read_mask(job.mask, settings.max_bytes)
    return _sanitize_read(data, reason, read_mask, settings)


def display_path(rel: str) -> str:
    """``rel`` as valid UTF-8 text: bytes of a non-UTF-8 file name become ``\\xNN``."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")


__all__ = [
    "MAX_LABEL",
    "SPLITS",
    "FileReader",
    "FirstSeen",
    "Item",
    "Job",
    "Scan",
    "Source",
    "SourceOptions",
    "SourceReader",
    "display_path",
    "input_identity",
    "normalized_url",
    "repeated_row",
    "same_file",
    "sanitize_item",
    "stat_identity",
]
