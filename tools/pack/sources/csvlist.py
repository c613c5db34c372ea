"""CSV/TSV lists of ``path,target`` rows: the rules ``stoker pack`` reads them by.

Rows are ``path,label`` (one target column) or ``path,v1,v2,...`` (several); tab-separated when
the file is ``.tsv`` or its first line holds a tab, ``;``-separated when its first line has a ``;``
before any comma (European spreadsheets; there a number's decimal comma, ``47,5`` or ``1.234,5``, is
read as a decimal point). Paths are relative to the CSV's folder.

* The file must be UTF-8 (a BOM is fine); otherwise a one-line error names the file and how to
  convert it (``iconv -f latin1 -t utf-8``).
* The first row is a header, and skipped, when its path cell has no image extension and it names
  a column: ``path/file/filename/filepath/image/img/image_path``, ``label/class/cls/target/
  category/y``, or names for number columns below it (``path,age``; ``file,x,y,z``). A header
  names the float columns; without one they are ``y`` (one) or ``y0, y1, ...``.
* What the target is (``--targets``, default ``auto``):

  - ``auto``: several target columns are a vector of K floats; one column whose cells are all
    numbers with at least one that is not an integer (``0.25``, ``1e-3``, ``2.0``, ``nan``) holds
    floats; a cell with ``|`` makes the column multi-label (``cat|dog``); else classes.
    **Never a silent class**: pack's summary says which (``targets: float, 1 column``).
  - ``class``: one label column; non-integer numbers are a one-line error (use ``float``).
  - ``float``: every target column is a float (an integer column, e.g. ages, too).
  - ``multilabel``: ``|``-separated labels per cell (names, or integer class indices).

* Classes: when every label is an ASCII integer (``-?[0-9]+``) labels are kept as they are
  (class ``i`` is index ``i``; names ``"0".."max"``); a label below 0 or above
  :data:`~.base.MAX_LABEL` is a reject ``"label <x> out of range 0..1000000"``. When every
  label is a name (``cat``, ``n01440764``) names are sorted and the index is the position.
  Labels that mix both kinds are a one-line error naming an example of each.
* Rejects, each listed with a reason: an empty path or target cell (``"empty path"``,
  ``"empty label"``, ``"target 'y' is empty"``), a float cell that is not a finite number
  (``"target 'y' is not finite: nan"``, ``"target 'x' is not a number: 'abc'"``), a path listed
  again (``"listed again on line 9 (first on line 3)"``: packed once) or listed again with another
  target (``"listed on lines 3 (1.5) and 9 (2.5) with different targets"``: neither is packed). Two
  paths to one file (``a.jpg`` and ``./sub/../a.jpg``, an absolute path, a symlink or a hard link:
  the sources' one identity rule, :func:`~.base.input_identity`) are one image: the later row is
  rejected ``"same file as a.jpg (line 3)"``; with another target both paths are rejected
  (``"same file as a.jpg, listed on lines 3 (1) and 9 (2) with different targets"``). A
  row with fewer cells than the widest (or the header), or with more than the header names, is a
  one-line error naming the row.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
from pathlib import Path

from stoker.errors import UsageError
from stoker.pipeline.shards.kinds import ClassKind, FloatKind, MultilabelKind, get_kind
from stoker.pipeline.shards.targets import MAX_COLUMNS, Target, finite_number

from ..options import setting
from ..sanitize import IMAGE_EXTS
from .base import MAX_LABEL, FileReader, Item, Scan, input_identity, repeated_row

TARGET_MODES = ("auto", ClassKind.name, FloatKind.name, MultilabelKind.name)
_PATH_WORDS = {"path", "file", "filename", "filepath", "file_path", "image", "img", "image_path", "image_name"}
_LABEL_WORDS = {"label", "class", "cls", "target", "category", "y", "class_name", "label_name"}
_INT = re.compile(r"-?[0-9]+")
_NAME = re.compile(r"[A-Za-z_][\w .-]*")


def read_text(path: Path) -> str:
    """A UTF-8 text file (BOM allowed), or a one-line error saying how to convert it."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise UsageError(
            f"{path} is not UTF-8 (byte 0x{raw[e.start]:02x} on line {line}); convert it, e.g. "
            f"iconv -f latin1 -t utf-8 {path} > fixed{path.suffix}"
        ) from None


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _is_header(row: list[str], below: list[str] | None) -> bool:
    first = row[0].strip().lower()
    if os.path.splitext(first)[1] in IMAGE_EXTS:
        return False
    if first in _PATH_WORDS or (len(row) > 1 and row[1].strip().lower() in _LABEL_WORDS):
        return True
    # `name,age`: names over number columns
    rest = [c.strip() for c in row[1:]]
    return bool(
        below
        and rest
        and all(_NAME.fullmatch(c) and not _is_number(c) for c in rest)
        and all(_is_number(c.strip()) for c in below[1 : len(row)])
    )


_DECIMAL_COMMA = re.compile(r"-?[0-9]+,[0-9]+")
_GROUPED_DECIMAL = re.compile(r"-?[0-9]{1,3}(\.[0-9]{3})+(,[0-9]+)?")


def _delimiter(path: Path, first_line: str) -> str:
    """Tab for a .tsv or a first line with a tab; ``;`` when the first line has one before any comma
    (European spreadsheets: ``path;age``, ``a.jpg;47,5``); else a comma."""
    if path.suffix.lower() == ".tsv" or "\t" in first_line:
        return "\t"
    if ";" in first_line and ("," not in first_line or first_line.index(";") < first_line.index(",")):
        return ";"
    return ","


def _decimal_point(cell: str) -> str:
    """A ``;``-delimited file's number with a decimal comma (``47,5``, ``1.234,5``) as ``47.5``."""
    c = cell.strip()
    if _GROUPED_DECIMAL.fullmatch(c):
        return c.replace(".", "").replace(",", ".")
    if _DECIMAL_COMMA.fullmatch(c):
        return c.replace(",", ".")
    return cell


def csv_rows(path: Path) -> tuple[str, list[tuple[int, list[str]]], list[str] | None]:
    """``(delimiter, data rows (line number, cells), header cells or None)``; in a ``;``-delimited
    file, decimal commas of the target cells are read as decimal points."""
    text = read_text(path)
    first_line = text.split("\n", 1)[0]
    delim = _delimiter(path, first_line)
    rows = [
        (n, r)
        for n, r in enumerate(csv.reader(text.splitlines(), delimiter=delim), start=1)
        if r and any(c.strip() for c in r)
    ]
    if delim == ";":
        rows = [(n, r[:1] + [_decimal_point(c) for c in r[1:]]) for n, r in rows]
    header = None
    if rows and _is_header(rows[0][1], rows[1][1] if len(rows) > 1 else None):
        header = [c.strip() for c in rows[0][1]]
        rows = rows[1:]
    return delim, rows, header


def scan_csv(
    path: Path, rejects: list[tuple[str, str]], targets: str = "auto", weight_column: str | None = None
) -> tuple[list[str], list[Item], Target]:
    """The items of a CSV/TSV list (rules in the module docstring): ``(class names, items,
    target kind)``; bad rows are appended to ``rejects``. ``weight_column`` (a header's name) is
    taken out of the target columns: each item's sampling weight."""
    if targets not in TARGET_MODES:
        raise UsageError(f"{setting('targets')} {targets!r} must be one of {', '.join(TARGET_MODES)}")
    delim, rows, header = csv_rows(path)
    rows, header, weights = _weight_cells(path, rows, header, weight_column)
    items_of = _scan_rows(path, rows, header, delim, targets, rejects)
    if weight_column is None:
        return items_of
    classes, items, kind = items_of
    return classes, _weighted(items, weights, weight_column, rejects), kind


def _weight_cells(path: Path, rows: list, header: list[str] | None, column: str | None) -> tuple:
    """``(rows, header, {path cell: weight cell})`` with the weight column taken out."""
    if column is None:
        return rows, header, {}
    if header is None or column not in header[1:]:
        named = f"its header names {', '.join(header)}" if header else "it has no header"
        raise UsageError(f"{setting('weight_column')} {column!r} is not a column of {path} ({named})")
    j = header.index(column)
    cut = [(n, r[:j] + r[j + 1 :]) for n, r in rows]
    cells: dict[str, str] = {}
    for _, r in rows:  # a path listed again keeps its first row's weight, as it keeps its first row
        cells.setdefault(r[0].strip(), r[j].strip() if j < len(r) else "")
    return cut, header[:j] + header[j + 1 :], cells


def _weighted(items: list[Item], cells: dict, column: str, rejects: list) -> list[Item]:
    """Each item with its weight (a finite number >= 0); a bad cell is a reject."""
    by_rel = {Path(rel).as_posix(): c for rel, c in cells.items()}
    out = []
    for it in items:
        cell = by_rel.get(it.rel, "")
        value = finite_number(cell) if cell and _is_number(cell) else None
        if value is None or value < 0:
            rejects.append((it.rel, f"weight {column!r} is not a finite number >= 0: {cell[:40]!r}"))
            continue
        out.append(dataclasses.replace(it, weight=float(value)))
    return out


def _scan_rows(path: Path, rows: list, header: list[str] | None, delim: str, targets: str, rejects: list) -> tuple:
    width = max((len(r) for _, r in rows), default=2) if header is None else len(header)
    for lineno, r in rows:
        if len(r) < 2 and delim == "," and ";" in r[0]:
            raise UsageError(
                f"{path}: line {lineno} has no ',' but a ';' ({r[0]!r}): for a ;-delimited file, put the ';' "
                "on the first line too (a header such as path;label), or save it with commas"
            )
        if len(r) < 2:
            raise UsageError(f"{path}: line {lineno} should be 'path{delim}label', got {delim.join(r)!r}")
        if len(r) < width:
            which = "the header" if header is not None else "the widest row"
            raise UsageError(f"{path}: line {lineno} has {len(r)} cells, {which} {width}")
        if header is not None and any(c.strip() for c in r[width:]):  # never a target column dropped
            raise UsageError(
                f"{path}: line {lineno} has {len(r)} cells but the header names {width} "
                f"({delim.join(header)}); name every column in the header"
            )
    ncols = width - 1
    if ncols > MAX_COLUMNS:
        raise UsageError(f"{path} has {ncols:,} target columns, more than {MAX_COLUMNS:,}: is it a list of images?")
    good: list[tuple[str, list[str], tuple]] = []
    first: dict[tuple, tuple[int, list[str], str]] = {}  # an image's first row: (line, cells, path)
    conflicting: set[tuple] = set()
    for lineno, r in rows:
        rel, cells = r[0].strip(), [c.strip() for c in r[1:width]]
        if not rel:
            rejects.append((f"{path.name}:{lineno}", "empty path"))
            continue
        if ncols == 1 and not cells[0]:
            rejects.append((rel, "empty label"))
            continue
        key = input_identity(os.path.join(path.parent, rel))  # two paths to one file are one image
        if key not in first:
            first[key] = (lineno, cells, rel)
            good.append((rel, cells, key))
            continue
        line, was, first_rel = first[key]
        differ = f"on lines {line} ({delim.join(was)}) and {lineno} ({delim.join(cells)}) with different targets"
        repeated_row(rejects, conflicting, key, (first_rel, line), (rel, lineno), same=was == cells, differ=differ)
    good = [(rel, cells) for rel, cells, key in good if key not in conflicting]
    kind = _kind(path, targets, ncols, [c[0] for _, c in good])
    if kind is FloatKind:
        names = header[1:width] if header else (["y"] if ncols == 1 else [f"y{k}" for k in range(ncols)])
        return [], _float_items(good, names, rejects), FloatKind(columns=tuple(names))
    if kind is MultilabelKind:
        classes, items = _label_items(path, [(rel, cells[0].split("|")) for rel, cells in good], rejects)
        return classes, items, MultilabelKind()
    classes, items = _label_items(path, [(rel, [cells[0]]) for rel, cells in good], rejects)
    return classes, [Item(it.rel, it.target[0]) for it in items], ClassKind()


def _kind(path: Path, targets: str, ncols: int, cells: list[str]) -> type[Target]:
    """The kind the target columns hold (``--targets auto`` decides from the cells)."""
    if targets == ClassKind.name and ncols > 1:
        raise UsageError(
            f"{setting('targets', 'class')} takes one label column; {path} has {ncols} "
            f"(use {setting('targets', 'float')})"
        )
    if targets == MultilabelKind.name and ncols > 1:
        raise UsageError(
            f"{setting('targets', 'multilabel')} takes one column of |-separated labels; {path} has {ncols}"
        )
    numeric = bool(cells) and all(_is_number(c) for c in cells if c)
    fractional = [c for c in cells if c and _is_number(c) and not _INT.fullmatch(c)]
    if targets == ClassKind.name and numeric and fractional:
        raise UsageError(
            f"{path}: {setting('targets', 'class')} but labels are non-integer numbers (e.g. {fractional[0]!r}); "
            f"use {setting('targets', 'float')} for float targets, or integer class indices"
        )
    if targets != "auto":
        return get_kind(targets)
    if ncols > 1:
        return FloatKind
    if any("|" in c for c in cells):
        return MultilabelKind
    return FloatKind if numeric and fractional else ClassKind


def _float_items(good: list[tuple[str, list[str]]], names: list[str], rejects: list) -> list[Item]:
    items = []
    for rel, cells in good:
        values, why = [], None
        for name, c in zip(names, cells, strict=True):
            if not c:
                why = f"target {name!r} is empty"
            elif not _is_number(c):
                why = f"target {name!r} is not a number: {c[:40]!r}"
            elif finite_number(c) is None:
                why = f"target {name!r} is not finite: {c}"
            else:
                values.append(float(c))
                continue
            break
        if why:
            rejects.append((rel, why))
        else:
            items.append(Item(Path(rel).as_posix(), target=tuple(values)))
    return items


def _label_items(path: Path, good: list[tuple[str, list[str]]], rejects: list) -> tuple[list[str], list[Item]]:
    """Class names and items whose ``target`` is the tuple of their class indices (one for a
    class, any number for multi-label)."""
    good = [(rel, [p.strip() for p in parts if p.strip()]) for rel, parts in good]
    for rel, parts in good:
        if not parts:
            rejects.append((rel, "empty label"))
    good = [(rel, parts) for rel, parts in good if parts]
    labels = [p for _, parts in good for p in parts]
    ints = [p for p in labels if _INT.fullmatch(p)]
    if ints and len(ints) != len(labels):
        name = next(p for p in labels if not _INT.fullmatch(p))
        raise UsageError(
            f"{path}: labels mix integers and names (e.g. {ints[0]!r} and {name!r}); "
            f"use integer class indices or class names, not both"
        )
    items: list[Item] = []
    if ints:
        top = -1
        for rel, parts in good:
            bad = next((p for p in parts if not 0 <= int(p) <= MAX_LABEL), None)
            if bad is not None:
                rejects.append((rel, f"label {bad} out of range 0..{MAX_LABEL}"))
                continue
            values = tuple(sorted({int(p) for p in parts}))
            items.append(Item(Path(rel).as_posix(), target=values))
            top = max(top, values[-1])
        return [str(i) for i in range(top + 1)], items
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    items = [Item(Path(rel).as_posix(), target=tuple(sorted({index[p] for p in parts}))) for rel, parts in good]
    return classes, items


class CsvReader(FileReader):
    """A CSV/TSV list of ``path,label`` or ``path,v1,v2,...`` rows (paths relative to its folder)."""

    name, priority = "csv", 40
    summary = "a CSV/TSV of path,label (or path,values) rows, paths relative to its folder"
    path_rule = "paths in a CSV are relative to the CSV's folder ({base})"

    def __init__(self, src, options):
        super().__init__(src, options)
        self.base = self.src.parent

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return isinstance(src, Path) and src.is_file() and src.suffix.lower() in (".csv", ".tsv", ".txt")

    def scan(self) -> Scan:
        rejects: list[tuple[str, str]] = []
        classes, items, target = scan_csv(self.src, rejects, self.options.targets, self.options.weight_column)
        return Scan(classes, {"train": items}, {"train": 0}, {"train": rejects}, target)


__all__ = ["TARGET_MODES", "CsvReader", "csv_rows", "read_text", "scan_csv"]
