"""One message per wrong path, the same in every command and in the Loader.

A path given where packed data is expected is told apart in one place: it does not exist, it is a
file, a ``stoker pack`` into it is in progress or was stopped (:func:`.packstate.unfinished_pack`),
it is a pack's root where a split is expected (``did you mean OUT/train?``) or a split where the
root is (``did you mean OUT?``), it holds images (pack them) or tars (index them). What each
command takes is its ``expect``:

=========  ========================================================  ==============================
expect     a right path                                              who
=========  ========================================================  ==============================
split      holds ``stoker.json``                                     ``Loader``, ``Manifest.load``
pack       holds ``stoker.json``, or a subfolder holding one         ``verify``, ``bench``
root       its ``train/`` holds ``stoker.json``                      ``train``
any        exists, and no pack into it is unfinished                 ``diagnose`` (images too), ``index`` (tars)
=========  ========================================================  ==============================
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from stoker.errors import NotPackedError

from ..fsutil import PathLike
from ..storage import is_url
from .packstate import unfinished_pack

#: the manifest of a split (:mod:`.manifest`), named here so that module can use this one
MANIFEST_NAME = "stoker.json"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif")

Expect = Literal["split", "pack", "root", "any"]


def path_problem(path: PathLike, expect: Expect = "split") -> str | None:
    """The one line saying why ``path`` is not what a command that takes ``expect`` needs (see the
    module doc), or None when it is (a URL: its store says what is missing)."""
    if is_url(path):
        return None
    path = Path(path)
    if _fits(path, expect):
        return None
    unfinished = unfinished_pack(path)
    if unfinished:
        return unfinished
    if not path.exists():
        return f"{path} does not exist"
    if expect == "any":
        return None
    if not path.is_dir():
        return f"{path} is a file, not a folder of packed shards (a stoker pack's OUT, or its train/ or val/)"
    if expect == "root" and (path / MANIFEST_NAME).is_file():
        return f"{path} is a split; give the folder that holds train/ (and val/): did you mean {path.parent}?"
    if expect == "split" and (path / "train" / MANIFEST_NAME).is_file():
        return f"no {MANIFEST_NAME} in {path} (did you mean {path / 'train'}?)"
    found = contents_problem(path)
    if found:
        return found
    if expect == "root":
        return f"no train/ split in {path}: pack a dataset into it with `stoker pack SRC {path}`"
    return f"no {MANIFEST_NAME} in {path}: pack it with `stoker pack` or index it with `stoker index`"


def check_path(path: PathLike, expect: Expect = "split") -> None:
    """:func:`path_problem` as an error: :class:`~stoker.errors.NotPackedError` (exit 2)."""
    problem = path_problem(path, expect)
    if problem:
        raise NotPackedError(problem)


def _fits(path: Path, expect: Expect) -> bool:
    if expect == "split":
        return (path / MANIFEST_NAME).is_file()
    if expect == "root":
        return (path / "train" / MANIFEST_NAME).is_file()
    if expect == "pack":
        return (path / MANIFEST_NAME).is_file() or (path.is_dir() and any(path.glob(f"*/{MANIFEST_NAME}")))
    return path.exists() and unfinished_pack(path) is None


def contents_problem(folder: Path) -> str | None:
    """What a folder holding no split holds instead: tars (index them), images or a tree of them
    (pack them); None when neither."""
    images, tars = 0, 0
    for k, entry in enumerate(os.scandir(folder)):
        if k >= 2000:  # enough to tell
            break
        name = entry.name.lower()
        if entry.is_dir(follow_symlinks=False):
            with os.scandir(entry.path) as inner:
                for _, e in zip(range(50), inner, strict=False):
                    if e.name.lower().endswith(IMAGE_SUFFIXES):
                        images += 1
                        break
                    if e.is_dir(follow_symlinks=False) and entry.name in ("train", "val"):  # train/<class>/
                        images += _holds_images(Path(e.path))
        images += name.endswith(IMAGE_SUFFIXES)
        tars += name.endswith(".tar")
    if tars:
        return f"no {MANIFEST_NAME} in {folder}: it holds tars; make them loadable with `stoker index {folder}`"
    if images:
        return (
            f"{folder} is an image folder, not packed shards: run `stoker pack {folder} OUT` "
            "(its splits: OUT/train, OUT/val)"
        )
    return None


def _holds_images(folder: Path) -> bool:
    with os.scandir(folder) as entries:
        return any(e.name.lower().endswith(IMAGE_SUFFIXES) for _, e in zip(range(50), entries, strict=False))


__all__ = ["IMAGE_SUFFIXES", "MANIFEST_NAME", "check_path", "contents_problem", "path_problem"]
