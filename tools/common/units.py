"""Parsing the values the commands' flags take (sizes, parts), one way for every command."""

from __future__ import annotations

import re

from stoker.errors import UsageError


def parse_size(text: str, flag: str = "--shard-size") -> int:
    """``"256MB"`` / ``"1GB"`` / ``"1.5G"`` / ``"4096"`` -> bytes (decimal units; KiB etc. binary)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)(b?)\s*", text.lower())
    if not m or (m.group(3) and not m.group(2)):
        raise UsageError(f"{flag} {text!r} is not a size like 256MB, 1GB or 1000000")
    base = 1024 if m.group(3) else 1000
    n = int(float(m.group(1)) * base ** " kmgt".index(m.group(2) or " "))
    if n < 1:
        raise UsageError(f"{flag} {text!r} must be positive")
    return n


def parse_part(text: str | None) -> tuple[int, int]:
    if text is None:
        return 0, 1
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise UsageError(f"--part {text!r} should be I/N with 0 <= I < N, e.g. 0/4")
    return int(m.group(1)), int(m.group(2))
