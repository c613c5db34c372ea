"""DALI's WebDataset index format (``.idx``), written and read.

The format is what DALI's ``wds2idx`` writes: a first line ``v1.2 <num_samples>``,
then one line per sample listing each component as ``<ext> <offset> <size> <name>``,
where ``offset`` is the byte offset of the member's data (after its 512-byte header).
Components of a sample are consecutive tar members sharing a key: the member name up
to the first dot of its basename (WebDataset's rule).
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Sequence

from stoker import StokerError

from .fsutil import PathLike, atomic_write

IDX_VERSION = "v1.2"
#: component names (case-insensitive) read as a sample's image: what the loader decodes
IMAGE_EXTS = ("jpg", "jpeg", "png")


class IdxFormatError(StokerError, ValueError):
    """A malformed or mismatching ``.idx`` file."""


@dataclass(frozen=True)
class Component:
    ext: str
    offset: int
    size: int
    name: str


Sample = List[Component]


def split_key(name: str) -> tuple[str, str]:
    """``"dir/abc.seg.jpg"`` → ``("dir/abc", "seg.jpg")`` (WebDataset's key rule)."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def sample_key(sample: Sample) -> str:
    return split_key(sample[0].name)[0]


def format_idx(samples: Sequence[Sample]) -> str:
    lines = [f"{IDX_VERSION} {len(samples)}"]
    for sample in samples:
        lines.append(" ".join(f"{c.ext} {c.offset} {c.size} {c.name}" for c in sample))
    return "\n".join(lines) + "\n"


def write_idx(path: PathLike, samples: Sequence[Sample]) -> None:
    """Write an ``.idx`` atomically."""
    with atomic_write(path, "w") as f:
        f.write(format_idx(samples))


def read_idx(path: PathLike) -> list[Sample]:
    """Parse an ``.idx`` file; raise :class:`IdxFormatError` naming the file on bad input."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise IdxFormatError(f"cannot read index {path}: {e.strerror}") from None
    lines = text.splitlines()
    if not lines:
        raise IdxFormatError(f"index {path} is empty")
    head = lines[0].split()
    if len(head) != 2 or head[0] != IDX_VERSION or not head[1].isdigit():
        raise IdxFormatError(f"index {path}: first line should be '{IDX_VERSION} <count>', got {lines[0]!r}")
    samples: list[Sample] = []
    for lineno, line in enumerate(lines[1:], start=2):
        fields = line.split()
        if not fields or len(fields) % 4:
            raise IdxFormatError(f"index {path} line {lineno}: expected groups of 'ext offset size name'")
        try:
            samples.append(
                [
                    Component(fields[i], int(fields[i + 1]), int(fields[i + 2]), fields[i + 3])
                    for i in range(0, len(fields), 4)
                ]
            )
        except ValueError:
            raise IdxFormatError(f"index {path} line {lineno}: offset/size are not integers") from None
    if len(samples) != int(head[1]):
        raise IdxFormatError(f"index {path} declares {head[1]} samples but lists {len(samples)}")
    return samples


def group_members(members: Iterable[tuple[str, int, int]]) -> list[Sample]:
    """Group ``(name, data_offset, size)`` tar members into samples by key, in order."""
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


def index_tar(tar_path: PathLike) -> list[Sample]:
    """Scan a tar (any writer: webdataset, GNU tar, ...) and return its samples.

    Raises :class:`tarfile.TarError` for a damaged archive.
    """
    members = []
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            if m.isreg():
                members.append((m.name, m.offset_data, m.size))
    return group_members(members)
