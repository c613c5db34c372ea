"""Package attributes imported on first use (PEP 562): ``stoker``, ``stoker.pipeline``, ``stoker.model``
and ``stoker.model.train`` name their public API without importing torch or DALI until it is used
(``stoker --help`` stays instant, a torch-free submodule loads without torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a name to the submodule defining it
    (relative to ``package``: ``"loader"``, ``"pipeline.loader"``)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{exports[name]}", package), name)
        setattr(sys.modules[package], name, value)  # once: later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
