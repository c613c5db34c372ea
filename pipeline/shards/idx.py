"""DALI's WebDataset index format (``.idx``), written and read, and the tar scan behind it.

The format is what DALI's ``wds2idx`` writes: a first line ``v1.2 <num_samples>``,
then one line per sample listing each component as ``<ext> <offset> <size> <name>``,
where ``offset`` is the byte offset of the member's data (after its 512-byte header).
Components of a sample are consecutive tar members sharing a key: the member name up
to the first dot of its basename (WebDataset's rule).

Fields are separated by whitespace (DALI reads them with ``>>``), so a member name holding
whitespace or ``%`` is written percent-escaped (``a b.jpg`` → ``a%20b.jpg``); DALI only
reports the name, never opens it, so its reader reads such an index unchanged. Every other
name is written exactly as ``wds2idx`` writes it.
"""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from stoker.errors import IdxFormatError, TarFormatError

from ..fsutil import PathLike, atomic_write

IDX_VERSION = "v1.2"
#: component names (case-insensitive) read as a sample's image: what the loader decodes
IMAGE_EXTS = ("jpg", "jpeg", "png")
#: labels are class indices ``0 .. MAX_CLASSES - 1``; a larger ``cls`` is a damaged or foreign
#: label, not a class (a manifest's class list and the loss's output layer scale with it)
MAX_CLASSES = 1_000_000
#: a ``cls`` member longer than this cannot be a class index below MAX_CLASSES (whitespace allowed)
MAX_CLS_BYTES = 32

# compressed tars, by magic number: (kind, the command that decompresses one)
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", "gunzip"),
    (b"BZh", "bzip2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"\x04\x22\x4d\x18", "lz4", "unlz4"),
)
_LABEL = re.compile(rb"\s*([0-9]+)\s*")
_NEEDS_ESCAPE = re.compile(r"[\s%\udc80-\udcff]")


@dataclass(frozen=True)
class Component:
    ext: str
    offset: int
    size: int
    name: str


Sample = list[Component]


@dataclass
class TarScan:
    """What :func:`scan_tar` found: the samples (what the ``.idx`` lists), the samples that
    must not be loaded (``index -> reason``: a component repeated within one sample), and the
    members that belong to no sample (``(name, reason)``: directories, links, no extension)."""

    samples: list[Sample]
    problems: dict[int, str] = field(default_factory=dict)
    ignored: list[tuple[str, str]] = field(default_factory=list)


def split_key(name: str) -> tuple[str, str]:
    """``"dir/abc.seg.jpg"`` → ``("dir/abc", "seg.jpg")`` (WebDataset's key rule)."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def sample_key(sample: Sample) -> str:
    return split_key(sample[0].name)[0]


def image_component(sample: Sample) -> Component | None:
    """The component the loader decodes: the first ``jpg``/``jpeg``/``png`` one, in tar order."""
    return next((c for c in sample if c.ext.lower() in IMAGE_EXTS), None)


def parse_label(raw: bytes, num_classes: int | None = None, names: Mapping[str, int] | None = None) -> int | str:
    """A ``cls`` component's bytes → its class index, or why it is not one (``"what: detail"``).

    A label is a non-negative decimal integer (surrounding whitespace allowed) below
    :data:`MAX_CLASSES` and, when ``num_classes`` is given, below it; or, with ``names`` (class
    name → index: the manifest's classes, ``stoker index --classes``), one of those names, as the
    Loader reads it.
    """
    if len(raw) > MAX_CLS_BYTES:
        return f"cls is not an integer: {len(raw):,} bytes"
    m = _LABEL.fullmatch(raw)
    if m is None:
        if names:
            name = raw.strip().decode("utf-8", "surrogateescape")
            found = names.get(name)
            return found if found is not None else f"cls {name!r} is not one of the class names"
        text = raw.strip().decode("utf-8", "replace")[:MAX_CLS_BYTES]
        if re.fullmatch(r"-[0-9]+", text):
            return f"cls is negative: {text}"
        return f"cls is not an integer: {text!r}"
    value = int(m.group(1))
    if value >= MAX_CLASSES:
        return f"cls is above the limit of {MAX_CLASSES - 1:,} (MAX_CLASSES): {value}"
    if num_classes is not None and value >= num_classes:
        return f"cls is outside the {num_classes} classes of the manifest: {value}"
    return value


def read_label(
    f: BinaryIO, cls: Component, num_classes: int | None = None, names: Mapping[str, int] | None = None
) -> int | str:
    """:func:`parse_label` of the ``cls`` component ``cls`` of the open tar ``f`` (reads at
    most :data:`MAX_CLS_BYTES`: a huge member is rejected by its size)."""
    if cls.size > MAX_CLS_BYTES:
        return f"cls is not an integer: {cls.size:,} bytes"
    f.seek(cls.offset)
    return parse_label(f.read(cls.size), num_classes, names)


def escape_name(name: str) -> str:
    """A member name as one whitespace-free ``.idx`` field (unchanged for ordinary names)."""
    if not _NEEDS_ESCAPE.search(name):
        return name
    return "".join(
        "".join(f"%{b:02X}" for b in ch.encode("utf-8", "surrogateescape")) if _NEEDS_ESCAPE.match(ch) else ch
        for ch in name
    )


def unescape_name(field_text: str) -> str:
    """Inverse of :func:`escape_name`."""
    if "%" not in field_text:
        return field_text
    from urllib.parse import unquote

    return unquote(field_text, errors="surrogateescape")


def format_idx(samples: Sequence[Sample]) -> str:
    lines = [f"{IDX_VERSION} {len(samples)}"]
    for sample in samples:
        lines.append(" ".join(f"{c.ext} {c.offset} {c.size} {escape_name(c.name)}" for c in sample))
    return "\n".join(lines) + "\n"


def write_idx(path: PathLike, samples: Sequence[Sample]) -> None:
    """Write an ``.idx`` atomically."""
    with atomic_write(path, "wb") as f:  # names are escaped to valid UTF-8 (see escape_name)
        f.write(format_idx(samples).encode("utf-8"))


def bad_idx(path: Path, what: str) -> IdxFormatError:
    """The one-line error for a damaged ``.idx``: the file, what is wrong, and the fix."""
    return IdxFormatError(f"index {path}: {what} (rerun `stoker index {path.parent}`)")


def idx_lines(path: PathLike) -> list[bytes]:
    """The sample lines of an ``.idx``, once its first line and sample count are checked.

    Raises :class:`IdxFormatError` naming the file on a missing, empty or miscounted index.
    """
    path = Path(path)
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as e:
        raise bad_idx(path, f"cannot be read: {e.strerror}") from None
    if lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise bad_idx(path, "empty")
    head = lines[0].split()
    if len(head) != 2 or head[0] != IDX_VERSION.encode() or not head[1].isdigit():
        first = lines[0].decode("ascii", "replace")
        got = f", got {first!r}" if len(first) <= 40 and first.isprintable() and lines[0].isascii() else ""
        raise bad_idx(path, f"first line should be '{IDX_VERSION} <count>'{got}")
    if len(lines) - 1 != int(head[1]):
        raise bad_idx(path, f"declares {int(head[1])} samples but lists {len(lines) - 1}")
    return lines[1:]


def idx_fields(path: PathLike, lineno: int, line: bytes) -> list[tuple[bytes, int, int, bytes]]:
    """One sample line as ``(ext, offset, size, escaped name)`` per component.

    Fields split on ASCII whitespace only, as DALI's reader does.
    """
    fields = line.split()
    if not fields or len(fields) % 4:
        raise bad_idx(Path(path), f"line {lineno}: expected groups of 'ext offset size name'")
    out = []
    for i in range(0, len(fields), 4):
        offset, size = fields[i + 1], fields[i + 2]
        if not (offset.isdigit() and size.isdigit()):
            raise bad_idx(Path(path), f"line {lineno}: offset/size are not non-negative integers")
        out.append((fields[i], int(offset), int(size), fields[i + 3]))
    return out


def read_idx(path: PathLike) -> list[Sample]:
    """Parse an ``.idx`` file; raise :class:`IdxFormatError` naming the file on bad input."""
    text = lambda b: b.decode("utf-8", "surrogateescape")  # noqa: E731
    return [
        [
            Component(text(ext), offset, size, unescape_name(text(name)))
            for ext, offset, size, name in idx_fields(path, lineno, line)
        ]
        for lineno, line in enumerate(idx_lines(path), start=2)
    ]


def group_members(members: Iterable[tuple[str, int, int]]) -> list[Sample]:
    """Group ``(name, data_offset, size)`` tar members into samples by key, in order
    (members without a key or an extension are left out: see :func:`scan_tar`)."""
    samples: list[Sample] = []
    last_key = None
    for name, offset, size in members:
        key, ext = split_key(name)
        if not key or key.endswith("/") or not ext:
            continue
        comp = Component(ext, offset, size, name)
        if key != last_key:
            samples.append([comp])
            last_key = key
        else:
            samples[-1].append(comp)
    return samples


def compressed_kind(path: PathLike) -> tuple[str, str] | None:
    """``(kind, decompress command)`` when ``path`` starts with a compressor's magic number."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return None
    return next(((kind, cmd) for magic, kind, cmd in _COMPRESSED if head.startswith(magic)), None)


def _first_nonzero(path: Path, start: int, chunk: int = 1 << 20) -> int | None:
    """Offset of the first non-zero byte at or after ``start`` (None: only zeros follow)."""
    with open(path, "rb") as f:
        f.seek(start)
        while block := f.read(chunk):
            stripped = block.lstrip(b"\0")
            if stripped:
                return start + len(block) - len(stripped)
            start += len(block)
    return None


def _member_kind(m: tarfile.TarInfo) -> str:
    if m.isdir():
        return "directory"
    if m.issym():
        return "symbolic link"
    if m.islnk():
        return "hard link"
    if m.issparse():
        return "sparse file"
    return "not a regular file"


def scan_tar(tar_path: PathLike) -> TarScan:
    """Scan a tar (any writer: webdataset, GNU tar, ...) into samples, with what is wrong.

    Raises:
        TarFormatError: one line naming the file: compressed (and how to decompress it),
            truncated, or not a tar at all.
    """
    tar_path = Path(tar_path)
    kind = compressed_kind(tar_path)
    if kind is not None:
        raise TarFormatError(
            f"{tar_path} is a compressed tar ({kind[0]}): decompress it first "
            f"(e.g. {kind[1]} {tar_path}), then index the .tar"
        )
    members: list[tuple[str, int, int]] = []
    ignored: list[tuple[str, str]] = []
    try:
        size = os.path.getsize(tar_path)
        with tarfile.open(tar_path, "r:") as tar:
            for m in tar:
                if not m.isreg() or m.issparse():
                    ignored.append((m.name, _member_kind(m)))
                    continue
                if m.offset_data + m.size > size:
                    raise TarFormatError(
                        f"{tar_path} is truncated: member {m.name!r} ends past the end of the "
                        "file (copy or download it again)"
                    )
                key, ext = split_key(m.name)
                if not key or key.endswith("/"):
                    ignored.append((m.name, "no sample key (name starts with a dot)"))
                elif not ext:
                    ignored.append((m.name, "no extension"))
                else:
                    members.append((m.name, m.offset_data, m.size))
            end = tar.offset
        # tarfile stops quietly at a damaged header after the first: what follows must be padding
        trailing = _first_nonzero(tar_path, end)
        if trailing is not None:
            raise TarFormatError(
                f"{tar_path} has unreadable data at byte {trailing:,} (a damaged member header, "
                "or tars joined with cat): the samples after it cannot be read; copy or rebuild it"
            )
    except (tarfile.TarError, EOFError) as e:
        raise TarFormatError(f"{tar_path} is not a readable tar ({e}): copy or download it again") from None
    except OSError as e:
        raise TarFormatError(f"cannot read {tar_path}: {e.strerror or e}") from None
    samples = group_members(members)
    problems: dict[int, str] = {}
    for i, sample in enumerate(samples):
        exts = [c.ext.lower() for c in sample]
        repeated = sorted({e for e in exts if exts.count(e) > 1})
        if repeated:
            # e.g. a.jpg a.cls a.jpg a.cls: which image goes with which label is unknowable
            problems[i] = (
                f"repeated component: {len(sample)} members with key {sample_key(sample)!r} "
                f"repeat {', '.join(repeated)}"
            )
    return TarScan(samples, problems, ignored)


def index_tar(tar_path: PathLike) -> list[Sample]:
    """The samples of a tar, as its ``.idx`` lists them (see :func:`scan_tar`).

    Raises:
        TarFormatError: for a compressed, truncated or damaged archive.
    """
    return scan_tar(tar_path).samples
