"""Errors the ``stoker`` command turns into one line instead of a traceback."""


class UsageError(Exception):
    """The user asked for something impossible (bad path, bad flag value): exit 2."""


class CheckFailed(Exception):
    """The command ran but found problems (verify, --strict): exit 1."""
