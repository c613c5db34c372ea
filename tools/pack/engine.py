"""The local engine of ``stoker pack``: sanitize the inputs of one (split, part) in order
(a process pool, or Ray tasks), write them into shards, journal each finished shard, and
rebuild journaled shards that were deleted or damaged since. Resumes from the journal."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from stoker.errors import CheckFailedError, UsageError
from stoker.pipeline.shards.manifest import idx_path
from stoker.pipeline.shards.writer import ShardWriter, shard_name

from .journal import Journal, journal_path, local_shard_ok, part_status, shard_record, state_dir
from .remote import Remote
from .sanitize import Sanitized, Settings
from .sources import Item, Job, Source, display_path, sanitize_item

CHUNK = 8  # images per worker task: amortizes inter-process overhead
RESUME = "rerun the same command to resume (finished shards are kept)"


class _Sanitizer:
    """Sanitizes items in order: in this process (workers=1), or in worker processes
    (:class:`~stoker.pipeline.workers.Workers`) with a bounded window of chunks in flight,
    so memory stays flat however long the list.

    The workers start on ``__enter__``, before the progress bar starts its thread.
    """

    def __init__(self, settings: Settings, workers: int, source: Source):
        self.settings, self.workers, self.source, self.pool = settings, workers, source, None

    def __enter__(self) -> _Sanitizer:
        if self.workers > 1:
            from stoker.pipeline.workers import Workers

            self.pool = Workers(self.workers, doing="sanitizing", resume=RESUME, chunk=CHUNK)
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.close(kill=True)  # a finished run has nothing in flight; an error or Ctrl-C stops now

    def results(self, items: list[Item]) -> Iterator[Sanitized]:
        if self.pool is None:  # one at a time: a shard is written as soon as its images are ready
            for job in self.source.jobs(items):
                yield sanitize_item(job, self.settings)
            return
        jobs = (job for i in range(0, len(items), CHUNK) for job in self.source.jobs(items[i : i + CHUNK]))
        yield from self.pool.map(partial(sanitize_item, settings=self.settings), jobs, name=_job_name)


def _job_name(job: Job) -> str:
    return job.where


def _sanitizer(settings: Settings, workers: int, source: Source, engine: str):
    """The engine that sanitizes images: a process pool here, or Ray tasks."""
    if engine == "ray":
        from .ray_engine import RaySanitizer

        return RaySanitizer(settings, source)
    return _Sanitizer(settings, workers, source)


def _components(it: Item, res: Sanitized, source: Source) -> dict[str, bytes] | str:
    """The tar members of one packed sample (:mod:`stoker.pipeline.shards.targets`; file names
    stored as valid UTF-8), or why its target does not fit its image (a kind's ``pack_value``
    saying ``{"reject": why}``)."""
    meta = {"path": display_path(it.rel), "width": res.width, "height": res.height}
    if it.weight is not None:  # --weight-column: read by Loader(balance="weights")
        meta["weight"] = it.weight
    target = source.target
    value, more = target.pack_value(it, res, source.classes)
    if "reject" in more:
        return more["reject"]
    meta.update({k: display_path(v) if isinstance(v, str) else v for k, v in more.items()})
    return {target.member: target.encode(value), "jpg": res.jpg, "json": json.dumps(meta).encode()}


def _sample_bytes(components: dict[str, bytes]) -> int:
    return sum(512 + len(v) + (-len(v) % 512) for v in components.values())


def pack_part(out: Path, split: str, source: Source, *, part: int, parts: int, **kw) -> dict:
    """Pack part ``part`` of ``parts`` of one split into shards, resuming from the
    journal; ``kw`` as :func:`_pack_part_locked`. Returns this run's counts: packed,
    rejected, copied, resized, shards, bytes."""
    start, end = part_range(len(source.splits[split]), part, parts)
    state_dir(out).mkdir(parents=True, exist_ok=True)
    with _lock(journal_path(out, split, part, parts).with_suffix(".lock"), f"{split} part {part}/{parts}"):
        return _pack_part_locked(out, split, source, start=start, end=end, part=part, parts=parts, **kw)


def _pack_part_locked(
    out: Path,
    split: str,
    source: Source,
    *,
    start: int,
    end: int,
    part: int,
    parts: int,
    settings: Settings,
    shard_size: int,
    samples_per_shard: int,
    workers: int,
    progress: bool,
    engine: str = "local",
    remote: Remote | None = None,
) -> dict:
    split_dir = out / split
    split_dir.mkdir(parents=True, exist_ok=True)
    prefix = shard_name(split, 0, part, parts)[: -len("000000.tar")]
    for stale in split_dir.glob(prefix + "*.tmp"):  # a shard or index from a killed run
        stale.unlink()
    journal = Journal(journal_path(out, split, part, parts))
    records = journal.load(repair=True)
    nshards, pos, done = part_status(records)
    pos = max(pos, start)
    stats = {"packed": 0, "rejected": 0, "copied": 0, "resized": 0, "shards": 0, "bytes": 0, "restored": 0}
    stats["restored"] = _repair_shards(
        split_dir, records, start, source, split, settings=settings, workers=workers, engine=engine, remote=remote
    )
    if done:
        return stats
    shards = _PartShards(
        split_dir,
        journal,
        source.target,
        stats,
        name=partial(shard_name, split, part=part, parts=parts),
        nshards=nshards,
        samples_per_shard=samples_per_shard,
        shard_size=shard_size,
        remote=remote,
    )
    desc = split + (f" {part}/{parts}" if parts > 1 else "")
    items = source.splits[split]
    with (
        _sanitizer(settings, workers, source, engine) as sanitizer,
        _progress_bar(total=end - start, initial=pos - start, desc=desc, progress=progress) as bar,
    ):
        try:
            for i, res in enumerate(sanitizer.results(items[pos:end]), start=pos):
                it = items[i]
                bar.update(1)
                comps = None if res.jpg is None else _components(it, res, source)
                if comps is None or isinstance(comps, str):  # unreadable, or its target does not fit it
                    shards.reject(it, res if comps is None else res._replace(jpg=None, reason=comps))
                    continue
                shards.add(i, it, res, comps)
            if shards.writer is not None or shards.rejects:
                shards.close(end)
            journal.append({"done": True, "end": end})
        except BaseException:
            shards.abort()
            raise
    return stats


def _repair_shards(
    split_dir: Path,
    records: list[dict],
    start: int,
    source: Source,
    split: str,
    *,
    settings: Settings,
    workers: int,
    engine: str,
    remote: Remote | None,
) -> int:
    """Rebuild the journaled shards of this part that were deleted or damaged since, and (to a
    remote OUT) upload them and the staged shards of a killed run; returns how many."""
    if remote is None:
        damaged, uploads = _damaged_shards(split_dir, records, start), []
    else:
        damaged, uploads = remote.check(split_dir, records, start)
    restored = 0
    if damaged:
        restored = _restore(
            split_dir, source.splits[split], source, damaged, settings=settings, workers=workers, engine=engine
        )
    if remote is not None:  # staged shards of a killed run, and the ones just rebuilt
        for name in uploads + [info["name"] for _, _, info in damaged]:
            remote.publish(split_dir, name)
        restored += len(uploads)
    return restored


def _progress_bar(*, total: int, initial: int, desc: str, progress: bool):
    """The tqdm bar of one part on stderr (a no-op one when ``progress`` is off)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="img",
        file=sys.stderr,
        disable=None if progress else True,
        smoothing=0.05,
        dynamic_ncols=True,
    )


class _PartShards:
    """The shards of one part as they are written: the open shard rolls over when full, and each
    finished shard is journaled with the rejects of its range and what was seen of its targets
    (then uploaded, to a remote OUT). Counts go into ``stats``."""

    def __init__(
        self,
        split_dir: Path,
        journal: Journal,
        target,
        stats: dict,
        *,
        name: Callable[[int], str],
        nshards: int,
        samples_per_shard: int,
        shard_size: int,
        remote: Remote | None,
    ):
        self.split_dir, self.journal, self.target, self.stats = split_dir, journal, target, stats
        self.name, self.nshards, self.remote = name, nshards, remote  # name(index): the shard's file name
        self.samples_per_shard, self.shard_size = samples_per_shard, shard_size
        self.writer: ShardWriter | None = None
        self.rejects: list[tuple[str, str]] = []
        self.seen = target.spec.accumulator(target)  # what the packer saw of the targets, journaled per shard

    def reject(self, it: Item, res: Sanitized) -> None:
        """Note an input that is not packed, with why."""
        self.rejects.append((display_path(it.rel), res.reason))
        self.stats["rejected"] += 1

    def add(self, i: int, it: Item, res: Sanitized, comps: dict[str, bytes]) -> None:
        """Write input ``i`` (its tar members ``comps``), first closing the open shard if it is full."""
        writer = self.writer
        if writer is not None and (
            len(writer) >= self.samples_per_shard
            if self.samples_per_shard
            else writer.bytes_written + _sample_bytes(comps) + 1024 > self.shard_size
        ):
            self.close(i)
        if self.writer is None:  # entered and exited by hand: shards roll over mid-loop
            self.writer = ShardWriter(self.split_dir / self.name(self.nshards)).__enter__()
        self.writer.write(f"{i:09d}", comps)
        if self.seen is not None:  # the values as stored (a mask: the pixels the sanitizer counted)
            self.target.add_seen(self.seen, it, res, self.target.pack_value(it, res, ())[0])
        self.stats["packed"] += 1
        self.stats["copied"] += res.copied
        self.stats["resized"] += res.resized

    def close(self, end_pos: int) -> None:
        """Finish the open shard (if any) and journal it with the rejects of its range."""
        info = None
        if self.writer is not None:
            self.writer.__exit__(None, None, None)
            info = self.writer.info
            self.writer = None
            self.nshards += 1
            self.stats["shards"] += 1
            self.stats["bytes"] += info.bytes
        seen = self.seen
        self.journal.append(
            shard_record(info, end_pos, self.rejects, seen.state() if seen is not None and info else None)
        )
        self.rejects = []
        self.seen = self.target.spec.accumulator(self.target)
        if self.remote is not None and info is not None:  # journaled first: a kill mid-upload re-uploads
            self.remote.publish(self.split_dir, info.name)

    def abort(self) -> None:
        """Called while an error or Ctrl-C is being handled: leave no half shard under a .tmp name."""
        if self.writer is not None:
            self.writer.__exit__(*sys.exc_info())


def _damaged_shards(split_dir: Path, records: list[dict], start: int) -> list[tuple[int, int, dict]]:
    """Journaled shards that are missing, have another size than journaled, or lack
    their ``.idx``: ``(first input, end input, shard record)`` each. Stats only: cheap."""
    bad, first = [], start
    for r in records:
        info = r.get("shard")
        if info and not local_shard_ok(split_dir / info["name"], info["bytes"]):
            bad.append((first, r["end"], info))
        first = r["end"]
    return bad


def _restore(
    split_dir: Path,
    items: list[Item],
    source: Source,
    damaged: list[tuple[int, int, dict]],
    *,
    settings: Settings,
    workers: int,
    engine: str = "local",
) -> int:
    """Rebuild journaled shards that were deleted or damaged after they were written:
    the inputs of a shard's range are packed again into the same name (deterministic,
    so byte-identical). Raises CheckFailedError when the rebuilt bytes differ (SRC changed)."""
    with _sanitizer(settings, workers, source, engine) as sanitizer:
        for first, end, info in damaged:
            path = split_dir / info["name"]
            with ShardWriter(path) as writer:
                for i, res in enumerate(sanitizer.results(items[first:end]), start=first):
                    comps = None if res.jpg is None else _components(items[i], res, source)
                    if comps is not None and not isinstance(comps, str):  # as the first run: rejects stay out
                        writer.write(f"{i:09d}", comps)
            if writer.info.sha256 != info["sha256"]:
                path.unlink(missing_ok=True)
                idx_path(path).unlink(missing_ok=True)
                raise CheckFailedError(
                    f"shard {path} was missing or damaged and rebuilds differently: the images in "
                    f"SRC changed since it was packed; delete {split_dir.parent} and pack again"
                )
    return len(damaged)


def part_range(n: int, part: int, parts: int) -> tuple[int, int]:
    """Contiguous slice ``[start, end)`` of ``n`` items for part ``part`` of ``parts``."""
    return n * part // parts, n * (part + 1) // parts


def _lock(path: Path, what: str):
    """Hold an exclusive lock on ``path`` while packing, so a second run of the same
    part (a double-submitted job) stops with a usage error instead of racing."""
    f = open(path, "a")
    try:
        import fcntl

        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no fcntl (Windows): run unguarded
        pass
    except OSError:
        f.close()
        raise UsageError(f"{what} of {path.parent.parent} is being packed by another process") from None
    return f
