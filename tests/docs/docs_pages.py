"""The code blocks of README.md and docs/*.md, and the ``docs-test`` markers that say how to run
them: the parsing half of the docs tests (``test_docs.py`` runs what this finds).

A page declares what it needs in HTML comments, which neither the site nor GitHub/PyPI render::

    <!-- docs-test: setup: ages, placeholders -->          the page's data and names (docs_setups.py)
    <!-- docs-test: skip: needs a GPU -->                  the next block is not run, and why
    <!-- docs-test: replace: "--epochs 30" -> "--epochs 1": 30 epochs take an hour on a CPU -->
    <!-- docs-test: before: imagenet-script -->            setups run right before the next block

``setup`` holds for the whole page, wherever it stands: its setups run before the page's first
block. ``skip``, ``replace`` and ``before`` stand right above a code block (blank lines and other
markers may come between); ``replace`` runs the block with each OLD text replaced by NEW (each
must occur in the block) and, like ``skip``, says why; ``before`` runs setups just before the
block (the names of the script a fragment belongs to, say).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

#: fence languages run by the docs tests, and the languages of blocks only shown (output, trees)
PYTHON = ("python", "py")
SHELL = ("sh", "bash", "shell", "console")
SHOWN = ("text", "json")

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:(?P<body>.*?)-->\s*$")
_MARKER_START = re.compile(r"^\s*<!--\s*docs-test")
_PAIR = re.compile(r"""\s*(?P<q1>["'])(?P<old>.*?)(?P=q1)\s*->\s*(?P<q2>["'])(?P<new>.*?)(?P=q2)\s*(?P<sep>[,:])""")


@dataclass
class Block:
    """One fenced code block of a page."""

    page: str  #: the page's path relative to the repository root
    line: int  #: the line of the opening fence (1-based)
    lang: str  #: the fence's language ("" when it has none)
    text: str  #: the block's content, dedented to the fence
    skip: str | None = None  #: why it is not run (a ``skip`` marker)
    replace: list[tuple[str, str]] = field(default_factory=list)  #: (old, new) of ``replace`` markers
    replace_reason: str | None = None
    before: list[str] = field(default_factory=list)  #: setups run right before it (``before`` markers)
    problems: list[str] = field(default_factory=list)  #: what is wrong with the block or its markers

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        """Whether the docs tests run it (a python or shell block)."""
        return self.lang in PYTHON or self.lang in SHELL


@dataclass
class Page:
    """A page's code blocks, its setups and the problems of its markers."""

    path: str
    blocks: list[Block]
    setups: list[str]
    problems: list[str]  #: markers that point at nothing, malformed markers (``path:line: ...``)


def parse_page(path: Path, name: str) -> Page:
    """The blocks and markers of the Markdown file ``path`` (``name``: how ids spell it)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    setups: list[str] = []
    problems: list[str] = []
    pending: list[tuple[int, str, str]] = []  # block markers waiting for their block: (line, kind, text)
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            block, i = _read_block(lines, i, fence, name)
            _apply_markers(block, pending)
            pending = []
            blocks.append(block)
            continue
        marker = _MARKER.match(line)
        if marker:
            kind, _, text = marker.group("body").strip().partition(":")
            kind, text = kind.strip(), text.strip()
            if kind == "setup":
                setups += [s.strip() for s in text.split(",") if s.strip()]
                if not text:
                    problems.append(f"{name}:{i + 1}: 'setup:' names no setup")
            elif kind in ("skip", "replace", "before"):
                pending.append((i + 1, kind, text))
            else:
                problems.append(f"{name}:{i + 1}: unknown docs-test marker {kind!r} (setup, skip, replace or before)")
        elif _MARKER_START.match(line):
            problems.append(f"{name}:{i + 1}: a docs-test marker is one line (<!-- docs-test: KIND: TEXT -->)")
        elif line.strip() and pending:
            problems += [
                f"{name}:{n}: the {kind} marker points at no code block (prose follows it)" for n, kind, _ in pending
            ]
            pending = []
        i += 1
    problems += [f"{name}:{n}: the {kind} marker points at no code block (the page ends)" for n, kind, _ in pending]
    return Page(path=name, blocks=blocks, setups=setups, problems=problems)


def _read_block(lines: list[str], start: int, fence: re.Match, name: str) -> tuple[Block, int]:
    """The block opened at ``lines[start]`` and the index after its closing fence."""
    indent, mark = len(fence.group("indent")), fence.group("fence")
    lang = fence.group("info").split()[0].lower() if fence.group("info").strip() else ""
    close = re.compile(rf"^\s*{re.escape(mark[0])}{{{len(mark)},}}\s*$")
    body = []
    i = start + 1
    while i < len(lines) and not close.match(lines[i]):
        text = lines[i]
        body.append(text[min(indent, len(text) - len(text.lstrip(" "))) :])
        i += 1
    block = Block(page=name, line=start + 1, lang=lang, text="\n".join(body) + "\n")
    if i == len(lines):
        block.problems.append(f"{block.id}: the fence is never closed")
    return block, i + 1


def _apply_markers(block: Block, markers: list[tuple[int, str, str]]) -> None:
    for line, kind, text in markers:
        where = f"{block.page}:{line}"
        if not block.runs:
            block.problems.append(f"{where}: a {kind} marker on a {block.lang or 'plain'} block, which is never run")
        elif kind == "skip":
            if not text:
                block.problems.append(f"{where}: 'skip:' needs a reason (<!-- docs-test: skip: needs a GPU -->)")
            block.skip = text or None
        elif kind == "before":
            block.before += [s.strip() for s in text.split(",") if s.strip()]
            if not text:
                block.problems.append(f"{where}: 'before:' names no setup")
        else:
            pairs, reason = _parse_replace(text)
            if not pairs or not reason:
                block.problems.append(
                    f'{where}: write replace markers as <!-- docs-test: replace: "OLD" -> "NEW", ...: WHY -->'
                )
            block.replace += pairs
            block.replace_reason = reason or block.replace_reason
    if block.skip and block.replace:
        block.problems.append(f"{block.id}: both skip and replace markers: a skipped block is not run")


def _parse_replace(text: str) -> tuple[list[tuple[str, str]], str]:
    """``"a" -> "b", "c" -> "d": why`` as ``([(a, b), (c, d)], why)``."""
    pairs = []
    pos = 0
    while True:
        m = _PAIR.match(text, pos)
        if not m:
            return [], ""
        pairs.append((m.group("old"), m.group("new")))
        pos = m.end()
        if m.group("sep") == ":":
            return pairs, text[pos:].strip()


def block_problems(block: Block) -> list[str]:
    """What keeps ``block`` from being run or shown as it is (its markers, its language)."""
    problems = list(block.problems)
    if not block.lang:
        problems.append(
            f"{block.id}: a fence without a language: name it (python, sh, bash, console: run by the tests; "
            f"text, json: shown only)"
        )
    elif not block.runs and block.lang not in SHOWN:
        problems.append(f"{block.id}: fence language {block.lang!r} is neither run ({PYTHON + SHELL}) nor {SHOWN}")
    for old, _ in block.replace:
        if old not in block.text:
            problems.append(f"{block.id}: replace: {old!r} is not in the block (the page changed: update the marker)")
    return problems


def console_script(text: str) -> str:
    """A ``console`` block's commands (its ``$ `` lines); the other lines are their output."""
    return "".join(line[2:] + "\n" for line in text.splitlines() if line.startswith("$ "))
