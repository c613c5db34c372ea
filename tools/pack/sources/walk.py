"""Walking folders for the folder readers (ImageFolder, ``train/``+``val/``, mask trees).

* Symlinks are followed, but each real folder and each real file (by the sources' one identity
  rule, :func:`~.base.input_identity`: ``st_dev, st_ino``) is walked and packed once, across the
  classes and the splits of SRC. A link back up to the class folder's parent, the
  split folder or any folder above it (``cls/loop -> ..``) is not followed: reject
  ``"symlink loop to <target>: not followed"``. A link (to a folder or file) that lands
  inside another class's folder is not followed either (its images would get the wrong
  label): reject ``"link into class '<name>': not followed"``; nor one from ``train/``
  into ``val/`` (or back): reject ``"link into val/: not followed"``. A folder or file reached
  again (a hard link, a second link to one file or folder) is packed where it was met first (the
  first class in sorted order, train before val); the later one is rejected ``"same file as
  <path>"``, with ``" (class '<name>')"`` when the first is in another class.
* Unreadable folders and dangling links are rejects (``"unreadable folder: <error>"``,
  ``"broken symlink"``). FIFOs, sockets and devices with an image name are rejects
  ``"not a regular file (<kind>)"``; they are never opened.
* File names that are not valid UTF-8 are packed. Inside the pack (sample ``json``,
  ``rejects.jsonl``) their name is written with each undecodable byte as ``\\xNN``
  (:func:`~.base.display_path`), so every file stoker writes is valid UTF-8.
* Hidden files (``.*``, ``__MACOSX``) and files without an image extension are counted as skipped;
  hidden folders are not walked, and named in the pack's summary (:attr:`~.base.Scan.hidden`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stoker.errors import UsageError

from ..sanitize import IMAGE_EXTS
from .base import FirstSeen, display_path, same_file, stat_identity


def hidden(name: str) -> bool:
    return name.startswith(".") or name == "__MACOSX"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return name
    return "special file"


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class Seen:
    """The folders and files a walk met (by :func:`~.base.input_identity`), with the class and
    path each was met at first; shared by the walks of one SRC's splits."""

    def __init__(self, files_once: bool = True) -> None:
        self.dirs, self.files, self.files_once = FirstSeen(), FirstSeen(), files_once


class Walker:
    """Walks the class folders of one split (see the module docstring for the rules).

    Args:
        seen: what the walks of SRC's other splits met (a file reached from train and from val is
            packed once); None: this walk's own. ``Seen(files_once=False)`` walks a mask tree,
            whose masks may serve several images.
    """

    def __init__(
        self,
        root: Path,
        split_root: Path,
        class_names: list[str],
        skipped: list[int],
        other_splits: tuple[Path, ...] = (),
        seen: Seen | None = None,
    ):
        self.root, self.split_root, self.skipped = root, split_root, skipped
        self.split_real = os.path.realpath(split_root)
        self.other_real = {p.name: os.path.realpath(p) for p in other_splits}
        self.class_real = {c: os.path.realpath(split_root / c) for c in class_names}
        self.seen = seen if seen is not None else Seen()
        self.rejects: list[tuple[str, str]] = []
        #: hidden folders not walked, relative to root with a trailing ``/``
        self.hidden: list[str] = []

    def rel(self, path: str) -> str:
        return Path(os.path.relpath(path, self.root)).as_posix()

    def reject(self, path: str, reason: str) -> None:
        self.rejects.append((display_path(self.rel(path)), reason))

    def _link_target_ok(self, path: str, cls: str) -> bool:
        """For a symlink: False (and a reject) when it loops up or lands in another class."""
        target = os.path.realpath(path)
        if _inside(self.split_real, target):
            self.reject(path, f"symlink loop to {display_path(target)}: not followed")
            return False
        for other, real in self.class_real.items():
            if other != cls and _inside(target, real) and not _inside(target, self.class_real[cls]):
                self.reject(path, f"link into class {other!r}: not followed")
                return False
        for split, real in self.other_real.items():  # train/x -> ../../val/x would leak val into train
            if _inside(target, real):
                self.reject(path, f"link into {split}/: not followed")
                return False
        return True

    def _seen(self, table: FirstSeen, key: tuple, cls: str, path: str, rel: str | None = None) -> bool:
        """True (and a reject naming the first) when ``key`` was met before. ``rel``: ``path``
        relative to root, if known."""
        if table is self.seen.files and not self.seen.files_once:
            return False
        first = table.first(key, (cls, rel or self.rel(path)))
        if first is None:
            return False
        self.reject(path, same_file(first[1], f"class {first[0]!r}" if first[0] != cls else ""))
        return True

    def walk(self, cls: str) -> list[str]:
        """Image paths (relative to root) of class ``cls``, sorted depth-first."""
        out: list[str] = []
        top = str(self.split_root / cls)
        try:
            st = os.stat(top)
        except OSError as e:
            self.reject(top, f"unreadable folder: {e.strerror}")
            return out
        if os.path.islink(top) and not self._link_target_ok(top, cls):  # a class folder linked to SRC itself
            return out
        if self._seen(self.seen.dirs, stat_identity(st.st_dev, st.st_ino), cls, top):
            return out
        self._walk_dir(top, self.rel(top), st.st_dev, cls, out)
        return out

    def _walk_dir(self, folder: str, rel: str, dev: int, cls: str, out: list[str]) -> None:
        stack = [(folder, rel, dev)]
        while stack:
            d, drel, ddev = stack.pop()
            try:
                with os.scandir(d) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as e:
                self.reject(d, f"unreadable folder: {e.strerror}")
                continue
            subdirs = []
            for e in entries:
                erel = e.name if drel == "." else f"{drel}/{e.name}"
                if hidden(e.name):
                    if is_dir(e):
                        self.hidden.append(display_path(erel) + "/")
                    else:
                        self.skipped[0] += 1
                    continue
                try:
                    if e.is_file(follow_symlinks=False):  # the common case: no stat (d_type, d_ino)
                        if os.path.splitext(e.name)[1].lower() not in IMAGE_EXTS:
                            self.skipped[0] += 1
                        elif not self._seen(self.seen.files, stat_identity(ddev, e.inode()), cls, e.path, erel):
                            out.append(erel)
                        continue
                    link = e.is_symlink()
                    st = os.stat(e.path)  # follows links
                except OSError as ex:
                    self.reject(e.path, "broken symlink" if e.is_symlink() else f"unreadable: {ex.strerror}")
                    continue
                if link and not self._link_target_ok(e.path, cls):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if not self._seen(self.seen.dirs, stat_identity(st.st_dev, st.st_ino), cls, e.path, erel):
                        subdirs.append((e.path, erel, st.st_dev))
                    continue
                if os.path.splitext(e.name)[1].lower() not in IMAGE_EXTS:
                    self.skipped[0] += 1
                    continue
                if not stat.S_ISREG(st.st_mode):
                    self.reject(e.path, f"not a regular file ({_kind(st.st_mode)})")
                    continue
                if not self._seen(self.seen.files, stat_identity(st.st_dev, st.st_ino), cls, e.path, erel):
                    out.append(erel)
            stack.extend(reversed(subdirs))  # popped in sorted order


def scandir_sorted(root: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(root) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as e:
        raise UsageError(f"cannot read folder {display_path(str(root))}: {e.strerror}; check its permissions") from None


def is_dir(e: os.DirEntry) -> bool:
    try:
        return e.is_dir()
    except OSError:
        return False


def class_dirs(root: Path) -> list[str]:
    return [e.name for e in scandir_sorted(root) if not hidden(e.name) and is_dir(e)]


def hidden_dirs(root: Path, prefix: str = "") -> list[str]:
    """The hidden folders directly in ``root`` (``.git``, ``.ipynb_checkpoints``, ``__MACOSX``),
    as ``<prefix><name>/``: never walked, and named in the pack's summary."""
    return [display_path(f"{prefix}{e.name}") + "/" for e in scandir_sorted(root) if hidden(e.name) and is_dir(e)]


def loose_files(root: Path) -> int:
    """Files directly in a folder that should hold only class folders (skipped)."""
    return sum(1 for e in scandir_sorted(root) if not is_dir(e))


def walk_tree(
    root: Path,
    split_root: Path,
    skipped: list[int],
    rejects: list,
    others: tuple,
    seen: Seen | None = None,
    hidden: list[str] | None = None,
) -> list[str]:
    """Every image under ``split_root`` at any depth (relative to ``root``), by the walk's rules;
    the hidden folders left out are appended to ``hidden``."""
    walker = Walker(root, split_root, [""], skipped, others, seen)
    found = walker.walk("")
    rejects.extend(walker.rejects)
    if hidden is not None:
        hidden.extend(walker.hidden)
    return found
