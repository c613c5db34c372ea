"""``pack()`` and ``merge_parts()``: the library behind ``stoker pack`` (its flags: :mod:`.command`).

The scan of SRC is :mod:`.sources` (a reader per kind of SRC), the per-image work :mod:`.sanitize`,
the shard writing and resume :mod:`.engine` and :mod:`.journal`, a URL OUT :mod:`.remote`, Ray
:mod:`.ray_engine`.
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import json
import operator
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stoker.errors import InputsRejectedError, StokerError, UsageError, WriteFailedError, arg
from stoker.pipeline.shards.table import write_split_table
from stoker.pipeline.shards.targets import IGNORE_INDEX, Target, TargetStats
from stoker.pipeline.storage import Store, default_cache_dir, is_url, url_key
from stoker.pipeline.workers import check_not_bootstrapping
from stoker.version import __version__

from .engine import pack_part
from .journal import REJECTS_NAME, claim, merge, merged_totals, read_settings
from .options import Images, Masks, Ray, Reading, Shards, setting
from .remote import Remote
from .result import PackResult
from .sanitize import Settings
from .sources import Source, display_path, scan


def pack(
    src: str | Path,
    out: str | Path,
    *,
    val_fraction: float = 0.0,
    seed: int = 0,
    masks: str | Path | Masks | None = None,
    reading: Reading | None = None,
    images: Images | None = None,
    shards: Shards | None = None,
    workers: int | None = None,
    engine: str | Ray = "local",
    part: tuple[int, int] | None = None,
    strict: bool = False,
    progress: bool = False,
    storage_options: Mapping[str, Any] | None = None,
    staging: str | Path | None = None,
) -> PackResult:
    """Pack ``src`` into shards in ``out`` (see the module doc); rerun the same call to resume.

    Each group of settings is a frozen dataclass of :mod:`~stoker.tools.pack.options` (also
    ``stoker.Images``, ...), None meaning its defaults: ``images=Images(short_side=0)``,
    ``shards=Shards(samples=64)``, ``reading=Reading(source="coco")``.

    Args:
        src: An ImageFolder tree, a tree with train/ and val/, a CSV/TSV of path,label (or
            path,value...) rows, a CSV of image,mask pairs, a parquet table (file, folder or URL),
            or with ``masks`` a folder of images at any depth; any source a registered reader
            recognizes (:mod:`~stoker.tools.pack.sources`).
        out: The output folder (created), or a URL (s3://bucket/ds, gs://..., any fsspec URL).
        val_fraction: A seeded, stratified fraction of the images for val/ (when SRC has no val/).
        seed: Seed of the sample shuffle and of the val split.
        masks: A mask tree parallel to ``src`` (same relative paths and stems): a segmentation
            pack, each image stored with its mask; or a :class:`~.options.Masks` (the tree, the
            class count and the ignored value; without a path, for a source that carries its
            own masks: a CSV of image,mask pairs).
        reading: How SRC is read (:class:`~.options.Reading`: the reader, what a CSV's targets
            hold, a table's columns, official split lists, the frame of boxes).
        images: What is done to each image (:class:`~.options.Images`: size, quality,
            re-encoding, the limits an input must keep).
        shards: How the shards are cut (:class:`~.options.Shards`: bytes or samples per shard).
        workers: Processes (or Ray CPUs) sanitizing images (None: the CPU count).
        engine: ``"local"`` (a process pool) or ``"ray"`` (Ray tasks on a local Ray; the output
            is the same), or a :class:`~.options.Ray` naming the cluster (``Ray(address="auto")``).
        part: ``(i, n)``: pack only part i (0-based) of n of the shuffled list, then
            :func:`merge_parts` (None: the whole).
        strict: Raise :class:`InputsRejectedError` when any input was rejected.
        progress: Show a progress bar on stderr.
        storage_options: fsspec options of a URL ``out`` or a URL ``src``.
        staging: The local folder of a URL ``out`` for the journal and the shards on their way up
            (None: under ~/.cache/stoker/pack-staging).

    Returns:
        The :class:`PackResult`.

    Raises:
        UsageError: A bad setting or path, or ``out`` holds something else.
        InputsRejectedError: ``strict`` and some inputs were rejected (the pack is finished).
        WriteFailedError: Writing ``out`` failed (disk full, ...); rerun the same call.
        CheckFailedError: A shard deleted since it was packed rebuilds differently (SRC changed).
    """
    check_not_bootstrapping()  # before the part's lock: a worker importing an unguarded script would wait on it
    reading, images, shards = _group(reading, Reading), _group(images, Images), _group(shards, Shards)
    masks = _masks(masks)
    engine, ray_address = _engine(engine)
    part, parts = _part(part)  # the command checks I/N first
    mask_flags = masks.num_classes is not None or masks.ignore_index != IGNORE_INDEX
    settings, workers = _checked_settings(
        src,
        masks=masks,
        mask_flags=mask_flags,
        reading=reading,
        images=images,
        shards=shards,
        val_fraction=val_fraction,
        workers=workers,
    )
    src = _existing_src(src)
    local, remote = _out_place(src, out, parts=parts, storage_options=storage_options, staging=staging)
    t0 = time.perf_counter()
    scanned = scan(
        src,
        seed=seed,
        val_fraction=val_fraction,
        source=reading.source,
        targets=reading.targets,
        masks=Path(masks.path) if masks.path is not None else None,
        num_classes=masks.num_classes,
        ignore_index=masks.ignore_index,
        image_column=reading.image_column,
        target_column=reading.target_column,
        weight_column=reading.weight_column,
        train_list=Path(reading.train_list) if reading.train_list is not None else None,
        val_list=Path(reading.val_list) if reading.val_list is not None else None,
        storage_options=dict(storage_options or {}) if is_url(src) else {},
        box_frame=reading.box_frame,
    )
    if not scanned.target.spatial and mask_flags:
        raise UsageError(
            f"{setting('num_classes')} and {setting('ignore_index')} are for masks ({arg('masks')}, or a source "
            "of masks)"
        )
    if scanned.target.spatial and images.short_side is None and settings.short_side:
        settings = dataclasses.replace(settings, short_side=0)  # segmentation crops: keep the size
    _make_out(local, arg("staging") if remote else "OUT")
    identity = _settings_identity(
        scanned,
        settings,
        seed=seed,
        shard_size=shards.size,
        samples_per_shard=shards.samples,
        val_fraction=val_fraction,
        parts=parts,
    )
    job = dict(
        part=part,
        parts=parts,
        settings=settings,
        shard_size=shards.size,
        samples_per_shard=shards.samples,
        workers=workers,
        progress=progress,
        engine=engine,
        remote=remote,
    )
    try:
        result = _run_engine(engine, ray_address, workers, local, scanned, identity, t0, job)
    except OSError as e:
        raise _write_failed(e, local) from None
    return _checked(result, strict, local, scanned.reader.describe_path_rule())


def _group(value, kind: type):
    """``value``, a group of :func:`pack`'s settings (None: the defaults); another type is one line."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise UsageError(
            f"{arg(kind.__name__.lower())} must be stoker.{kind.__name__}(...) or None, got {type(value).__name__}"
        )
    return value


def _masks(masks) -> Masks:
    """:func:`pack`'s ``masks`` as a :class:`Masks` (a path is ``Masks(path)``; None: no masks)."""
    if masks is None:
        return Masks()
    if isinstance(masks, (str, os.PathLike)):
        return Masks(masks)
    if not isinstance(masks, Masks):
        raise UsageError(f"{arg('masks')} must be a path, stoker.Masks(...) or None, got {type(masks).__name__}")
    return masks


def _engine(engine) -> tuple[str, str | None]:
    """:func:`pack`'s ``engine`` as ``(name, Ray address)``: ``"ray"`` is ``Ray()``."""
    if isinstance(engine, Ray):
        return "ray", engine.address
    if not isinstance(engine, str):
        raise UsageError(f"{arg('engine')} must be local, ray or stoker.Ray(...), got {type(engine).__name__}")
    if engine not in ("local", "ray"):
        raise UsageError(f"{arg('engine')} must be local or ray, got {engine!r}")
    return engine, None


def _part(part) -> tuple[int, int]:
    """:func:`pack`'s ``part`` as ``(i, n)`` (None: ``(0, 1)``, the whole)."""
    if part is None:
        return 0, 1
    try:
        i, n = (operator.index(x) for x in part)
    except (TypeError, ValueError):
        raise UsageError(f"{arg('part')} must be (i, n), two ints, or None, got {part!r}") from None
    if not 0 <= i < n:
        raise UsageError(f"{arg('part', (i, n))}: should be (i, n) with 0 <= i < n")
    return i, n


def _existing_src(src: str | Path) -> str | Path:
    """``src`` as a Path (a URL as it is); one line when a local SRC does not exist."""
    if is_url(src):
        return src
    if not Path(src).exists():
        raise UsageError(f"SRC {src} does not exist")
    return Path(src)


def _checked_settings(
    src,
    *,
    masks: Masks,
    mask_flags: bool,
    reading: Reading,
    images: Images,
    shards: Shards,
    val_fraction: float,
    workers: int | None,
) -> tuple[Settings, int]:
    """:func:`pack`'s arguments checked (a bad one is a one-line UsageError): the image settings
    (``short_side`` None: 256, or 0 with masks) and the worker count."""
    if masks.path is None and mask_flags and not (is_url(src) or Path(src).is_file() or reading.source != "auto"):
        raise UsageError(f"{setting('num_classes')} and {setting('ignore_index')} are for masks (give {arg('masks')})")
    if masks.path is not None and reading.targets != "auto":
        raise UsageError(f"{setting('targets')} is for a CSV's columns; with {arg('masks')} the target is the mask")
    if masks.num_classes is not None and not 1 <= masks.num_classes <= 256:
        raise UsageError(f"{setting('num_classes')} must be in 1..256 (masks are uint8), got {masks.num_classes}")
    short_side = images.short_side
    if short_side is None:
        short_side = 0 if masks.path is not None else 256
    try:
        settings = Settings(
            short_side=short_side,
            max_side=images.max_side,
            quality=images.quality,
            reencode=images.reencode,
            max_pixels=images.max_pixels,
            max_bytes=images.max_file_size,
            mask_classes=masks.num_classes or 0,
            ignore_index=masks.ignore_index,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    if shards.size < 1:
        raise UsageError(f"{setting('shard_size')} must be positive, got {shards.size}")
    if shards.samples < 0:
        raise UsageError(f"{setting('samples_per_shard')} must be >= 0, got {shards.samples}")
    if not 0.0 <= val_fraction < 1.0:
        raise UsageError(f"{arg('val_fraction')} must be in [0, 1), got {val_fraction}")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise UsageError(f"{arg('workers')} must be >= 1, got {workers}")
    return settings, workers


def _out_place(src, out, *, parts: int, storage_options, staging) -> tuple[Path, Remote | None]:
    """Where the pack is written: ``(local folder, None)``, or for a URL OUT ``(staging folder,
    the remote it is uploaded to)`` (the store is checked reachable before any work)."""
    remote: Remote | None = None
    if is_url(out):
        if parts > 1:
            raise UsageError(
                f"{arg('part')} with a URL {arg('out')} is not supported: use {arg('engine', 'ray')} to pack on "
                "many machines, or pack the parts into a shared folder"
            )
        options = dict(storage_options or {})
        store = Store(str(out), options)
        store.check()  # reachable, bucket exists: before any work
        local = Path(staging) if staging else default_cache_dir() / "pack-staging" / url_key(str(out), options)
        remote = Remote(store, local)
        _check_out(src, local, arg("staging"))
    else:
        if staging or (storage_options and not is_url(src)):
            raise UsageError(
                f"{arg('staging')} and {arg('storage_options')} are for a URL {arg('out')} (s3://bucket/ds, ...)"
            )
        local = Path(out)
        _check_out(src, local)
    return local, remote


def _run_engine(engine, ray_address, workers, local, scanned, identity, t0, job) -> PackResult:
    """:func:`_run` here, or in a Ray session of ``workers`` CPUs (``engine="ray"``)."""
    if engine == "ray":
        from stoker.pipeline.deps import usable_cores

        from .ray_engine import session

        with session(ray_address, min(workers, usable_cores())):
            return _run(local, scanned, identity, t0, job)
    return _run(local, scanned, identity, t0, job)


def merge_parts(out: str | Path, *, strict: bool = False) -> PackResult:
    """Write the manifests and rejects.jsonl of ``out`` once every ``parts`` run of :func:`pack` finished.

    Raises:
        UsageError: ``out`` is a URL or holds no pack, or parts are not finished (named).
        InputsRejectedError: ``strict`` and some inputs were rejected.
        WriteFailedError: Writing ``out`` failed.
    """
    if is_url(out):
        raise UsageError(
            f"merging takes a local {arg('out')}: {arg('part')} with a URL {arg('out')} is not supported (use "
            f"{arg('engine', 'ray')} to pack on many machines)"
        )
    out, t0 = Path(out), time.perf_counter()
    try:
        totals = merge(out)
        write_tables(out, list(totals))
    except OSError as e:
        raise _write_failed(e, out) from None
    inputs = sum(s["num_inputs"] for s in (read_settings(out) or {}).get("splits", {}).values())
    settings = read_settings(out) or {}
    target = Target.from_json(settings["target"]) if "target" in settings else Target()
    targets, found = describe_targets(target, settings, totals)
    result = PackResult(
        out=str(out),
        inputs=inputs,
        splits=totals,
        run={},
        seconds=time.perf_counter() - t0,
        targets=targets,
        targets_found=found,
        found_label=found_label(target),
    )
    return _checked(result, strict, out)


def _checked(result: PackResult, strict: bool, out: Path, path_rule: str = "") -> PackResult:
    if result.parts == 1:
        failed = _mostly_rejected(out, result, path_rule)
        if failed:
            raise InputsRejectedError(failed, result)
    if strict and result.rejected and not result.up_to_date and result.parts == 1:
        raise InputsRejectedError(f"{result.rejected} input(s) rejected ({arg('strict')}); see rejects.jsonl", result)
    return result


def _mostly_rejected(out: Path, result: PackResult, path_rule: str) -> str | None:
    """The one line of a pack that packed nothing, or rejected most inputs for one reason (the
    reason, an example, and the rule their paths follow when they were not found), else None."""
    total = result.packed + result.rejected
    if not result.rejected or (result.packed and result.rejected * 2 <= total):
        return None
    try:
        rows = [json.loads(line) for line in (out / REJECTS_NAME).read_text(encoding="utf-8").splitlines()]
    except (OSError, ValueError):
        return None
    reasons = collections.Counter(r["reason"] for r in rows)
    if not reasons:
        return None
    reason, n = reasons.most_common(1)[0]
    if result.packed and n * 2 <= total:
        return None  # many rejects, but for many reasons: the summary and rejects.jsonl say them
    example = next(r["path"] for r in rows if r["reason"] == reason)
    what = "nothing was packed: " if not result.packed else ""
    rule = f"; {path_rule}" if path_rule and "No such file" in reason else ""
    return (
        f"{what}{n:,} of {total:,} inputs were rejected for one reason: {reason} (e.g. {example}){rule}; "
        f"see {result.out.rstrip('/')}/{REJECTS_NAME}"
    )


def _run(out: Path, source: Source, identity: dict, t0: float, job: dict) -> PackResult:
    """Pack every split of ``source`` into ``out`` (the staging folder of a URL OUT), then merge."""
    remote: Remote | None = job["remote"]
    where = remote.store.url if remote else str(out)
    if remote is not None and read_settings(out) is None and not remote.store.is_empty():
        raise UsageError(
            f"OUT {where} is not empty and this machine holds no pack journal for it (in {out}); "
            f"use an empty location, or the {arg('staging')} folder of the pack that wrote it"
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
            out=where,
            inputs=inputs,
            splits={},
            run=run,
            seconds=time.perf_counter() - t0,
            part=part,
            parts=parts,
            hidden=source.hidden,
            val_only=source.val_only,
            scan_notes=source.notes,
            image_settings=_image_settings(job["settings"]),
        )
    totals = merge(out, shard_ok)
    if remote is None:
        write_tables(out, splits)
    else:
        remote.publish_manifests(out, splits)
    targets, found = describe_targets(source.target, {"classes": source.classes}, totals)
    return PackResult(
        out=where,
        inputs=inputs,
        splits=totals,
        run=run,
        seconds=time.perf_counter() - t0,
        targets=targets,
        targets_found=found,
        found_label=found_label(source.target),
        hidden=source.hidden,
        val_only=source.val_only,
        scan_notes=source.notes,
        image_settings=_image_settings(job["settings"]),
    )


def _image_settings(settings: Settings) -> dict:
    """What :meth:`PackResult.stored_line` says of how images were stored."""
    return {"short_side": settings.short_side, "max_side": settings.max_side, "quality": settings.quality}


def write_tables(out: Path, splits: list[str]) -> None:
    """Each split's binary sample table (``stoker.index``, beside its manifest), so no Loader
    rank has to build it from the ``.idx`` files (:mod:`stoker.pipeline.shards.table`)."""
    for split in splits:
        write_split_table(out / split)


def found_label(target: Target) -> str:
    """What the summary's line of what was found starts with: the kind's own name in the plural
    (``masks:``, ``boxes:``)."""
    return target.name if target.name.endswith("s") else f"{target.name}s"


def describe_targets(target: Target, settings: dict, totals: dict | None = None) -> tuple[str, str]:
    """The summary's ``targets:`` line (the kind; the classes of a class or multi-label pack; what
    the kind says of its statistics, train's) and a ``found`` line (a mask pack: the values found)."""
    stats_json = next((t["target_stats"] for t in (totals or {}).values() if "target_stats" in t), None)
    stats = TargetStats.from_json(stats_json) if stats_json is not None else None
    return target.summary(len(settings.get("classes") or []), stats)


def _check_out(src: Path | str, out: Path, what: str = "OUT") -> None:
    rs, ro = (None if is_url(src) else Path(src).resolve()), out.resolve()
    if rs is not None and rs.is_dir() and (ro == rs or rs in ro.parents):  # it would pack its own output
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
    extra = {}
    if source.target.format > 1:  # a class pack's identity is as it always was
        extra["target"] = source.target.to_json()
    if source.target.spatial:
        extra["mask_classes"] = settings.mask_classes
    if source.class_ids is not None:  # the dataset's own id of each class (COCO's category ids)
        extra["category_ids"] = list(source.class_ids)
    if source.target.follows_crop and source.reader.options.box_frame != "auto":
        extra["box_frame"] = source.reader.options.box_frame
    return {
        **extra,
        **source.reader.identity(),  # "source": what SRC is (and "masks": a mask tree)
        "journal_format": 1,
        "stoker_version": __version__,
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
        return WriteFailedError(
            f"disk full writing {where}: free space and rerun the same command "
            f"(finished shards are kept, nothing written is corrupt)"
        )
    return WriteFailedError(
        f"cannot write {where}: {e.strerror or e}; fix it and rerun the same command (finished shards are kept)"
    )
