"""Crash-safe bookkeeping of ``stoker pack``: the settings of a pack, one progress
journal per (split, part), and the merge that turns finished journals into the
manifests and ``rejects.jsonl``.

Layout under OUT::

    .stoker-pack/settings.json          what is being packed (written once)
    .stoker-pack/train-p0of1.jsonl      one line per finished shard, then {"done": ...}

A journal line is appended and fsynced right after its shard was renamed into
place, so after a crash the journal says exactly which shards are complete and
where in the input list to continue. Lines hold no timestamps: an interrupted and
an uninterrupted run leave identical files.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stoker.errors import UsageError
from stoker.pipeline.fsutil import atomic_write
from stoker.pipeline.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, idx_path
from stoker.pipeline.shards.packstate import PACK_STATE_DIR, SETTINGS_NAME, journal_name
from stoker.pipeline.shards.targets import StatsAccumulator, Target

STATE_DIR = PACK_STATE_DIR  # named once, in pipeline/shards: the Loader reads it too
REJECTS_NAME = "rejects.jsonl"


def state_dir(out: Path) -> Path:
    return out / STATE_DIR


def journal_path(out: Path, split: str, part: int, parts: int) -> Path:
    return state_dir(out) / journal_name(split, part, parts)


def read_settings(out: Path) -> dict | None:
    path = state_dir(out) / SETTINGS_NAME
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        raise UsageError(f"{path} is damaged; remove {state_dir(out)} and the shards to start over") from None


def claim(out: Path, settings: dict) -> None:
    """Record ``settings`` as OUT's pack, or check they match the recorded ones.

    Raises UsageError when OUT holds a different pack, or holds files that are not a
    stoker pack at all.
    """
    old = read_settings(out)
    if old is not None:
        if old != settings:
            diff = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
            raise UsageError(
                f"OUT {out} already holds a different pack (differs in: {', '.join(diff)}); "
                f"use another OUT or delete it"
            )
        return
    if out.exists() and any(not e.name.startswith(".") for e in os.scandir(out)):
        raise UsageError(f"OUT {out} is not empty and holds no stoker pack; use an empty or new folder")
    state_dir(out).mkdir(parents=True, exist_ok=True)
    with atomic_write(state_dir(out) / SETTINGS_NAME, "w") as f:
        f.write(json.dumps(settings, indent=1, sort_keys=True) + "\n")


class Journal:
    """Append-only progress log of one (split, part)."""

    def __init__(self, path: Path):
        self.path = path

    def load(self, *, repair: bool = False) -> list[dict]:
        """Complete records so far. A torn last line (crash mid-write) is ignored, and
        with ``repair`` (only the part's own writer may) cut off the file."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        keep = raw[: raw.rfind(b"\n") + 1]
        if repair and len(keep) != len(raw):
            with open(self.path, "r+b") as f:
                f.truncate(len(keep))
        return [json.loads(line) for line in keep.decode().splitlines() if line.strip()]

    def append(self, record: dict) -> None:
        try:
            with open(self.path, "ab") as f:
                f.write((json.dumps(record, sort_keys=True) + "\n").encode())
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:  # a torn line is cut off by the next load(repair=True)
            if e.filename is None:
                raise OSError(e.errno, e.strerror, str(self.path)) from e
            raise


def shard_record(info: ShardInfo, end: int, rejects: list[tuple[str, str]], stats: dict | None = None) -> dict:
    """A journal line: the finished shard (None: only rejects in this range), where the range
    ends, its rejects, and (float and mask splits) the partial sums of its targets' statistics
    (:meth:`~stoker.pipeline.shards.targets.StatsAccumulator.state`)."""
    record = {"shard": asdict(info) if info else None, "end": end, "rejects": [list(r) for r in rejects]}
    if stats is not None:
        record["stats"] = stats
    return record


def part_status(records: list[dict]) -> tuple[int, int, bool]:
    """(shards written, input position to continue from, finished) of a journal."""
    shards = sum(1 for r in records if r.get("shard"))
    end = records[-1]["end"] if records else 0
    done = bool(records) and bool(records[-1].get("done"))
    return shards, end, done


#: ``shard_ok(split, name, size)``: is the finished shard in place (where OUT really is)?
ShardCheck = Callable[[str, str, int], bool]


def merge(out: Path, shard_ok: ShardCheck | None = None) -> dict[str, Any]:
    """Write ``OUT/<split>/stoker.json`` for every split and ``OUT/rejects.jsonl`` from
    the journals of all parts. Raises UsageError naming the parts not finished.
    ``shard_ok`` checks a journaled shard (default: on disk under OUT with its size and ``.idx``).

    Returns per-split totals: ``{split: {"samples", "rejected", "skipped", "shards", "bytes"}}``.
    """
    manifests, rejects_text, totals = _plan(out, shard_ok)
    for split, m in manifests.items():
        (out / split).mkdir(parents=True, exist_ok=True)
        m.save(out / split)
    with atomic_write(out / REJECTS_NAME, "w", encoding="utf-8") as f:
        f.write(rejects_text)
    return totals


def _plan(out: Path, shard_ok: ShardCheck | None = None) -> tuple[dict[str, Manifest], str, dict[str, Any]]:
    """What :func:`merge` writes: ``(manifests by split, rejects.jsonl text, totals)``."""
    if shard_ok is None:

        def shard_ok(split: str, name: str, size: int) -> bool:
            return local_shard_ok(out / split / name, size)

    settings = read_settings(out)
    if settings is None:
        raise UsageError(f"{out} holds no stoker pack in progress (no {STATE_DIR}/{SETTINGS_NAME})")
    parts = settings["parts"]
    journals: dict[str, list[list[dict]]] = {}
    missing = []
    for split in settings["splits"]:
        journals[split] = []
        for part in range(parts):
            records = Journal(journal_path(out, split, part, parts)).load()
            if not part_status(records)[2]:
                missing.append(f"{part}/{parts}" + ("" if len(settings["splits"]) == 1 else f" ({split})"))
            journals[split].append(records)
    if missing:
        raise UsageError(f"cannot merge {out}: parts not finished: {', '.join(missing)}")
    totals: dict[str, Any] = {}
    rejects: list[tuple[str, str]] = []
    manifests = {}
    for split, per_part in journals.items():
        shards = [ShardInfo(**r["shard"]) for records in per_part for r in records if r.get("shard")]
        for part, records in enumerate(per_part):
            for r in records:
                if r.get("shard") and not shard_ok(split, r["shard"]["name"], r["shard"]["bytes"]):
                    raise UsageError(
                        f"cannot merge {out}: shard {out / split / r['shard']['name']} is missing or "
                        f"damaged; rerun part {part}/{parts} (stoker pack SRC OUT --part {part}/{parts}) "
                        f"to restore it"
                    )
        split_rejects = [tuple(x) for x in settings["splits"][split].get("scan_rejects", [])]
        split_rejects += [tuple(x) for records in per_part for r in records for x in r.get("rejects", [])]
        rejects.extend(split_rejects)
        info = settings["splits"][split]
        pack = {k: v for k, v in settings.items() if k not in ("splits", "classes", "journal_format", "target")}
        pack.update(split=split, num_inputs=info["num_inputs"], rejected=len(split_rejects), skipped=info["skipped"])
        target = Target.from_json(settings["target"]) if "target" in settings else Target()
        m = Manifest(
            num_samples=sum(s.num_samples for s in shards),
            classes=list(settings["classes"]),
            shards=shards,
            pack=pack,
            target=_with_stats(target, [r for records in per_part for r in records if r.get("shard")]),
        )
        manifests[split] = m
        totals[split] = {
            "samples": m.num_samples,
            "rejected": len(split_rejects),
            "skipped": info["skipped"],
            "shards": len(shards),
            "bytes": sum(s.bytes for s in shards),
        }
        if m.target.stats is not None:
            totals[split]["target_stats"] = m.target.stats.to_json()
    text = "".join(json.dumps({"path": path, "reason": reason}, ensure_ascii=False) + "\n" for path, reason in rejects)
    return manifests, text, totals


def _with_stats(target: Target, shard_records: list[dict]) -> Target:
    """``target`` with the statistics its split's shards journaled, merged (every part, every
    engine, every resumed run); as it was when a shard's are missing (a journal of an older stoker)."""
    seen = target.accumulator()
    if seen is None or not shard_records or any("stats" not in r for r in shard_records):
        return target
    for r in shard_records:
        seen.merge(StatsAccumulator.from_state(r["stats"]))
    return dataclasses.replace(target, stats=seen.result(target.ignore_index))


def local_shard_ok(tar: Path, size: int) -> bool:
    """The shard exists with its journaled size and has a non-empty ``.idx`` (stats only)."""
    try:
        return tar.stat().st_size == size and idx_path(tar).stat().st_size > 0
    except OSError:
        return False


def merged_totals(out: Path, shard_ok: ShardCheck | None = None) -> dict[str, Any] | None:
    """:func:`merge`'s totals when every split's manifest and rejects.jsonl already hold exactly
    what it would write (the pack is finished and nothing, e.g. ``stoker index``, rewrote them),
    else None."""
    try:
        manifests, rejects_text, totals = _plan(out, shard_ok)
        if (out / REJECTS_NAME).read_text(encoding="utf-8") != rejects_text:
            return None
        if all(
            (out / split / MANIFEST_NAME).read_text(encoding="utf-8") == m.to_json() for split, m in manifests.items()
        ):
            return totals
        return None
    except (OSError, ValueError, UsageError):
        return None
