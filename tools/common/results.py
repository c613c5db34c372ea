"""The base of the commands' result types (:class:`~stoker.tools.bench.loader.BenchResult`, ...)."""

from __future__ import annotations

import dataclasses


class Result:
    """A command's result: a dataclass whose fields, in order, are its ``--json`` output."""

    def to_dict(self) -> dict:
        """The JSON-ready result, as the command's ``--json`` prints it."""
        return dataclasses.asdict(self)
