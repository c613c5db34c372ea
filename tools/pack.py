"""Pack an image folder (or a CSV/TSV of path,label) into WebDataset tar shards.

SRC is an ImageFolder tree (one subfolder per class, class index = sorted folder
name), a tree with train/ and val/ subtrees, or a CSV/TSV of path,label rows (paths
relative to the CSV's folder; integer labels are kept as they are and must be in
0..1,000,000; otherwise labels are class names). OUT gets train/ (and val/): shards
train-000000.tar with one DALI .idx each and a stoker.json manifest, plus
rejects.jsonl listing every input that was not packed, with the reason.

Symlinks are followed, but each real folder and file is packed once, and a link that
loops back up or into another class's folder is not followed (listed as a reject), so
no image lands under another class's label. Only regular files up to --max-file-size
are read. A JPEG is copied byte for byte only when every decoder of the Loader reads it
identically (baseline, 8-bit, one scan, nothing after the end marker), is RGB, upright
and within the size limits; every other image is decoded, turned upright and RGB,
resized down and re-encoded, so every stored sample decodes in DALI and Pillow.

The run is deterministic (same SRC and --seed: byte-identical shards), parallel,
and resumable: after a crash, a kill or a full disk, rerun the same command. A rerun
also restores shards deleted or truncated since, and manifests another tool rewrote.
With --part I/N, N machines pack disjoint slices into one OUT; then
`stoker pack --merge OUT`.

OUT may be a URL (s3://bucket/ds, gs://..., file://...; credentials and endpoint
from the usual AWS_* variables or --storage-option): shards are built in a local
staging folder, each uploaded as soon as it is finished, and the stoker.json
manifests go last, so a reader never sees a manifest before its shards. The
journal stays in the staging folder: rerun the same command after a crash or a
kill and it goes on where it stopped. With --engine ray the image work runs as
Ray tasks on a cluster (--ray-address) or on this machine; the output is the same.

examples:
  stoker pack ~/data/imagenet /fast/imagenet-shards
  stoker pack photos/ out/ --val-fraction 0.1 --short-side 0 --max-side 512
  stoker pack labels.csv out/ --part 3/8   # on 8 machines, then: stoker pack --merge out/
  stoker pack ~/data/imagenet s3://bucket/imagenet --engine ray --ray-address auto
"""

from __future__ import annotations

import argparse
import collections
import errno
import json
import os
import re
import sys
import time
from functools import partial
from pathlib import Path
from typing import Iterator, Optional

from stoker import StokerError, __version__
from stoker.pipeline.shards.writer import ShardWriter, shard_name
from stoker.pipeline.storage import Store, default_cache_dir, is_url, parse_storage_options, url_key

from .errors import CheckFailed, UsageError
from .packjournal import (
    REJECTS_NAME,
    Journal,
    claim,
    is_merged,
    journal_path,
    merge,
    part_status,
    read_settings,
    shard_record,
    state_dir,
)
from .packsource import MAX_LABEL, Item, Source, display_path, part_range, scan
from .sanitize import MAX_BYTES, PIL_MAX_PIXELS, Sanitized, Settings, sanitize

HELP = "pack an image folder or CSV into WebDataset shards + DALI .idx + stoker.json"
DEFAULT_SHARD_SIZE = 256 * 1000**2
CHUNK = 8  # images per worker task: amortizes inter-process overhead


class WriteFailed(StokerError):
    """Writing OUT failed (disk full, quota, I/O error): exit 1; what was written is intact."""

    exit_code = 1


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


def parse_part(text: Optional[str]) -> tuple[int, int]:
    if text is None:
        return 0, 1
    m = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise UsageError(f"--part {text!r} should be I/N with 0 <= I < N, e.g. 0/4")
    return int(m.group(1)), int(m.group(2))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", nargs="?", metavar="SRC",
                   help="image folder, train/+val/ tree, or CSV/TSV of path,label (integer labels must be in "
                        f"0..{MAX_LABEL:,}; other rows are rejected)")
    p.add_argument("out", nargs="?", metavar="OUT",
                   help="output folder (created), or a URL: s3://bucket/ds, gs://..., any fsspec URL")
    g = p.add_argument_group("images")
    g.add_argument("--short-side", type=int, default=256, metavar="PX",
                   help="resize down so the shorter side is at most PX (0: keep the size; default 256)")
    g.add_argument("--max-side", type=int, default=0, metavar="PX",
                   help="resize down so the longer side is at most PX (default: no limit)")
    g.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images (default 90)")
    g.add_argument("--reencode", action="store_true",
                   help="re-encode every image, even baseline RGB JPEGs that could be copied as they are")
    g.add_argument("--max-pixels", type=int, default=PIL_MAX_PIXELS, metavar="N",
                   help=f"reject images larger than N pixels, before decoding (default {PIL_MAX_PIXELS:,})")
    g.add_argument("--max-file-size", default=f"{MAX_BYTES // 1024**2}MiB", metavar="SIZE",
                   help=f"reject input files larger than SIZE, before reading them (default {MAX_BYTES // 1024**2}MiB)")
    g = p.add_argument_group("shards")
    g.add_argument("--shard-size", default="256MB", metavar="SIZE",
                   help="start a new shard before one would exceed SIZE (256MB, 1GB, bytes; default 256MB)")
    g.add_argument("--samples-per-shard", type=int, default=0, metavar="N",
                   help="exactly N samples per shard (overrides --shard-size)")
    g.add_argument("--seed", type=int, default=0, help="seed of the sample shuffle and val split (default 0)")
    g.add_argument("--val-fraction", type=float, default=0.0, metavar="F",
                   help="put a seeded fraction F of the images into val/, stratified by class (when SRC has no "
                        "val/ folder); classes too small to give one are filled from the others")
    g = p.add_argument_group("running")
    g.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help=f"worker processes (default: all cores, {os.cpu_count()})")
    g.add_argument("--part", metavar="I/N", help="pack only part I of N of the shuffled list (0-based)")
    g.add_argument("--merge", metavar="OUT", help="write the manifests of OUT once all its --part runs finished")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: a process pool on this machine (default); ray: Ray tasks (pip install stoker[ray]) "
                        "on --ray-address, or on a local Ray with --workers CPUs; the output is the same")
    g.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to run on (auto, ray://head:10001; default: a local Ray on this machine)")
    g.add_argument("--strict", action="store_true", help="exit 1 when any input was rejected")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    g = p.add_argument_group("object storage (OUT is a URL)")
    g.add_argument("--storage-option", action="append", default=None, metavar="K=V",
                   help="an fsspec storage option, repeatable (endpoint_url=http://host:9000, anon=true, "
                        "config_kwargs.read_timeout=30)")
    g.add_argument("--staging", metavar="DIR",
                   help="local folder for the journal and the shards on their way up (default: "
                        "~/.cache/stoker/pack-staging/<hash of OUT>); needs room for about two shards")


def _check_out(src: Path, out: Path, what: str = "OUT") -> None:
    rs, ro = src.resolve(), out.resolve()
    if rs.is_dir() and (ro == rs or rs in ro.parents):  # it would pack its own output
        raise UsageError(f"{what} {out} is inside SRC {src}; put it elsewhere")
    if out.exists() and not out.is_dir():
        raise UsageError(f"cannot write to {what} {out}: it exists and is not a folder")
    parent = ro
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write to {what} {out}: {parent} is not a writable folder")


def _make_out(out: Path, what: str = "OUT") -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".stoker-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"cannot write to {what} {out}: {e.strerror or e}") from None


def _settings_identity(args, src: Path, source: Source, settings: Settings, shard_size: int, parts: int) -> dict:
    """Everything that determines the bytes of the pack: equal dicts -> equal output."""
    return {
        "journal_format": 1,
        "stoker_version": __version__,
        "source": str(src.resolve()),
        "seed": args.seed,
        "short_side": settings.short_side,
        "max_side": settings.max_side,
        "quality": settings.quality,
        "reencode": settings.reencode,
        "max_pixels": settings.max_pixels,
        "max_bytes": settings.max_bytes,
        "shard_size": 0 if args.samples_per_shard else shard_size,
        "samples_per_shard": args.samples_per_shard,
        "val_fraction": args.val_fraction,
        "parts": parts,
        "classes": source.classes,
        "splits": {s: {"num_inputs": len(items), "digest": source.digest(s), "skipped": source.skipped.get(s, 0),
                       "scan_rejects": [list(r) for r in source.rejects.get(s, [])]}
                   for s, items in source.splits.items()},
    }


def _worker_init() -> None:
    """Workers leave Ctrl-C to the main process and die with it, even on kill -9."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _sanitize_chunk(chunk: list[str], settings: Settings) -> list[Sanitized]:
    return [sanitize(path, settings) for path in chunk]


class _Sanitizer:
    """Sanitizes items in order: in this process (workers=1), or in a process pool with
    a bounded window of chunks in flight, so memory stays flat however long the list.

    The pool is forked on ``__enter__``, before the progress bar starts its thread.
    """

    def __init__(self, settings: Settings, workers: int, base: Path):
        self.settings, self.workers, self.base, self.pool = settings, workers, str(base), None

    def __enter__(self) -> "_Sanitizer":
        if self.workers > 1:
            import multiprocessing as mp

            ctx = mp.get_context("spawn" if sys.platform == "darwin" else "fork")
            self.pool = ctx.Pool(self.workers, _worker_init)
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()

    def results(self, items: list[Item]) -> Iterator[Sanitized]:
        if self.pool is None:  # one at a time: a shard is written as soon as its images are ready
            for it in items:
                yield sanitize(os.path.join(self.base, it.rel), self.settings)
            return
        fn = partial(_sanitize_chunk, settings=self.settings)
        chunks = ([os.path.join(self.base, it.rel) for it in items[i:i + CHUNK]]
                  for i in range(0, len(items), CHUNK))
        pending: collections.deque = collections.deque()
        for c in chunks:
            pending.append(self.pool.apply_async(fn, (c,)))
            if len(pending) >= 4 * self.workers:
                break
        while pending:
            res = pending.popleft().get()
            nxt = next(chunks, None)
            if nxt is not None:
                pending.append(self.pool.apply_async(fn, (nxt,)))
            yield from res


def _sanitizer(settings: Settings, workers: int, base: Path, engine: str):
    """The engine that sanitizes images: a process pool here, or Ray tasks."""
    if engine == "ray":
        from .ray_engine import RaySanitizer

        return RaySanitizer(settings, base)
    return _Sanitizer(settings, workers, base)


class _Remote:
    """OUT is a URL: shards are built in the local staging folder (which holds the journal
    and the locks), uploaded as each is finished and then removed from staging; the
    manifests are uploaded last. Uploads are atomic for readers (see ``Store.put_file``).

    One upload runs in a background thread while the next shard is being built, so the
    workers do not wait on the network; its error surfaces at the next :meth:`publish`
    or :meth:`flush`.
    """

    def __init__(self, store: Store, staging: Path):
        from concurrent.futures import ThreadPoolExecutor

        self.store, self.staging = store, staging
        self.listing: dict[str, dict[str, int]] = {}
        self._uploader = ThreadPoolExecutor(1, thread_name_prefix="stoker-upload")
        self._pending = None

    def publish(self, split_dir: Path, name: str) -> None:
        """Upload a finished, journaled shard and its index (in the background), then drop them from staging."""
        self.flush()
        self._pending = self._uploader.submit(self._upload, split_dir, name)

    def flush(self) -> None:
        """Wait for the upload in flight; raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _upload(self, split_dir: Path, name: str) -> None:
        from stoker.pipeline.shards.manifest import idx_path

        tar = split_dir / name
        # the index goes up first: a shard under its final name always has its index
        self.store.put_file(idx_path(tar), f"{split_dir.name}/{idx_path(tar).name}")
        self.store.put_file(tar, f"{split_dir.name}/{name}")
        tar.unlink()
        idx_path(tar).unlink()

    def _ok(self, sizes: dict[str, int], name: str, size: int) -> bool:
        return sizes.get(name) == size and sizes.get(name[: -len(".tar")] + ".idx", 0) > 0

    def check(self, split_dir: Path, records: list[dict], start: int
              ) -> tuple[list[tuple[int, int, dict]], list[str]]:
        """Journaled shards not in place remotely: ``(to rebuild, to upload from staging)``.
        One listing per split; a shard counts as in place when its size is the journaled one
        and its ``.idx`` is there (object stores write whole objects or none)."""
        from stoker.pipeline.shards.manifest import idx_path

        sizes = self.store.sizes(split_dir.name)
        rebuild, upload, first = [], [], start
        for r in records:
            info = r.get("shard")
            if info:
                tar = split_dir / info["name"]
                if self._ok(sizes, info["name"], info["bytes"]):
                    tar.unlink(missing_ok=True)  # uploaded just before a kill: the staged copy is done with
                    idx_path(tar).unlink(missing_ok=True)
                elif _local_shard_ok(tar, info["bytes"]):
                    upload.append(info["name"])
                else:
                    rebuild.append((first, r["end"], info))
            first = r["end"]
        return rebuild, upload

    def shard_ok(self, split: str, name: str, size: int) -> bool:
        if split not in self.listing:
            self.listing[split] = self.store.sizes(split)
        return self._ok(self.listing[split], name, size)

    def manifests_match(self, out: Path, splits: list[str]) -> bool:
        """The uploaded rejects.jsonl and manifests equal the staged ones."""
        from stoker.pipeline.shards.manifest import MANIFEST_NAME

        names = [REJECTS_NAME] + [f"{s}/{MANIFEST_NAME}" for s in splits]
        return all(self.store.read_bytes(n) == (out / n).read_bytes() for n in names)

    def publish_manifests(self, out: Path, splits: list[str]) -> None:
        """Upload rejects.jsonl, then each split's stoker.json: the manifests last."""
        from stoker.pipeline.shards.manifest import MANIFEST_NAME

        self.store.put_file(out / REJECTS_NAME, REJECTS_NAME)
        for split in splits:
            self.store.put_file(out / split / MANIFEST_NAME, f"{split}/{MANIFEST_NAME}")


def _local_shard_ok(tar: Path, size: int) -> bool:
    from stoker.pipeline.shards.manifest import idx_path

    try:
        return tar.stat().st_size == size and idx_path(tar).stat().st_size > 0
    except OSError:
        return False


def _components(it: Item, res: Sanitized, classes: list[str]) -> dict[str, bytes]:
    """The tar members of one packed sample (file names stored as valid UTF-8)."""
    meta = {"path": display_path(it.rel), "width": res.width, "height": res.height, "class": classes[it.label]}
    return {"cls": str(it.label).encode(), "jpg": res.jpg, "json": json.dumps(meta).encode()}


def _sample_bytes(components: dict[str, bytes]) -> int:
    return sum(512 + len(v) + (-len(v) % 512) for v in components.values())


def pack_part(out: Path, split: str, source: Source, *, part: int, parts: int, **kw) -> dict:
    """Pack part ``part`` of ``parts`` of one split into shards, resuming from the
    journal; ``kw`` as :func:`_pack_part_locked`. Returns this run's counts: packed,
    rejected, copied, shards, bytes."""
    start, end = part_range(len(source.splits[split]), part, parts)
    state_dir(out).mkdir(parents=True, exist_ok=True)
    with _lock(journal_path(out, split, part, parts).with_suffix(".lock"), f"{split} part {part}/{parts}"):
        return _pack_part_locked(out, split, source, start=start, end=end, part=part, parts=parts, **kw)


def _pack_part_locked(out: Path, split: str, source: Source, *, start: int, end: int, part: int, parts: int,
                      settings: Settings, shard_size: int, samples_per_shard: int, workers: int,
                      progress: bool, engine: str = "local", remote: Optional[_Remote] = None) -> dict:
    from tqdm import tqdm


    split_dir = out / split
    split_dir.mkdir(parents=True, exist_ok=True)
    prefix = shard_name(split, 0, part, parts)[: -len("000000.tar")]
    for stale in split_dir.glob(prefix + "*.tmp"):  # a shard or index from a killed run
        stale.unlink()
    journal = Journal(journal_path(out, split, part, parts))
    records = journal.load(repair=True)
    nshards, pos, done = part_status(records)
    pos = max(pos, start)
    stats = {"packed": 0, "rejected": 0, "copied": 0, "shards": 0, "bytes": 0, "restored": 0}
    if remote is None:
        damaged, uploads = _damaged_shards(split_dir, records, start), []
    else:
        damaged, uploads = remote.check(split_dir, records, start)
    if damaged:
        stats["restored"] = _restore(split_dir, source.splits[split], source, damaged, settings=settings,
                                     workers=workers, engine=engine)
    if remote is not None:  # staged shards of a killed run, and the ones just rebuilt
        for name in uploads + [info["name"] for _, _, info in damaged]:
            remote.publish(split_dir, name)
        stats["restored"] += len(uploads)
    if done:
        return stats
    writer: Optional[ShardWriter] = None
    rejects: list[tuple[str, str]] = []

    def close(end_pos: int) -> None:
        """Finish the open shard (if any) and journal it with the rejects of its range."""
        nonlocal writer, nshards, rejects
        info = None
        if writer is not None:
            writer.__exit__(None, None, None)
            info = writer.info
            writer = None
            nshards += 1
            stats["shards"] += 1
            stats["bytes"] += info.bytes
        journal.append(shard_record(info, end_pos, rejects))
        rejects = []
        if remote is not None and info is not None:  # journaled first: a kill mid-upload re-uploads
            remote.publish(split_dir, info.name)

    desc = split + (f" {part}/{parts}" if parts > 1 else "")
    items, classes = source.splits[split], source.classes
    with _sanitizer(settings, workers, source.base, engine) as sanitizer, tqdm(
            total=end - start, initial=pos - start, desc=desc, unit="img", file=sys.stderr,
            disable=None if progress else True, smoothing=0.05, dynamic_ncols=True) as bar:
        try:
            for i, res in enumerate(sanitizer.results(items[pos:end]), start=pos):
                it = items[i]
                bar.update(1)
                if res.jpg is None:
                    rejects.append((display_path(it.rel), res.reason))
                    stats["rejected"] += 1
                    continue
                comps = _components(it, res, classes)
                if writer is not None and (
                        len(writer) >= samples_per_shard if samples_per_shard
                        else writer.bytes_written + _sample_bytes(comps) + 1024 > shard_size):
                    close(i)
                if writer is None:  # entered and exited by hand: shards roll over mid-loop
                    writer = ShardWriter(out / split / shard_name(split, nshards, part, parts)).__enter__()
                writer.write(f"{i:09d}", comps)
                stats["packed"] += 1
                stats["copied"] += res.copied
            if writer is not None or rejects:
                close(end)
            journal.append({"done": True, "end": end})
        except BaseException:
            if writer is not None:  # leave no half shard under a .tmp name
                writer.__exit__(*sys.exc_info())
            raise
    return stats


def _damaged_shards(split_dir: Path, records: list[dict], start: int) -> list[tuple[int, int, dict]]:
    """Journaled shards that are missing, have another size than journaled, or lack
    their ``.idx``: ``(first input, end input, shard record)`` each. Stats only: cheap."""
    from stoker.pipeline.shards.manifest import idx_path

    bad, first = [], start
    for r in records:
        info = r.get("shard")
        if info:
            tar = split_dir / info["name"]
            try:
                ok = tar.stat().st_size == info["bytes"] and idx_path(tar).stat().st_size > 0
            except OSError:
                ok = False
            if not ok:
                bad.append((first, r["end"], info))
        first = r["end"]
    return bad


def _restore(split_dir: Path, items: list[Item], source: Source, damaged: list[tuple[int, int, dict]], *,
             settings: Settings, workers: int, engine: str = "local") -> int:
    """Rebuild journaled shards that were deleted or damaged after they were written:
    the inputs of a shard's range are packed again into the same name (deterministic,
    so byte-identical). Raises CheckFailed when the rebuilt bytes differ (SRC changed)."""
    from stoker.pipeline.shards.manifest import idx_path


    with _sanitizer(settings, workers, source.base, engine) as sanitizer:
        for first, end, info in damaged:
            path = split_dir / info["name"]
            with ShardWriter(path) as writer:
                for i, res in enumerate(sanitizer.results(items[first:end]), start=first):
                    if res.jpg is not None:
                        writer.write(f"{i:09d}", _components(items[i], res, source.classes))
            if writer.info.sha256 != info["sha256"]:
                path.unlink(missing_ok=True)
                idx_path(path).unlink(missing_ok=True)
                raise CheckFailed(f"shard {path} was missing or damaged and rebuilds differently: the images in "
                                  f"SRC changed since it was packed; delete {split_dir.parent} and pack again")
    return len(damaged)


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


def _print_summary(out: str, totals: dict, run: dict, seconds: float) -> None:
    print(f"{'split':6} {'packed':>9} {'rejected':>9} {'skipped':>8} {'shards':>7} {'bytes':>14}")
    for split, t in totals.items():
        print(f"{split:6} {t['samples']:>9,} {t['rejected']:>9,} {t['skipped']:>8,} {t['shards']:>7,} "
              f"{t['bytes']:>14,}")
    if run:  # not after --merge
        n = sum(r["packed"] + r["rejected"] for r in run.values())
        rate = n / seconds if seconds > 0 else 0.0
        copied = sum(r["copied"] for r in run.values())
        print(f"this run: {n:,} images in {seconds:.1f} s ({rate:,.0f} images/s), {copied:,} copied as they were")
    _note_empty(totals)
    rej = sum(t["rejected"] for t in totals.values())
    if rej:
        print(f"{rej:,} rejected inputs listed in {out.rstrip('/')}/{REJECTS_NAME}")


def main(args: argparse.Namespace) -> int:
    if args.merge:
        if args.src or args.out:
            raise UsageError("--merge OUT takes no SRC/OUT arguments")
        if is_url(args.merge):
            raise UsageError("--merge takes a local OUT: --part with a URL OUT is not supported (use --engine ray "
                             "to pack on many machines)")
        out = Path(args.merge)
        try:
            totals = merge(out)
        except OSError as e:
            raise _write_failed(e, out) from None
        _print_summary(str(out), totals, {}, 0.0)
        return _strict(args, totals)
    if not args.src or not args.out:
        raise UsageError("need SRC and OUT (or --merge OUT)")
    part, parts = parse_part(args.part)
    max_bytes = parse_size(args.max_file_size, "--max-file-size")
    try:
        settings = Settings(short_side=args.short_side, max_side=args.max_side, quality=args.quality,
                            reencode=args.reencode, max_pixels=args.max_pixels, max_bytes=max_bytes)
    except ValueError as e:
        raise UsageError(str(e)) from None
    shard_size = parse_size(args.shard_size)
    if args.samples_per_shard < 0:
        raise UsageError(f"--samples-per-shard must be >= 0, got {args.samples_per_shard}")
    if not 0.0 <= args.val_fraction < 1.0:
        raise UsageError(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.engine != "ray" and args.ray_address:
        raise UsageError("--ray-address needs --engine ray")
    src = Path(args.src)
    if not src.exists():
        raise UsageError(f"SRC {src} does not exist")
    remote: Optional[_Remote] = None
    if is_url(args.out):
        if parts > 1:
            raise UsageError("--part with a URL OUT is not supported: use --engine ray to pack on many machines, "
                             "or pack the parts into a shared folder")
        options = parse_storage_options(args.storage_option)
        store = Store(args.out, options)
        store.check()  # reachable, bucket exists: before any work
        out = Path(args.staging) if args.staging else default_cache_dir() / "pack-staging" / url_key(args.out, options)
        remote = _Remote(store, out)
        _check_out(src, out, "--staging")
    else:
        if args.staging or args.storage_option:
            raise UsageError("--staging and --storage-option are for a URL OUT (s3://bucket/ds, ...)")
        out = Path(args.out)
        _check_out(src, out)
    t0 = time.perf_counter()
    source = scan(src, seed=args.seed, val_fraction=args.val_fraction)
    _make_out(out, "--staging" if remote else "OUT")
    identity = _settings_identity(args, src, source, settings, shard_size, parts)
    try:
        if args.engine == "ray":
            from stoker.pipeline.deps import usable_cores

            from .ray_engine import session

            with session(args.ray_address, min(args.workers, usable_cores())):
                return _pack(args, out, source, identity, settings, shard_size, part, parts, t0, remote)
        return _pack(args, out, source, identity, settings, shard_size, part, parts, t0, remote)
    except OSError as e:
        raise _write_failed(e, out) from None


def _write_failed(e: OSError, out: Path) -> StokerError:
    where = display_path(str(e.filename or out))
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return WriteFailed(f"disk full writing {where}: free space and rerun the same command "
                           f"(finished shards are kept, nothing written is corrupt)")
    return WriteFailed(f"cannot write {where}: {e.strerror or e}; fix it and rerun the same command "
                       f"(finished shards are kept)")


def _pack(args, out: Path, source: Source, identity: dict, settings: Settings, shard_size: int, part: int,
          parts: int, t0: float, remote: Optional[_Remote] = None) -> int:
    where = remote.store.url if remote else str(out)
    if remote is not None and read_settings(out) is None and not remote.store.is_empty():
        raise UsageError(f"OUT {where} is not empty and this machine holds no pack journal for it (in {out}); "
                         f"use an empty location, or the --staging folder of the pack that wrote it")
    claim(out, identity)
    run = {}
    for split in source.splits:
        run[split] = pack_part(out, split, source, part=part, parts=parts,
                               settings=settings, shard_size=shard_size, samples_per_shard=args.samples_per_shard,
                               workers=args.workers, progress=not args.quiet, engine=args.engine, remote=remote)
    if remote is not None:
        remote.flush()  # every shard is up before the manifests are planned
    restored = sum(r["restored"] for r in run.values())
    if restored:
        print(f"restored {restored} missing or damaged shard(s) of {where}", file=sys.stderr)
    worked = any(r["packed"] or r["rejected"] or r["restored"] for r in run.values())
    shard_ok = remote.shard_ok if remote else None
    splits = list(source.splits)
    if (parts == 1 and not worked and is_merged(out, identity, shard_ok)
            and (remote is None or remote.manifests_match(out, splits))):
        n = sum(len(v) for v in source.splits.values())
        print(f"{where} is up to date ({n:,} inputs, nothing to do)")
        return 0
    seconds = time.perf_counter() - t0
    if parts > 1:
        for split, r in run.items():
            print(f"{split} part {part}/{parts}: {r['packed']:,} packed, {r['rejected']:,} rejected, "
                  f"{r['shards']} shards this run")
        print(f"part {part}/{parts} done in {seconds:.1f} s; when every part is done: stoker pack --merge {out}")
        return 0
    totals = merge(out, shard_ok)
    if remote is not None:
        remote.publish_manifests(out, splits)
    _print_summary(where, totals, run, seconds)
    return _strict(args, totals)


def _note_empty(totals: dict) -> None:
    """One line per split that ends with no samples: never an empty split without a word."""
    for split, t in totals.items():
        if not t["samples"]:
            why = f"all {t['rejected']:,} inputs were rejected" if t["rejected"] else "it has no input images"
            print(f"note: {split}/ holds no samples: {why}", file=sys.stderr)


def _strict(args, totals: dict) -> int:
    rejected = sum(t["rejected"] for t in totals.values())
    if args.strict and rejected:
        raise CheckFailed(f"{rejected} input(s) rejected (--strict); see rejects.jsonl")
    return 0

