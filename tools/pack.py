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

# One module past 400 lines: pack()'s settings and the command's flags mirror each other one
# to one (the work itself is in pack_engine.py, pack_remote.py and packsource.py).

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from stoker import StokerError, __version__
from stoker.pipeline.storage import Store, default_cache_dir, is_url, parse_storage_options, url_key

from .errors import UsageError
from .pack_engine import pack_part
from .pack_remote import Remote
from .pack_result import InputsRejected, PackResult, WriteFailed
from .packjournal import claim, merge, merged_totals, read_settings
from .packsource import MAX_LABEL, Source, display_path, scan
from .sanitize import MAX_BYTES, PIL_MAX_PIXELS, Settings

HELP = "pack an image folder or CSV into WebDataset shards + DALI .idx + stoker.json"
DEFAULT_SHARD_SIZE = 256 * 1000**2


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
    p.add_argument(
        "src",
        nargs="?",
        metavar="SRC",
        help="image folder, train/+val/ tree, or CSV/TSV of path,label (integer labels must be in "
        f"0..{MAX_LABEL:,}; other rows are rejected)",
    )
    p.add_argument(
        "out",
        nargs="?",
        metavar="OUT",
        help="output folder (created), or a URL: s3://bucket/ds, gs://..., any fsspec URL",
    )
    g = p.add_argument_group("images")
    g.add_argument(
        "--short-side",
        type=int,
        default=256,
        metavar="PX",
        help="resize down so the shorter side is at most PX (0: keep the size; default 256)",
    )
    g.add_argument(
        "--max-side",
        type=int,
        default=0,
        metavar="PX",
        help="resize down so the longer side is at most PX (default: no limit)",
    )
    g.add_argument("--quality", type=int, default=90, help="JPEG quality of re-encoded images (default 90)")
    g.add_argument(
        "--reencode",
        action="store_true",
        help="re-encode every image, even baseline RGB JPEGs that could be copied as they are",
    )
    g.add_argument(
        "--max-pixels",
        type=int,
        default=PIL_MAX_PIXELS,
        metavar="N",
        help=f"reject images larger than N pixels, before decoding (default {PIL_MAX_PIXELS:,})",
    )
    g.add_argument(
        "--max-file-size",
        default=f"{MAX_BYTES // 1024**2}MiB",
        metavar="SIZE",
        help=f"reject input files larger than SIZE, before reading them (default {MAX_BYTES // 1024**2}MiB)",
    )
    g = p.add_argument_group("shards")
    g.add_argument(
        "--shard-size",
        default="256MB",
        metavar="SIZE",
        help="start a new shard before one would exceed SIZE (256MB, 1GB, bytes; default 256MB)",
    )
    g.add_argument(
        "--samples-per-shard",
        type=int,
        default=0,
        metavar="N",
        help="exactly N samples per shard (overrides --shard-size)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed of the sample shuffle and val split (default 0)")
    g.add_argument(
        "--val-fraction",
        type=float,
        default=0.0,
        metavar="F",
        help="put a seeded fraction F of the images into val/, stratified by class (when SRC has no "
        "val/ folder); classes too small to give one are filled from the others",
    )
    g = p.add_argument_group("running")
    g.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help=f"worker processes (default: all cores, {os.cpu_count()})",
    )
    g.add_argument("--part", metavar="I/N", help="pack only part I of N of the shuffled list (0-based)")
    g.add_argument("--merge", metavar="OUT", help="write the manifests of OUT once all its --part runs finished")
    g.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool on this machine (default); ray: Ray tasks (pip install stoker[ray]) "
        "on --ray-address, or on a local Ray with --workers CPUs; the output is the same",
    )
    g.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to run on (auto, ray://head:10001; default: a local Ray on this machine)",
    )
    g.add_argument("--strict", action="store_true", help="exit 1 when any input was rejected")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    g = p.add_argument_group("object storage (OUT is a URL)")
    g.add_argument(
        "--storage-option",
        action="append",
        default=None,
        metavar="K=V",
        help="an fsspec storage option, repeatable (endpoint_url=http://host:9000, anon=true, "
        "config_kwargs.read_timeout=30)",
    )
    g.add_argument(
        "--staging",
        metavar="DIR",
        help="local folder for the journal and the shards on their way up (default: "
        "~/.cache/stoker/pack-staging/<hash of OUT>); needs room for about two shards",
    )


def pack(
    src: str | Path,
    out: str | Path,
    *,
    short_side: int = 256,
    max_side: int = 0,
    quality: int = 90,
    reencode: bool = False,
    max_pixels: int = PIL_MAX_PIXELS,
    max_file_size: int = MAX_BYTES,
    shard_size: int = DEFAULT_SHARD_SIZE,
    samples_per_shard: int = 0,
    seed: int = 0,
    val_fraction: float = 0.0,
    workers: Optional[int] = None,
    part: int = 0,
    parts: int = 1,
    engine: str = "local",
    ray_address: Optional[str] = None,
    strict: bool = False,
    storage_options: Optional[Mapping[str, Any]] = None,
    staging: str | Path | None = None,
    progress: bool = False,
) -> PackResult:
    """Pack ``src`` into shards in ``out`` (see the module doc); rerun the same call to resume.

    Args:
        src: An ImageFolder tree, a tree with train/ and val/, or a CSV/TSV of path,label rows.
        out: The output folder (created), or a URL (s3://bucket/ds, gs://..., any fsspec URL).
        short_side: Resize down so the shorter side is at most this (0: keep the size).
        max_side: Resize down so the longer side is at most this (0: no limit).
        quality: JPEG quality of re-encoded images.
        reencode: Re-encode every image, even JPEGs that could be copied as they are.
        max_pixels: Reject images larger than this many pixels, before decoding.
        max_file_size: Reject input files larger than this many bytes, before reading.
        shard_size: Start a new shard before one would exceed this many bytes.
        samples_per_shard: Exactly this many samples per shard (0: by ``shard_size``).
        seed: Seed of the sample shuffle and of the val split.
        val_fraction: A seeded, stratified fraction of the images for val/ (when SRC has no val/).
        workers: Processes (or Ray CPUs) sanitizing images (None: the CPU count).
        part: Pack only this part of ``parts`` of the shuffled list (0-based); then :func:`merge_parts`.
        parts: Into how many parts the list is cut (1: the whole).
        engine: ``"local"`` (a process pool) or ``"ray"`` (Ray tasks; the output is the same).
        ray_address: The Ray cluster of ``engine="ray"`` (None: a local Ray).
        strict: Raise :class:`InputsRejected` when any input was rejected.
        storage_options: fsspec options of a URL ``out``.
        staging: The local folder of a URL ``out`` for the journal and the shards on their way up
            (None: under ~/.cache/stoker/pack-staging).
        progress: Show a progress bar on stderr.

    Returns:
        The :class:`PackResult`.

    Raises:
        UsageError: A bad setting or path, or ``out`` holds something else.
        InputsRejected: ``strict`` and some inputs were rejected (the pack is finished).
        WriteFailed: Writing ``out`` failed (disk full, ...); rerun the same call.
        CheckFailed: A shard deleted since it was packed rebuilds differently (SRC changed).
    """
    if not 0 <= part < parts:
        raise UsageError(f"--part {part}/{parts} should be I/N with 0 <= I < N, e.g. 0/4")
    try:
        settings = Settings(
            short_side=short_side,
            max_side=max_side,
            quality=quality,
            reencode=reencode,
            max_pixels=max_pixels,
            max_bytes=max_file_size,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    if shard_size < 1:
        raise UsageError(f"--shard-size must be positive, got {shard_size}")
    if samples_per_shard < 0:
        raise UsageError(f"--samples-per-shard must be >= 0, got {samples_per_shard}")
    if not 0.0 <= val_fraction < 1.0:
        raise UsageError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    if engine not in ("local", "ray"):
        raise UsageError(f"--engine must be local or ray, got {engine!r}")
    if engine != "ray" and ray_address:
        raise UsageError("--ray-address needs --engine ray")
    src = Path(src)
    if not src.exists():
        raise UsageError(f"SRC {src} does not exist")
    remote: Optional[Remote] = None
    if is_url(out):
        if parts > 1:
            raise UsageError(
                "--part with a URL OUT is not supported: use --engine ray to pack on many machines, "
                "or pack the parts into a shared folder"
            )
        options = dict(storage_options or {})
        store = Store(str(out), options)
        store.check()  # reachable, bucket exists: before any work
        local = Path(staging) if staging else default_cache_dir() / "pack-staging" / url_key(str(out), options)
        remote = Remote(store, local)
        _check_out(src, local, "--staging")
    else:
        if staging or storage_options:
            raise UsageError("--staging and --storage-option are for a URL OUT (s3://bucket/ds, ...)")
        local = Path(out)
        _check_out(src, local)
    t0 = time.perf_counter()
    source = scan(src, seed=seed, val_fraction=val_fraction)
    _make_out(local, "--staging" if remote else "OUT")
    identity = _settings_identity(
        src,
        source,
        settings,
        seed=seed,
        shard_size=shard_size,
        samples_per_shard=samples_per_shard,
        val_fraction=val_fraction,
        parts=parts,
    )
    job = dict(
        part=part,
        parts=parts,
        settings=settings,
        shard_size=shard_size,
        samples_per_shard=samples_per_shard,
        workers=workers,
        progress=progress,
        engine=engine,
        remote=remote,
    )
    try:
        if engine == "ray":
            from stoker.pipeline.deps import usable_cores

            from .ray_engine import session

            with session(ray_address, min(workers, usable_cores())):
                result = _run(local, source, identity, t0, job)
        else:
            result = _run(local, source, identity, t0, job)
    except OSError as e:
        raise _write_failed(e, local) from None
    return _checked(result, strict)


def merge_parts(out: str | Path, *, strict: bool = False) -> PackResult:
    """Write the manifests and rejects.jsonl of ``out`` once every ``parts`` run of :func:`pack` finished.

    Raises:
        UsageError: ``out`` is a URL or holds no pack, or parts are not finished (named).
        InputsRejected: ``strict`` and some inputs were rejected.
        WriteFailed: Writing ``out`` failed.
    """
    if is_url(out):
        raise UsageError(
            "--merge takes a local OUT: --part with a URL OUT is not supported (use --engine ray "
            "to pack on many machines)"
        )
    out, t0 = Path(out), time.perf_counter()
    try:
        totals = merge(out)
    except OSError as e:
        raise _write_failed(e, out) from None
    inputs = sum(s["num_inputs"] for s in (read_settings(out) or {}).get("splits", {}).values())
    return _checked(
        PackResult(out=str(out), inputs=inputs, splits=totals, run={}, seconds=time.perf_counter() - t0), strict
    )


def _checked(result: PackResult, strict: bool) -> PackResult:
    if strict and result.rejected and not result.up_to_date and result.parts == 1:
        raise InputsRejected(f"{result.rejected} input(s) rejected (--strict); see rejects.jsonl", result)
    return result


def _run(out: Path, source: Source, identity: dict, t0: float, job: dict) -> PackResult:
    """Pack every split of ``source`` into ``out`` (the staging folder of a URL OUT), then merge."""
    remote: Optional[Remote] = job["remote"]
    where = remote.store.url if remote else str(out)
    if remote is not None and read_settings(out) is None and not remote.store.is_empty():
        raise UsageError(
            f"OUT {where} is not empty and this machine holds no pack journal for it (in {out}); "
            f"use an empty location, or the --staging folder of the pack that wrote it"
        )
    claim(out, identity)
    run = {split: pack_part(out, split, source, **job) for split in source.splits}
    if remote is not None:
        remote.flush()  # every shard is up before the manifests are planned
    part, parts, splits = job["part"], job["parts"], list(source.splits)
    inputs = sum(len(v) for v in source.splits.values())
    worked = any(r["packed"] or r["rejected"] or r["restored"] for r in run.values())
    shard_ok = remote.shard_ok if remote else None
    if parts == 1 and not worked:
        totals = merged_totals(out, shard_ok)
        if totals is not None and (remote is None or remote.manifests_match(out, splits)):
            return PackResult(
                out=where, inputs=inputs, splits=totals, run=run, seconds=time.perf_counter() - t0, up_to_date=True
            )
    if parts > 1:
        return PackResult(
            out=where, inputs=inputs, splits={}, run=run, seconds=time.perf_counter() - t0, part=part, parts=parts
        )
    totals = merge(out, shard_ok)
    if remote is not None:
        remote.publish_manifests(out, splits)
    return PackResult(out=where, inputs=inputs, splits=totals, run=run, seconds=time.perf_counter() - t0)


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


def _settings_identity(
    src: Path,
    source: Source,
    settings: Settings,
    *,
    seed: int,
    shard_size: int,
    samples_per_shard: int,
    val_fraction: float,
    parts: int,
) -> dict:
    """Everything that determines the bytes of the pack: equal dicts -> equal output."""
    return {
        "journal_format": 1,
        "stoker_version": __version__,
        "source": str(src.resolve()),
        "seed": seed,
        "short_side": settings.short_side,
        "max_side": settings.max_side,
        "quality": settings.quality,
        "reencode": settings.reencode,
        "max_pixels": settings.max_pixels,
        "max_bytes": settings.max_bytes,
        "shard_size": 0 if samples_per_shard else shard_size,
        "samples_per_shard": samples_per_shard,
        "val_fraction": val_fraction,
        "parts": parts,
        "classes": source.classes,
        "splits": {
            s: {
                "num_inputs": len(items),
                "digest": source.digest(s),
                "skipped": source.skipped.get(s, 0),
                "scan_rejects": [list(r) for r in source.rejects.get(s, [])],
            }
            for s, items in source.splits.items()
        },
    }


def _write_failed(e: OSError, out: Path) -> StokerError:
    where = display_path(str(e.filename or out))
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return WriteFailed(
            f"disk full writing {where}: free space and rerun the same command "
            f"(finished shards are kept, nothing written is corrupt)"
        )
    return WriteFailed(
        f"cannot write {where}: {e.strerror or e}; fix it and rerun the same command (finished shards are kept)"
    )


def main(args: argparse.Namespace) -> int:
    try:
        if args.merge:
            if args.src or args.out:
                raise UsageError("--merge OUT takes no SRC/OUT arguments")
            result = merge_parts(args.merge, strict=args.strict)
        else:
            if not args.src or not args.out:
                raise UsageError("need SRC and OUT (or --merge OUT)")
            part, parts = parse_part(args.part)
            max_file_size = parse_size(args.max_file_size, "--max-file-size")
            shard_size = parse_size(args.shard_size)
            result = pack(
                args.src,
                args.out,
                short_side=args.short_side,
                max_side=args.max_side,
                quality=args.quality,
                reencode=args.reencode,
                max_pixels=args.max_pixels,
                max_file_size=max_file_size,
                shard_size=shard_size,
                samples_per_shard=args.samples_per_shard,
                seed=args.seed,
                val_fraction=args.val_fraction,
                workers=args.workers,
                part=part,
                parts=parts,
                engine=args.engine,
                ray_address=args.ray_address,
                strict=args.strict,
                storage_options=parse_storage_options(args.storage_option),
                staging=args.staging,
                progress=not args.quiet,
            )
    except InputsRejected as e:  # the pack is done: its summary, then the error
        _print(e.result)
        raise
    _print(result)
    return 0


def _print(result: PackResult) -> None:
    for line in result.notes():
        print(line, file=sys.stderr)
    print(result.summary())
