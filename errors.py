"""Every error stoker raises for something a user can cause or fix, in one place.

Each derives from :class:`StokerError`; its message is one line naming the file (or value)
and what to do, and the ``stoker`` command prints it and exits with :attr:`~StokerError.exit_code`
(2: the request itself is wrong; 1: the request was fine, the data or the run is not) instead
of showing a traceback. Errors that are also a ``ValueError`` (bad values), ``ImportError`` (a
missing extra) or ``RuntimeError`` (a failure while running) say so, so code written against the
builtin kinds keeps catching them.

A message names the arguments it is about with :func:`arg`: Python callers read the Python
spelling (``workers must be >= 1``; a field of an options object as ``Shards.size``), the
``stoker`` command prints the command's own flag (``--workers must be >= 1``), from its parser
(:meth:`StokerError.spelled`).

This module imports nothing heavy: ``from stoker.errors import ...`` is instant.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence

# An argument named in a message: MARK name [ALIAS python] [SEP repr(value) SEP str(value)] MARK.
# Control characters no user text holds, so the command rewrites exactly the marked names, never prose.
_MARK, _SEP, _ALIAS = "\x1f", "\x1e", "\x1d"
_MARKED = re.compile("\x1f([^\x1d\x1e\x1f]+)(?:\x1d([^\x1d\x1e\x1f]+))?(?:\x1e([^\x1e\x1f]*)\x1e([^\x1e\x1f]*))?\x1f")
_NO_VALUE = object()


def arg(name: str, value: object = _NO_VALUE, *, python: str | None = None) -> str:
    """Name the Python argument ``name`` (with its ``value``) in a :class:`StokerError` message.

    Python callers read ``name`` (``name='value'``); the ``stoker`` command reads the flag of its
    own that sets ``name`` (``--name value``, ``SRC value`` for a positional). ``python`` is what
    Python callers read instead when the setting is not a keyword of its own but a field of an
    options object: ``Shards.size`` (with a value: ``Shards(size=0)``); the command still reads
    the flag of ``name``.

    Example:
        ``UsageError(f"{arg('workers')} must be >= 1, got {workers}")``
    """
    alias = "" if python is None else f"{_ALIAS}{python}"
    if value is _NO_VALUE:
        return f"{_MARK}{name}{alias}{_MARK}"
    return f"{_MARK}{name}{alias}{_SEP}{value!r}{_SEP}{value}{_MARK}"


def _python_spelling(name: str, value: str | None) -> str:
    """``name`` (``name=value``), or for a field ``Group.field``: itself (``Group(field=value)``)."""
    if value is None:
        return name
    group, dot, field = name.rpartition(".")
    return f"{group}({field}={value})" if dot else f"{name}={value}"


def _spell(marked: str, flag: Callable[[str], str | None]) -> str:
    """``marked`` with each :func:`arg` as ``flag(name)`` (its Python spelling where that is None)."""

    def one(m: re.Match) -> str:
        name, python, python_value, value = m.groups()
        spelled = flag(name)
        if spelled is None:
            return _python_spelling(python or name, python_value)
        return spelled if value is None else f"{spelled} {value}"

    return _MARKED.sub(one, marked)


def one_line(e: BaseException, *, with_type: bool = False, limit: int = 200) -> str:
    """``e``'s message as one line (whitespace runs, newlines included, become one space), with its
    type's name in front when ``with_type`` (or when it has no message), at most ``limit``
    characters (cut with ``...``): how stoker names another library's failure in its own line."""
    text = " ".join(str(e).split())
    if with_type or not text:
        text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _folded(name: str) -> str:
    return name.lower().lstrip("-").replace("-", "").replace("_", "")


def close_names(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The ``choices`` a mistyped ``name`` most likely meant, best first (none when nothing is close):
    ``--batchsize`` -> ``--batch-size``, ``resnet-18`` -> ``resnet18``, ``--epoch`` -> ``--epochs``.
    Case, dashes and underscores are ignored; the rest is :func:`difflib.get_close_matches`."""
    import difflib

    by_folded: dict[str, str] = {}
    for choice in choices:
        by_folded.setdefault(_folded(choice), choice)
    if _folded(name) in by_folded:
        return [by_folded[_folded(name)]]
    return [by_folded[f] for f in difflib.get_close_matches(_folded(name), list(by_folded), n=n, cutoff=0.6)]


def unknown_choice(what: str, name: str, choices: Sequence[str], *, listed: int = 12) -> str:
    """The one line of a ``name`` that is none of ``choices``: the close ones first (``unknown arch
    'resnet-18': did you mean resnet18?``), every choice when there are at most ``listed``, else
    how many there are and where to see them, not a wall of 80 names."""
    close = close_names(name, choices)
    text = f"unknown {what} {name!r}"
    if close:
        text += f": did you mean {' or '.join([', '.join(close[:-1]), close[-1]] if len(close) > 1 else close)}?"
    if len(choices) <= listed:
        return text + f" (choose from {', '.join(choices)})"
    if close:
        return text
    return text + f": none of the {len(choices)} names is close (e.g. {', '.join(choices[:6])}, ...)"


class StokerError(Exception):
    """Base of every error a user can cause or fix: the message is one line that names the
    file (or value) and what to do."""

    #: 2: the request itself is wrong (usage); 1: the request was fine, the data or run is not
    exit_code = 1

    def __init__(self, *args):
        if args and isinstance(args[0], str) and _MARK in args[0]:
            self._marked = args[0]  # kept for spelled(); a pickled copy keeps it (in __dict__)
            args = (_spell(args[0], lambda name: None), *args[1:])
        super().__init__(*args)

    def spelled(self, flag: Callable[[str], str | None]) -> str:
        """The message with the arguments it names (:func:`arg`) spelled ``flag(name)``: how the
        ``stoker`` command names its flags. A name ``flag`` returns None for keeps its Python
        spelling."""
        marked = getattr(self, "_marked", None)
        return str(self) if marked is None else _spell(marked, flag)


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


class ShardChangedError(ManifestError):
    """A shard truncated or rewritten while a Loader read it (a ``cp`` over it mid-epoch): one line
    naming it, on every backend, never a SIGBUS."""


class NotPackedError(UsageError, ManifestError):
    """A path given where packed data is expected that holds none: it does not exist, holds images
    (pack them) or tars (index them), is a pack's root where a split is expected (or the other way
    round), or a pack into it is unfinished. Exit 2; the same line in every command
    (:mod:`stoker.pipeline.shards.paths`)."""


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
    "ShardChangedError",
    "MissingExtraError",
    "MostSkippedError",
    "NotPackedError",
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
    "arg",
    "close_names",
    "one_line",
    "unknown_choice",
]
