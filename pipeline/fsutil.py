"""Small filesystem helpers shared by the rooms: atomic writes, hashing."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Union

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_write(path: PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Open ``path.<pid>-<thread>.tmp`` for writing (text modes with ``encoding``) and rename
    it over ``path`` on success.

    A crash or kill leaves at most a ``.tmp`` file, never a partial ``path``. The temporary
    name is the writer's own, so processes writing the same file at once (ranks sharing a
    shard cache) never rename each other's file away.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if e.filename is None:  # name the file (e.g. ENOSPC from write/fsync carries none)
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def sha256_file(path: PathLike, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
