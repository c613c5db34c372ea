"""Every error stoker raises for something a user can cause or fix, in one place.

Each derives from :class:`StokerError`; its message is one line naming the file (or value)
and what to do, and the ``stoker`` command prints it and exits with :attr:`~StokerError.exit_code`
(2: the request itself is wrong; 1: the request was fine, the data or the run is not) instead
of showing a traceback. Errors that are also a ``ValueError`` (bad values), ``ImportError`` (a
missing extra) or ``RuntimeError`` (a failure while running) say so, so code written against the
builtin kinds keeps catching them.

This module imports nothing heavy: ``from stoker.errors import ...`` is instant.
"""

from __future__ import annotations


def one_line(e: BaseException, *, with_type: bool = False, limit: int = 200) -> str:
    """``e``'s message as one line (whitespace runs, newlines included, become one space), with its
    type's name in front when ``with_type`` (or when it has no message), at most ``limit``
    characters (cut with ``...``): how stoker names another library's failure in its own line."""
    text = " ".join(str(e).split())
    if with_type or not text:
        text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class StokerError(Exception):
    """Base of every error a user can cause or fix: the message is one line that names the
    file (or value) and what to do."""

    #: 2: the request itself is wrong (usage); 1: the request was fine, the data or run is not
    exit_code = 1


# ---- requests and checks (the commands) ---------------------------------------------------
class UsageError(StokerError):
    """The user asked for something impossible (bad path, bad flag value): exit 2."""

    exit_code = 2


class ArgumentError(UsageError, ValueError):
    """A bad argument value (``batch_size=0``, ``crop=(0, 3)``, an unknown backend): a
    ``ValueError`` to Python callers, a one-line usage error (exit 2) to the ``stoker`` command,
    which therefore never re-wraps the library's argument checks."""


class CheckFailedError(StokerError):
    """The command ran but found problems (verify, ``--strict``, a diverging loss): exit 1."""


class InputsRejectedError(CheckFailedError):
    """``strict`` and some inputs were rejected: exit 1. The pack itself is finished: its
    :class:`~stoker.tools.pack.PackResult` is :attr:`result`."""

    def __init__(self, message: str, result):
        super().__init__(message)
        self.result = result


class MostSkippedError(CheckFailedError):
    """``stoker index`` marked most samples to skip: exit 1. The manifest is written: its
    :class:`~stoker.tools.verify.IndexResult` is :attr:`result`."""

    def __init__(self, message: str, result):
        super().__init__(message)
        self.result = result


class WriteFailedError(StokerError):
    """Writing OUT failed (disk full, quota, I/O error): exit 1; what was written is intact."""


class MissingExtraError(StokerError, ImportError):
    """An optional package is not installed: exit 2; the message names the pip extra
    (``pip install stoker[s3]``)."""

    exit_code = 2


# ---- the shard format -----------------------------------------------------------------------
class ManifestError(StokerError, ValueError):
    """A missing, malformed or mismatching manifest or shard."""


class IdxFormatError(StokerError, ValueError):
    """A malformed or mismatching ``.idx`` file."""


class TarFormatError(StokerError, ValueError):
    """A shard that is not a readable uncompressed tar (compressed, truncated, damaged)."""


class TargetError(StokerError, ValueError):
    """A sample whose target is not what its split says (a ``cls`` that is no class index of
    the split, a float target of the wrong width, a mask of the wrong size)."""


# ---- reading: storage, cache, Loader -----------------------------------------------------
class StorageError(StokerError):
    """A storage request failed (unreachable server, access denied, no such bucket): exit 1.
    The message names the URL."""


class StorageOptionError(StokerError, ValueError):
    """A ``--storage-option`` that is not ``KEY=VALUE``: exit 2, the message names it."""

    exit_code = 2


class CacheError(StorageError, RuntimeError):
    """A shard that cannot be fetched, fails its checks, or does not fit the cache disk: exit 1,
    one line naming the shard and its URL."""


class PixelCacheError(StokerError, RuntimeError):
    """The decoded-pixel cache cannot be created or does not fit its disk: exit 1, one line naming
    the folder, the size it needs and the fix (``Loader(pixel_cache=...)``)."""


class LoaderError(StokerError, RuntimeError):
    """A Loader used in a way it cannot serve (an iterator replaced by a newer one)."""


class WorkerDiedError(StokerError, RuntimeError):
    """A worker process died (killed, out of memory, a crash in native code): exit 1, one line
    naming what it was working on, its exit signal and how to resume."""


class NoBatchError(StokerError, ValueError):
    """A batch size larger than a rank's share of the split, with ``drop_last``: no batch at all.
    :attr:`share` is the rank's share (what a batch size must not exceed)."""

    exit_code = 2

    def __init__(self, share: int, message: str):
        super().__init__(message)
        self.share = share


# ---- the model side -------------------------------------------------------------------------
class CheckpointError(StokerError, ValueError):
    """A checkpoint that cannot be used: unreadable, tampered, or for another model. One line."""


class DiagnoseError(StokerError):
    """The measurement cannot go on (e.g. the model does not fit at this batch size)."""


# ---- packing on a cluster -------------------------------------------------------------------
class RayError(StokerError):
    """The Ray cluster could not be reached, or a task failed for good: exit 1."""


class InputFailedError(StokerError):
    """Raised in a pack task: sanitizing ``path`` raised (``why``); crosses back to the driver."""

    def __init__(self, path: str, why: str):
        super().__init__(path, why)
        self.path, self.why = path, why


__all__ = [
    "CacheError",
    "CheckFailedError",
    "CheckpointError",
    "DiagnoseError",
    "IdxFormatError",
    "InputFailedError",
    "InputsRejectedError",
    "LoaderError",
    "ManifestError",
    "MissingExtraError",
    "MostSkippedError",
    "NoBatchError",
    "PixelCacheError",
    "RayError",
    "StokerError",
    "StorageError",
    "StorageOptionError",
    "TarFormatError",
    "TargetError",
    "UsageError",
    "WorkerDiedError",
    "WriteFailedError",
    "one_line",
]
