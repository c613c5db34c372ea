"""What a ``stoker pack`` in progress keeps in OUT, read by its documented file names, so the read
side can say a split is unfinished instead of serving part of it (``stoker pack`` writes them:
:mod:`stoker.tools.pack.journal`)::

    OUT/.stoker-pack/settings.json         what is being packed: "parts", "splits"
    OUT/.stoker-pack/<split>-p<I>of<N>.jsonl one line per finished shard; the last {"done": true, ...}

A split is unfinished while OUT holds this state and the split's manifest is missing or one of
its part journals does not end with ``done``.
"""

from __future__ import annotations

import json
from pathlib import Path

#: the folder of a pack's settings and journals, under OUT
PACK_STATE_DIR = ".stoker-pack"
SETTINGS_NAME = "settings.json"


def journal_name(split: str, part: int, parts: int) -> str:
    """The journal file of one (split, part): ``train-p0of1.jsonl``."""
    return f"{split}-p{part}of{parts}.jsonl"


def _done(journal: Path) -> bool:
    try:
        lines = journal.read_bytes().splitlines()
        return bool(lines) and bool(json.loads(lines[-1]).get("done"))
    except (OSError, ValueError, AttributeError):
        return False  # missing, or a torn last line: not finished


def unfinished_pack(split_dir: Path) -> str | None:
    """Why ``split_dir`` (a split of a pack's OUT, or OUT itself) is a pack in progress or stopped,
    and the command that finishes it; None when no pack journal says so."""
    split_dir = Path(split_dir)
    for out, split in ((split_dir.parent, split_dir.name), (split_dir, None)):
        try:
            settings = json.loads((out / PACK_STATE_DIR / SETTINGS_NAME).read_text())
            parts, splits = int(settings["parts"]), list(settings["splits"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if split is not None and split not in splits:
            continue
        names = [split] if split is not None else splits
        manifests = all((out / s / "stoker.json").is_file() for s in names)
        done = all(_done(out / PACK_STATE_DIR / journal_name(s, p, parts)) for s in names for p in range(parts))
        if manifests and done:
            return None
        if parts == 1:
            return (
                f"a stoker pack into {out} is in progress or was stopped: rerun the same `stoker pack` "
                "command to finish it"
            )
        if done:
            return (
                f"every --part of the stoker pack into {out} is finished: run `stoker pack --merge {out}` to finish it"
            )
        return (
            f"a stoker pack --part I/{parts} into {out} is in progress or was stopped: rerun the same "
            f"`stoker pack` commands until every part is finished, then `stoker pack --merge {out}`"
        )
    return None


__all__ = ["PACK_STATE_DIR", "SETTINGS_NAME", "journal_name", "unfinished_pack"]
