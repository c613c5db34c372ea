"""``stoker.json``: the per-split manifest that describes a set of shards.

The loader sizes epochs from it without opening a tar; ``stoker verify`` checks
shards against it.

Format 1 is a split of class-labelled images; format 2 adds the ``target`` of other sample
kinds (:mod:`.targets`: float, multi-label, mask); format 3 keeps the samples to skip in a file
of their own (``skips.jsonl``, named by ``pack.skip_file``) instead of ``pack.skip``, which
``stoker index`` does past :data:`INLINE_SKIPS` of them, so no reader parses a long list with the
manifest (an older stoker, which would not see them, refuses format 3). A split is written in the
oldest format that holds it, so an older stoker reads it; a newer format than this stoker knows
is a one-line error.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stoker.errors import ManifestError
from stoker.version import __version__

from ..fsutil import PathLike, atomic_write, sha256_file
from .paths import MANIFEST_NAME, check_path
from .targets import Target

#: the newest format this stoker reads and writes
FORMAT_VERSION = 3
#: the samples to skip, one ``[shard, index, reason]`` JSON list a line, when the manifest names it
SKIP_FILE = "skips.jsonl"
#: the most skips ``pack.skip`` holds; more go to :data:`SKIP_FILE`
INLINE_SKIPS = 10_000


@dataclass
class ShardInfo:
    name: str
    num_samples: int
    bytes: int
    sha256: str


@dataclass
class Manifest:
    num_samples: int
    classes: list[str]
    shards: list[ShardInfo]
    pack: dict[str, Any] = field(default_factory=dict)
    target: Target = field(default_factory=Target)

    @property
    def format(self) -> int:
        """The format it is recorded in: 1 for a class split (what every stoker reads), 2 for the
        other kinds (:attr:`.kinds.Target.format`), 3 when the skips are in :data:`SKIP_FILE`."""
        if self.pack.get("skip_file"):
            return 3
        return self.target.format

    def to_json(self) -> str:
        d = asdict(self)
        ordered = {"format": self.format, **{k: d[k] for k in ("num_samples", "classes")}}
        if self.format >= 2:
            ordered["target"] = self.target.to_json()
        ordered.update(shards=d["shards"], pack=d["pack"])
        return json.dumps(ordered, indent=1, sort_keys=False) + "\n"

    def save(self, split_dir: PathLike) -> Path:
        path = Path(split_dir) / MANIFEST_NAME
        with atomic_write(path, "w") as f:
            f.write(self.to_json())
        return path

    @classmethod
    def load(cls, split_dir: PathLike) -> Manifest:
        split_dir = Path(split_dir)
        path = split_dir / MANIFEST_NAME if split_dir.is_dir() or not split_dir.name.endswith(".json") else split_dir
        if not path.exists():
            check_path(split_dir, "split")
            raise ManifestError(f"no {MANIFEST_NAME} in {split_dir}")  # a race: it was there a moment ago
        try:
            d = json.loads(path.read_text())
            fmt = d.get("format")
            if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT_VERSION:
                raise ManifestError(
                    f"{path} is format {fmt}, written by a newer stoker; this one ({__version__}) reads "
                    f"formats 1 to {FORMAT_VERSION}: upgrade stoker (pip install -U stoker)"
                )
            if fmt not in (1, 2, 3):
                raise ManifestError(f"{path}: format {fmt!r} is not a stoker manifest format (1 to {FORMAT_VERSION})")
            shards = [ShardInfo(**s) for s in d["shards"]]
            m = cls(
                num_samples=int(d["num_samples"]),
                classes=list(d["classes"]),
                shards=shards,
                pack=dict(d.get("pack", {})),
                target=Target.from_json(d["target"]) if fmt >= 2 else Target(),
            )
        except ManifestError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise ManifestError(f"{path} is not a valid stoker manifest: {e}") from None
        if sum(s.num_samples for s in m.shards) != m.num_samples:
            raise ManifestError(f"{path}: shard counts do not add up to num_samples={m.num_samples}")
        return m


def iter_skips(split_dir: PathLike, manifest: Manifest) -> Iterator:
    """The manifest's skip entries (``[shard, index, reason]``, or a position or key), from
    ``pack.skip`` or the file ``pack.skip_file`` names.

    Raises:
        ManifestError: the skip file is missing or damaged; names it.
    """
    name = manifest.pack.get("skip_file")
    if not name:
        yield from manifest.pack.get("skip") or []
        return
    path = Path(split_dir) / name
    try:
        f = open(path, encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(
            f"{path} is missing: the manifest's skips are in it (rerun `stoker index {split_dir}`)"
        ) from None
    with f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                raise ManifestError(f"{path}: line {n} is not JSON (rerun `stoker index {split_dir}`)") from None
            yield entry


def write_skips(split_dir: PathLike, pack: dict, skip: list) -> None:
    """Put ``skip`` into ``pack`` (``pack.skip``), or past :data:`INLINE_SKIPS` entries into
    :data:`SKIP_FILE` beside the manifest (``pack.skip_file``; a manifest of format 3)."""
    split_dir = Path(split_dir)
    pack.pop("skip_file", None)
    if len(skip) <= INLINE_SKIPS:
        pack["skip"] = skip
        with contextlib.suppress(FileNotFoundError):
            (split_dir / SKIP_FILE).unlink()  # a long list an earlier index wrote
        return
    with atomic_write(split_dir / SKIP_FILE, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in skip)
    pack.pop("skip", None)
    pack.update(skip_file=SKIP_FILE, skipped_count=len(skip))


def idx_name(tar_path: str) -> str:
    """:func:`idx_path` of a plain string, without pathlib's cost (per shard, on every start)."""
    start = tar_path.rfind("/") + 1
    dot = tar_path.rfind(".", start)
    return f"{tar_path[:dot]}.idx" if start < dot < len(tar_path) - 1 else f"{tar_path}.idx"


def idx_path(tar_path: PathLike) -> Path:
    """``x/train-000001.tar`` → ``x/train-000001.idx``."""
    p = Path(tar_path)
    return p.with_suffix(".idx")


def check_shards(split_dir: PathLike, manifest: Manifest, *, sha256: bool = False) -> None:
    """Raise :class:`ManifestError` naming the first shard that is missing, has the
    wrong size, lacks its ``.idx`` or (with ``sha256=True``) fails its checksum."""
    split_dir = Path(split_dir)
    base = str(split_dir)
    for s in manifest.shards:  # plain strings: a split may have 100,000s of shards
        tar = os.path.join(base, s.name)
        try:
            size = os.path.getsize(tar)
        except OSError:
            raise ManifestError(f"shard {tar} is missing") from None
        if size != s.bytes:
            raise ManifestError(f"shard {tar} has {size} bytes, manifest says {s.bytes} (truncated or replaced?)")
        if not os.path.exists(idx_name(tar)):
            raise ManifestError(f"index {idx_path(tar)} is missing (run `stoker index {tar}`)")
        if sha256 and sha256_file(tar) != s.sha256:
            raise ManifestError(f"shard {tar} fails its sha256 check (corrupt or replaced)")
