"""The parquet reader: a table of images and their targets, as Hugging Face ``datasets`` writes it.

SRC is a ``.parquet`` file, a folder of them (a dataset repository: ``data/train-00000-of-00002.parquet``,
``data/validation-...``), or an fsspec URL of either (``s3://bucket/ds/train.parquet``; over plain
HTTP a folder is its index page, as a static file server lists it, whose ``*.parquet`` links are
the files). In a
folder, files named ``train*`` are the train split and ``validation*``/``valid*``/``val*``/``dev*``
the val split; files of other splits (``test*``) are left out and their rows counted as skipped.
When no file is named after a split, every file is train.

* **The image column** holds, per row, a struct ``{bytes, path}`` (``datasets``' ``Image``
  feature) or plain bytes. When ``bytes`` is null the image is the file ``path`` (relative to the
  parquet's folder, or absolute). ``--image-column`` names it when there are several.
* **The target column** (``--target-column``; comma-separated names make a vector of floats) is,
  when not named: a second image column (a mask: segmentation), else the one column named like a
  label (``label``, ``labels``, ``class``, ``target``, ...), else the only other column. Its type
  says the kind (``--targets`` forces one): integers are classes (names from the table's
  ``datasets`` metadata, a ``ClassLabel``, when it has them; else kept as they are), strings are
  class names, floats are float targets, lists are multi-label (of ``ClassLabel`` indices or names).
* Rejects, each with its reason: an image with neither bytes nor path (``image is empty (no bytes,
  no path)``), an empty label, a label outside its classes, a float that is not finite; a row
  whose ``path`` names a file an earlier row named (by the sources' one identity rule,
  :func:`~.base.input_identity`: ``same file as a.jpg (train.parquet#3)``), across files and splits.
* A file that is not parquet (or is damaged in its footer or target column) is a one-line error
  naming it; a row that cannot be read when packed is that row's reject.

Items are rows (``<file>#<row>``); a worker reads a row's bytes from its row group, keeping the
row groups it read last (a bounded cache per process), so nearby rows cost one read.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import json
import math
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stoker.errors import MissingExtraError, StokerError, UsageError, one_line
from stoker.pipeline.shards.kinds import ClassKind, FloatKind, MaskKind, MultilabelKind
from stoker.pipeline.shards.targets import MAX_COLUMNS
from stoker.pipeline.storage import filesystem, is_url, storage_errors

from ..options import setting
from .base import MAX_LABEL, FirstSeen, Item, Scan, SourceReader, input_identity, same_file

_LABEL_WORDS = ("label", "labels", "class", "cls", "target", "category", "y", "fine_label", "class_name")
_MASK_WORDS = ("mask", "annotation", "segmentation", "seg", "semantic", "label_mask", "gt", "label")
_VAL_NAMES = ("validation", "valid", "val", "dev")
CACHE_BYTES = 256 * 1024**2  # row groups a worker keeps (per process)


def _pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError(
            "reading a parquet SRC needs pyarrow, which is not installed: pip install stoker[parquet]"
        ) from None
    return pq


def _bad_file_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged or non-parquet file raises: the damaged-input errors and pyarrow's
    own (``ArrowInvalid`` "Parquet magic bytes not found", ``ArrowNotImplementedError``, ...)."""
    import pyarrow as pa

    from stoker.pipeline.imagedecode import DAMAGED_INPUT

    return (*DAMAGED_INPUT, pa.ArrowException)


def _image_location(location: str, path: str) -> str:
    """Where the image a row names by ``path`` is: relative to its parquet's folder (or URL), or
    absolute (a local path, or a URL)."""
    if is_url(path) or (not is_url(location) and os.path.isabs(path)):
        return path
    if not is_url(location):
        return os.path.join(os.path.dirname(location), path)
    if path.startswith("/"):  # an absolute local path in a remote table
        return path
    return posixpath.join(posixpath.dirname(location), path)


def _split_of(name: str) -> str | None:
    base = posixpath.basename(name).lower()
    head = base.replace("_", "-").replace(".", "-").split("-", 1)[0]
    if head == "train":
        return "train"
    if head in _VAL_NAMES:
        return "val"
    return None


def _is_image_type(t) -> bool:
    import pyarrow as pa

    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    return pa.types.is_struct(t) and any(t.field(i).name == "bytes" for i in range(t.num_fields))


def _features(schema) -> dict:
    """The ``datasets`` features of the table (its ``huggingface`` metadata), or {}."""
    try:
        meta = json.loads((schema.metadata or {}).get(b"huggingface", b"{}"))
        return (meta.get("info") or {}).get("features") or {}
    except (ValueError, AttributeError):
        return {}


def _class_names(feature) -> list[str] | None:
    """The ``ClassLabel`` names of a feature, or of the items of a list feature."""
    if isinstance(feature, list) and feature:
        feature = feature[0]
    if not isinstance(feature, dict):
        return None
    if feature.get("_type") == "ClassLabel" and feature.get("names"):
        return [str(n) for n in feature["names"]]
    if feature.get("_type") in ("Sequence", "List", "LargeList"):
        return _class_names(feature.get("feature"))
    return None


# ---- the worker side: open files and row groups, cached per process --------------------------
_OPEN: dict[tuple, Any] = {}
_ROW_GROUPS: collections.OrderedDict = collections.OrderedDict()


def _parquet_file(location: str, storage_options: dict):
    key = (os.getpid(), location)  # a forked worker opens its own (fsspec clients are not fork-safe)
    if key not in _OPEN:
        pq = _pyarrow()
        if is_url(location):
            fs, path = filesystem(location, storage_options)
            _OPEN[key] = pq.ParquetFile(fs.open(path, "rb"))
        else:
            _OPEN[key] = pq.ParquetFile(location)
    return _OPEN[key]


def _column(location: str, storage_options: dict, group: int, column: str):
    key = (os.getpid(), location, group, column)
    if key in _ROW_GROUPS:
        _ROW_GROUPS.move_to_end(key)
        return _ROW_GROUPS[key]
    table = _parquet_file(location, storage_options).read_row_group(group, columns=[column])
    array = table.column(0).combine_chunks()
    _ROW_GROUPS[key] = array
    while len(_ROW_GROUPS) > 1 and sum(a.nbytes for a in _ROW_GROUPS.values()) > CACHE_BYTES:
        _ROW_GROUPS.popitem(last=False)
    return array


class ParquetReader(SourceReader):
    """A parquet table (or a folder or URL of them): one row per image."""

    name, priority = "parquet", 20
    summary = "a parquet table (Hugging Face datasets' layout): image bytes and targets per row"
    takes_masks = True
    path_rule = "image paths in a parquet are relative to the parquet's folder"

    def __init__(self, src, options):
        super().__init__(src if is_url(src) else Path(src), options)
        self.files: dict[str, str] = {}  # display name -> location (path or URL)
        self.offsets: dict[str, list[int]] = {}  # display name -> first row of each row group (not pickled)
        self.image_column = ""
        self.mask_column = ""
        self.target_columns: list[str] = []

    def __getstate__(self) -> dict:
        # pickled with every chunk of work: the row-group offsets are read again from each file's
        # footer in the worker (cached per process), so a chunk stays small however big the table
        return {**self.__dict__, "offsets": {}}

    @classmethod
    def recognizes(cls, src, options) -> bool:
        if is_url(src):
            return not str(src).lower().endswith((".csv", ".tsv", ".txt"))
        src = Path(src)
        if src.is_file():
            return src.suffix.lower() == ".parquet"
        if src.is_dir():
            return any(src.glob("*.parquet")) or any(src.glob("*/*.parquet"))
        return False

    def identity(self) -> dict:
        return {"source": str(self.src) if is_url(self.src) else str(Path(self.src).resolve())}

    def where(self, rel: str) -> str:
        name, _, row = rel.rpartition("#")
        return f"{self.files.get(name, name)}#{row}"

    # ---- scan ----------------------------------------------------------------------------
    def _locate(self) -> list[tuple[str, str]]:
        """``(display name, location)`` of every parquet file of SRC, sorted."""
        src = self.src
        if is_url(src):
            fs, root = filesystem(str(src), self.options.storage_options)
            proto = str(src).split("://", 1)[0]
            with storage_errors(str(src)):
                # a folder is what lists as one: over HTTP a folder URL is also a "file" (its
                # index page), so the file test comes second, or for a name ending in .parquet
                named = root.rstrip("/").lower().endswith(".parquet")
                if (named or not fs.isdir(root)) and fs.isfile(root):
                    return [(posixpath.basename(root.rstrip("/")), str(src))]
                found = sorted(p for p in fs.find(root) if p.lower().endswith(".parquet"))
            root = root.rstrip("/")
            return [(posixpath.relpath(p, root), p if is_url(p) else f"{proto}://{p}") for p in found]
        if src.is_file():
            return [(src.name, str(src))]
        found = sorted(p for p in src.rglob("*.parquet") if not p.relative_to(src).as_posix().startswith("."))
        return [(p.relative_to(src).as_posix(), str(p)) for p in found]

    def scan(self) -> Scan:
        _pyarrow()
        files = self._locate()
        if not files:
            raise UsageError(f"SRC {self.src} holds no .parquet file")
        named = {name: _split_of(name) for name, _ in files}
        by_name = any(named.values()) and not (len(files) == 1 and not is_url(self.src) and Path(self.src).is_file())
        schema = None
        splits: dict[str, list[Item]] = {"train": []}
        rejects: dict[str, list[tuple[str, str]]] = {"train": []}
        skipped = {"train": 0}
        columns: dict[str, list] = {}
        rows_of: list[tuple[str, str, int]] = []  # (split, name, rows)
        paths_of: dict[str, dict[int, str]] = {}  # name -> {row: the file its image is}
        for name, location in files:
            with self._reading(location):
                pf = _parquet_file(location, self.options.storage_options)
                if schema is None:
                    schema = pf.schema_arrow
                    self._choose_columns(schema)
                elif pf.schema_arrow.names != schema.names:
                    raise UsageError(
                        f"{location} has columns {', '.join(pf.schema_arrow.names)}, {files[0][1]} has "
                        f"{', '.join(schema.names)}: every parquet file of SRC must have the same columns"
                    )
                split = (named[name] if by_name else "train") or None
                if split is None:
                    skipped["train"] += pf.metadata.num_rows
                    continue
                self.files[name] = location
                md = pf.metadata
                if self.target_columns:
                    table = pf.read(columns=self.target_columns)
                    for c in self.target_columns:
                        columns.setdefault(c, []).extend(table.column(c).to_pylist())
                paths_of[name] = self._path_rows(pf, schema)
            rows_of.append((split, name, md.num_rows))
        values = self._target_values(columns)
        classes, target, make = self._kind(schema, values)
        k = 0
        seen = FirstSeen()  # rows naming one image file: the first is packed
        for split, name, n in rows_of:
            splits.setdefault(split, [])
            rejects.setdefault(split, [])
            skipped.setdefault(split, 0)
            paths = paths_of[name]
            for row in range(n):
                rel = f"{name}#{row}"
                item, why = make(rel, values[k] if values is not None else None)
                k += 1
                if item is not None and row in paths:
                    path = paths[row]
                    first = seen.first(input_identity(_image_location(self.files[name], path)), (path, rel))
                    if first is not None:
                        item, why = None, same_file(*first)
                if item is None:
                    rejects[split].append((rel, why))
                else:
                    splits[split].append(item)
        if classes is None:  # integer labels without names: classes "0".."max", as a CSV's
            top = max((max(it.target) if it.target else it.label for s in splits.values() for it in s), default=-1)
            classes = [str(i) for i in range(top + 1)]
        return Scan(classes, splits, skipped, rejects, target, val_source="a validation parquet file")

    @contextlib.contextmanager
    def _reading(self, location: str) -> Iterator[None]:
        """A scan's reading of one file: a file that is not parquet, or is damaged, is a one-line
        error naming it; a failing store is a :class:`~stoker.errors.StorageError`."""
        remote = is_url(location)
        # remote, an OSError is the store's (storage_errors says it); local, the file's
        bad = tuple(e for e in _bad_file_errors() if not (remote and issubclass(e, OSError)))
        try:
            with storage_errors(location) if remote else contextlib.nullcontext():
                try:
                    yield
                except StokerError:  # a one-line error of the scan's own (an ArgumentError is a ValueError)
                    raise
                except bad as e:
                    if isinstance(e, FileNotFoundError):
                        raise
                    raise UsageError(f"{location} is not a readable parquet file: {one_line(e)}") from None
        except FileNotFoundError:
            raise UsageError(f"{location} does not exist (a file of SRC {self.src})") from None

    def _path_rows(self, pf, schema) -> dict[int, str]:
        """The rows of ``pf`` whose image is a file named by its ``path`` (its ``bytes`` null):
        ``{row: path}``. Only row groups whose statistics say some ``bytes`` are null are read."""
        import pyarrow as pa

        t = schema.field(self.image_column).type
        if not pa.types.is_struct(t) or {t.field(i).name for i in range(t.num_fields)} < {"bytes", "path"}:
            return {}
        md = pf.metadata
        leaf = f"{self.image_column}.bytes"
        out: dict[int, str] = {}
        start = 0
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            stats = next(
                (rg.column(c).statistics for c in range(rg.num_columns) if rg.column(c).path_in_schema == leaf), None
            )
            if stats is not None and stats.has_null_count and stats.null_count == 0:
                start += rg.num_rows
                continue
            col = pf.read_row_group(g, columns=[leaf, f"{self.image_column}.path"]).column(0).combine_chunks()
            valid = col.is_valid().to_pylist()
            no_bytes = col.field("bytes").is_null().to_pylist()
            for i, path in enumerate(col.field("path").to_pylist()):
                if valid[i] and no_bytes[i] and path:
                    out[start + i] = path
            start += rg.num_rows
        return out

    def _choose_columns(self, schema) -> None:
        names = schema.names
        listing = ", ".join(names)
        images = [n for n in names if _is_image_type(schema.field(n).type)]
        opts = self.options
        if opts.image_column is not None:
            if opts.image_column not in names:
                raise UsageError(
                    f"{setting('image_column')} {opts.image_column!r} is not a column of {self.src} ({listing})"
                )
            image = opts.image_column
        else:
            plain = [n for n in images if n.lower() not in _MASK_WORDS]
            if len(images) == 1 or len(plain) == 1:
                image = images[0] if len(images) == 1 else plain[0]
            elif not images:
                raise UsageError(
                    f"{self.src} has no image column (a struct of bytes and path, or binary): choose one "
                    f"with {setting('image_column')} (columns: {listing})"
                )
            else:
                raise UsageError(
                    f"{self.src} has several image columns ({', '.join(images)}): choose one with "
                    f"{setting('image_column')} "
                    f"(columns: {listing})"
                )
        self.image_column = image
        others = [n for n in names if n != image]
        if opts.target_column is not None:
            wanted = [c.strip() for c in opts.target_column.split(",") if c.strip()]
            missing = [c for c in wanted if c not in names]
            if missing or not wanted:
                raise UsageError(
                    f"{setting('target_column')} {opts.target_column!r} is not a column of {self.src} ({listing})"
                )
            if len(wanted) == 1 and _is_image_type(schema.field(wanted[0]).type):
                self.mask_column, self.target_columns = wanted[0], []
                return
            self.target_columns = wanted
            return
        masks = [n for n in others if _is_image_type(schema.field(n).type)]
        if len(masks) == 1:
            self.mask_column, self.target_columns = masks[0], []
            return
        labels = [n for n in others if n.lower() in _LABEL_WORDS and not _is_image_type(schema.field(n).type)]
        candidates = [n for n in others if not _is_image_type(schema.field(n).type)]
        if len(labels) == 1:
            self.target_columns = labels
        elif len(candidates) == 1:
            self.target_columns = candidates
        else:
            raise UsageError(
                f"{self.src}: which column is the target? choose with {setting('target_column')} NAME "
                f"(columns: {listing}; the image is {image!r})"
            )

    def _target_values(self, columns: dict[str, list]) -> list | None:
        if not self.target_columns:
            return None
        if len(self.target_columns) == 1:
            return columns.get(self.target_columns[0], [])
        return list(zip(*(columns[c] for c in self.target_columns), strict=True))

    def _kind(self, schema, values):
        """``(classes, target, make(rel, value) -> (item, reject reason))`` of the target column(s)."""
        import pyarrow as pa

        opts = self.options
        if self.mask_column:
            target = MaskKind.of(num_classes=opts.num_classes, ignore_index=opts.ignore_index)
            classes = [str(i) for i in range(opts.num_classes)] if opts.num_classes else []
            return classes, target, lambda rel, v: (Item(rel, mask=rel), None)
        cols = self.target_columns
        types = [schema.field(c).type for c in cols]
        features = _features(schema)
        mode = opts.targets
        if len(cols) > 1 or mode == FloatKind.name or all(pa.types.is_floating(t) for t in types):
            if mode not in ("auto", FloatKind.name):
                raise UsageError(
                    f"{setting('targets', mode)} takes one label column; {self.src} names {', '.join(cols)}"
                )
            return self._floats(cols, types, values)
        t = types[0]
        names = _class_names(features.get(cols[0]))
        if pa.types.is_list(t) or pa.types.is_large_list(t) or mode == MultilabelKind.name:
            return self._labels(names, values, multi=True)
        return self._labels(names, values, multi=False)

    def _floats(self, cols, types, values):
        import pyarrow as pa

        vector = len(cols) == 1 and (pa.types.is_list(types[0]) or pa.types.is_fixed_size_list(types[0]))
        if vector:
            width = max((len(v) for v in values if v), default=1)
            names = tuple(f"{cols[0]}{i}" for i in range(width))
        else:
            names = tuple(cols)
        if not 1 <= len(names) <= MAX_COLUMNS:
            raise UsageError(f"{self.src}: a float target has 1 to {MAX_COLUMNS} values, {cols[0]!r} has {len(names)}")

        def make(rel, v):
            row = list(v) if vector else ([v] if len(cols) == 1 else list(v))
            if vector and (v is None or len(row) != len(names)):
                return None, f"target {cols[0]!r} has {0 if v is None else len(row)} values, not {len(names)}"
            out = []
            for name, x in zip(names, row, strict=True):
                if x is None:
                    return None, f"target {name!r} is empty"
                try:
                    f = float(x)
                except (TypeError, ValueError):
                    return None, f"target {name!r} is not a number: {str(x)[:40]!r}"
                if not math.isfinite(f):
                    return None, f"target {name!r} is not finite: {f}"
                out.append(f)
            return Item(rel, target=tuple(out)), None

        return [], FloatKind(columns=names), make

    def _labels(self, names, values, *, multi: bool):
        """Class or multi-label targets: ``ClassLabel`` indices (with their names), class names
        (sorted), or integers kept as they are (classes ``None``: "0".."max", set by the scan)."""
        flat = [x for v in values if v is not None for x in (v if multi else [v])]
        if names is None and any(isinstance(x, str) for x in flat):
            names = sorted({str(x) for x in flat})
        index = {c: i for i, c in enumerate(names or ())}
        limit = MAX_LABEL if names is None else len(names) - 1

        def make(rel, v):
            parts = v if multi else [v]
            if v is None or not parts or any(x is None for x in parts):
                return None, "empty label"
            try:
                got = sorted({index[x] if isinstance(x, str) else int(x) for x in parts})
            except (KeyError, ValueError, TypeError):
                return None, f"label {parts[0]!r} is not a class name"
            bad = next((x for x in got if not 0 <= x <= limit), None)
            if bad is not None:
                return None, f"label {bad} out of range 0..{limit}"
            return (Item(rel, target=tuple(got)) if multi else Item(rel, got[0])), None

        return (list(names) if names is not None else None), MultilabelKind() if multi else ClassKind(), make

    # ---- read ----------------------------------------------------------------------------
    def _cell(self, rel: str, column: str):
        name, _, row = rel.rpartition("#")
        location = self.files[name]
        offsets = self.offsets.get(name)
        if offsets is None:  # first read of this file in this process: its row groups from the footer
            md = _parquet_file(location, self.options.storage_options).metadata
            offsets = [0]
            for g in range(md.num_row_groups):
                offsets.append(offsets[-1] + md.row_group(g).num_rows)
            self.offsets[name] = offsets
        row = int(row)
        group = bisect.bisect_right(offsets, row) - 1
        array = _column(location, self.options.storage_options, group, column)
        return array[row - offsets[group]].as_py(), location

    def _read(self, rel: str, column: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        try:
            value, location = self._cell(rel, column)
        except _bad_file_errors() as e:  # a damaged row group is this row's reject; a bug raises
            return None, f"unreadable: {one_line(e)}"
        data, path = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else (value, None)
        if data is None:
            if not path:
                return None, "image is empty (no bytes, no path)"
            return self._read_path(location, path, max_bytes)
        if len(data) > max_bytes:
            return None, f"file too large ({len(data):,} bytes > {max_bytes:,})"
        return data, None

    def _read_path(self, location: str, path: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        """An image a row names by ``path`` (:func:`_image_location`): a local file, or a URL read
        with fsspec (a missing one is this row's reject; a failing store stops the pack in one
        line, :class:`~stoker.errors.StorageError`, and a rerun resumes)."""
        from ..sanitize import read_input

        where = _image_location(location, path)
        if not is_url(where):
            return read_input(where, max_bytes)
        try:
            with storage_errors(where):
                fs, p = filesystem(where, self.options.storage_options)
                size = fs.size(p)  # None: a server that does not say
                if size is not None and size > max_bytes:
                    return None, f"file too large ({size:,} bytes > {max_bytes:,})"
                data = fs.cat_file(p)
        except FileNotFoundError:
            return None, "unreadable: errno 2 (No such file or directory)"
        if len(data) > max_bytes:
            return None, f"file too large ({len(data):,} bytes > {max_bytes:,})"
        return data, None

    def read(self, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        return self._read(rel, self.image_column, max_bytes)

    def read_mask(self, rel: str, max_bytes: int) -> tuple[bytes | None, str | None]:
        return self._read(rel, self.mask_column, max_bytes)

    def describe_path_rule(self) -> str:
        return self.path_rule


__all__ = ["ParquetReader"]
