"""Errors the ``stoker`` command turns into one line instead of a traceback."""

from stoker import StokerError


class UsageError(StokerError):
    """The user asked for something impossible (bad path, bad flag value): exit 2."""

    exit_code = 2


class CheckFailed(StokerError):
    """The command ran but found problems (verify, --strict, a diverging loss): exit 1."""

    exit_code = 1


__all__ = ["StokerError", "UsageError", "CheckFailed"]
