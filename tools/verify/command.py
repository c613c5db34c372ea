"""Check packed shards against their stoker.json: size and sha256 of every shard,
tar integrity, .idx equal to a fresh scan of the tar, labels in range, and every
image decoding with the Loader's decoders: its header check, pillow (the pil
backend) and, when DALI is installed, DALI's CPU decoder.

--sample K checks K random samples per split instead, at the cost of K samples: every
shard present with its size and .idx, then each drawn sample's tar headers, target and
image; it skips the shards' sha256, the full tar scans and the .idx comparisons.

DIR is a pack's OUT (all its splits) or one split folder, local or an fsspec URL
(s3://, gs://, https://, file://; the shards are downloaded to a temporary folder one split
at a time and checked there; with --sample only the drawn samples' shards). Prints one table
row per shard and exits 1 naming the shard and sample of every problem found. A full check is
journaled per shard (.stoker-verify/ in a split folder that can be written): killed and rerun,
it checks only the shards not done yet. --engine ray checks shards as Ray tasks.

examples:
  stoker verify /fast/imagenet-shards
  stoker verify /fast/imagenet-shards/val --sample 100
  stoker verify /shared/laion --engine ray --ray-address auto
  AWS_ENDPOINT_URL=http://minio:9000 stoker verify s3://bucket/imagenet-shards
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stoker.errors import CheckFailedError, UsageError, arg
from stoker.pipeline.fsutil import sha256_file
from stoker.pipeline.shards.idx import (
    IdxFormatError,
    TarFormatError,
    image_component,
    read_idx,
    sample_key,
    scan_tar,
)
from stoker.pipeline.shards.manifest import MANIFEST_NAME, Manifest, ShardInfo, idx_path, iter_skips
from stoker.pipeline.shards.paths import check_path
from stoker.pipeline.shards.table import manifest_digest
from stoker.pipeline.shards.targets import Target
from stoker.pipeline.storage import Store, is_url, parse_storage_options, storage_errors
from stoker.version import __version__

from .imagecheck import ImageChecker
from .report import ShardReport, VerifyResult
from .sampled import draw, sampled_reports, target_problem
from .shardjobs import engine_session, journal_at, run_shard_jobs, stamp

#: the folder (in a split's) of a full check's journal, removed once the split is checked
JOURNAL_DIR = ".stoker-verify"

HELP = "check shards against stoker.json: checksums, tar, .idx, and that every image decodes"


def find_splits(path: Path) -> list[Path]:
    """Split folders to check: ``path`` itself if it holds a manifest, else its
    subfolders that do."""
    if (path / MANIFEST_NAME).exists():
        return [path]
    if not path.is_dir():
        raise UsageError(f"{path} is not a folder")
    splits = sorted(p.parent for p in path.glob(f"*/{MANIFEST_NAME}"))
    if not splits:
        raise UsageError(f"no {MANIFEST_NAME} in {path} or its subfolders: is it a stoker pack?")
    return splits


def verify_shard(
    split_dir: str,
    split: str,
    info: ShardInfo,
    num_classes: int,
    check: list[int] | None,
    skip: list[int],
    require_rgb: bool = True,
    target: dict | None = None,
    classes: list[str] | None = None,
) -> ShardReport:
    """Check one shard; ``check`` lists the sample indices to decode (None: all),
    ``skip`` the ones the manifest marks as known-bad; ``target`` is the manifest's target
    (:class:`~stoker.pipeline.shards.targets.Target` as JSON; None: a class); ``classes`` the
    manifest's class names, which a ``cls`` may hold as the Loader reads it (a split made by
    ``stoker index --classes``). Packed shards must hold RGB or grayscale JPEGs; foreign
    (indexed) ones only need to decode."""
    target_kind = Target.from_json(target) if target else Target()
    tar = Path(split_dir) / info.name
    rep = ShardReport(split, info.name, skipped=len(skip))
    scan = _check_whole(tar, f"{split}/{info.name}", info, rep, split_dir)
    if scan is not None:
        todo = range(len(scan.samples)) if check is None else [i for i in check if i < len(scan.samples)]
        _check_samples(tar, scan, todo, set(skip), target_kind, num_classes, classes, require_rgb, rep)
    return rep


def _check_whole(tar: Path, where: str, info: ShardInfo, rep: ShardReport, split_dir: str):
    """The shard as a whole: present, its size, sha256, tar and ``.idx`` as the manifest says; its
    scan, or None when it cannot be read on."""
    if not tar.exists():
        rep.problems.append(f"{where}: missing")
        return None
    rep.bytes = os.path.getsize(tar)
    if rep.bytes != info.bytes:
        rep.problems.append(f"{where}: {rep.bytes} bytes, manifest says {info.bytes}")
    try:
        rep.sha_ok = sha256_file(tar) == info.sha256
    except OSError as e:
        rep.problems.append(f"{where}: cannot be read: {e.strerror or e}")
        return None
    if not rep.sha_ok:
        rep.problems.append(f"{where}: sha256 differs from the manifest (corrupt or replaced)")
    try:
        scan = scan_tar(tar)
    except TarFormatError as e:
        rep.problems.append(f"{where}: {e}")
        return None
    rep.samples = len(scan.samples)
    if len(scan.samples) != info.num_samples:
        rep.problems.append(f"{where}: {len(scan.samples)} samples, manifest says {info.num_samples}")
    try:
        rep.idx_ok = read_idx(idx_path(tar)) == scan.samples
        if not rep.idx_ok:
            rep.problems.append(
                f"{where}: {idx_path(tar).name} does not match the tar (rerun `stoker index {split_dir}`)"
            )
    except IdxFormatError as e:
        rep.problems.append(f"{where}: {e}")
    return scan


def _check_samples(tar: Path, scan, todo, skip_set: set, target: Target, num_classes, classes, require_rgb, rep):
    """Each sample of ``todo`` not skipped: its image, its target as its kind checks it, and that
    the image decodes."""
    names = {c: i for i, c in enumerate(classes or ())}
    where = f"{rep.split}/{rep.name}"
    checker = ImageChecker(require_rgb=require_rgb)
    pending: list[tuple[str, bytes]] = []

    def flush() -> None:
        for (label, _), err in zip(pending, checker.check([d for _, d in pending]), strict=True):
            if err:
                rep.bad += 1
                rep.problems.append(f"{label}: {err}")
            else:
                rep.decoded += 1
        pending.clear()

    def bad(label: str, why: str) -> None:
        rep.bad += 1
        rep.problems.append(f"{label}: {why}")

    with open(tar, "rb") as f:
        for i in todo:
            if i in skip_set:
                continue
            sample = scan.samples[i]
            label = f"{where} sample {i} (key {sample_key(sample)})"
            if i in scan.problems:
                bad(label, scan.problems[i])
                continue
            comps = {c.ext.lower(): c for c in sample}
            img = image_component(sample)
            if img is None:
                bad(label, f"no image component (has {', '.join(comps)})")
                continue
            member = comps.get(target.member.lower())
            if member is None:
                bad(label, target.missing())
                continue
            why = target_problem(
                f, target, member.offset, member.size, functools.partial(_read, f, img), num_classes, names
            )
            if why:
                bad(label, why)
                continue
            pending.append((label, _read(f, img)))
            if len(pending) >= checker.batch_size:
                flush()
    flush()


def _read(f, comp) -> bytes:
    f.seek(comp.offset)
    return f.read(comp.size)


def _verify_job(*job) -> dict:
    """:func:`verify_shard` as JSON (a journal line, a Ray task's result)."""
    return dataclasses.asdict(verify_shard(*job))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON (VerifyResult.to_dict())")
    p.add_argument(
        "dir",
        metavar="DIR",
        help="a pack's OUT folder or one split folder (a path or an fsspec URL: s3://, gs://, https://, file://)",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=0,
        metavar="K",
        help="check K random samples per split (tar headers, target, decoding) and the shard list (present, "
        "sizes, .idx) instead of everything: skips the sha256 and the full tar and .idx scans",
    )
    p.add_argument("--seed", type=int, default=0, help="seed choosing the --sample images")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes checking shards in parallel")
    p.add_argument(
        "--engine",
        choices=("local", "ray"),
        default="local",
        help="local: a process pool on this machine (default); ray: a Ray task per shard (pip install "
        "stoker[ray]) on --ray-address, or on a local Ray with --workers CPUs",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="the Ray cluster to run on (auto, ray://head:10001; default: a local Ray on this machine)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="K=V",
        help="fsspec option for a URL (repeatable; e.g. endpoint_url=http://host:9000, anon=true); "
        "credentials also come from the AWS_* environment variables",
    )


def remote_splits(url: str, storage_options: dict) -> list[str]:
    """Split URLs to check: ``url`` itself if it holds a manifest, else its subfolders that do."""
    store = Store(url, storage_options)
    if store.read_bytes(MANIFEST_NAME) is not None:
        return [store.url]
    with storage_errors(store.url):
        try:
            entries = store.fs.ls(store.root, detail=True)
        except FileNotFoundError:
            raise UsageError(f"{url} does not exist") from None
    subs = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    splits = [store.url_of(d) for d in subs if store.read_bytes(f"{d}/{MANIFEST_NAME}") is not None]
    if not splits:
        raise UsageError(f"no {MANIFEST_NAME} in {url} or its subfolders: is it a stoker pack?")
    return splits


def download_split(url: str, storage_options: dict, dest: Path, *, sample: int = 0, seed: int = 0) -> Path:
    """The manifest, every shard and ``.idx`` it names (with ``sample``: the ``.idx`` files and
    the shards of the samples :func:`~.sampled.draw` draws), as stored (unchecked: verify checks
    them), into ``dest``. A missing shard or ``.idx`` stays missing (and is reported)."""
    from concurrent.futures import ThreadPoolExecutor

    store = Store(url, storage_options)
    dest.mkdir(parents=True)
    data = store.read_bytes(MANIFEST_NAME)
    if data is None:
        raise UsageError(f"no {MANIFEST_NAME} at {url}")
    (dest / MANIFEST_NAME).write_bytes(data)
    manifest = Manifest.load(dest)
    wanted = {s.name for s in manifest.shards}
    if sample:
        starts = np.cumsum([0] + [s.num_samples for s in manifest.shards])
        drawn = np.searchsorted(starts, draw(manifest.num_samples, sample, seed), side="right") - 1
        wanted = {manifest.shards[int(k)].name for k in set(drawn.tolist())}
    names = [n for s in manifest.shards for n in ((s.name,) if s.name in wanted else ()) + (idx_path(s.name).name,)]
    if manifest.pack.get("skip_file"):
        names.append(manifest.pack["skip_file"])

    def get(name: str) -> None:
        try:
            store.get_file(name, dest / name)
        except FileNotFoundError:
            pass

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(get, names))
    return dest


def verify(
    path: str | Path,
    *,
    sample: int = 0,
    seed: int = 0,
    workers: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: bool = False,
    engine: str = "local",
    ray_address: str | None = None,
) -> VerifyResult:
    """Check the shards of a pack (all its splits) or of one split against their stoker.json.

    Args:
        path: A pack's OUT or one split folder: a path, or an fsspec URL (its shards are
            downloaded to a temporary folder one split at a time).
        sample: Check this many random samples per split instead of everything (0:
            everything): the shard list (present, sizes, ``.idx``) and each drawn sample's tar
            headers, target and image, at the cost of those samples; the shards' sha256 and the
            full tar and ``.idx`` scans are skipped (:mod:`.sampled`).
        seed: Seed choosing the ``sample`` images.
        workers: Processes checking shards in parallel (None: the CPU count).
        storage_options: fsspec options of a URL ``path``.
        progress: Show a progress bar on stderr.
        engine: ``"local"`` (``workers`` processes) or ``"ray"`` (a task per shard on the Ray
            cluster at ``ray_address``, or a local Ray with ``workers`` CPUs).
        ray_address: The Ray cluster (``"auto"``, ``"ray://head:10001"``).

    Returns:
        The :class:`VerifyResult`; ``ok`` is False when any shard has a problem.

    Raises:
        UsageError: A bad setting, or ``path`` is missing or holds no stoker.json.
    """
    workers = (os.cpu_count() or 1) if workers is None else workers
    if sample < 0 or workers < 1:
        raise UsageError(f"{arg('sample')} must be >= 0 and {arg('workers')} >= 1")
    if is_url(path) and engine == "ray":
        raise UsageError(
            f"{arg('engine', 'ray')} checks shards where they are stored, on every node: a URL's are downloaded "
            f"to this machine, so check it without {arg('engine', 'ray')} (or check a shared-filesystem copy with it)"
        )
    how = dict(sample=sample, seed=seed, workers=workers, progress=progress, engine=engine)
    with engine_session(engine, ray_address, workers):
        if is_url(path):
            options = dict(storage_options or {})
            # one split at a time: the temporary copy is at most one split's size
            reports: list[ShardReport] = []
            for url in remote_splits(str(path), options):
                with tempfile.TemporaryDirectory(prefix="stoker-verify-") as tmp:
                    where = Path(tmp) / url.rsplit("/", 1)[-1]
                    local = download_split(url, options, where, sample=sample, seed=seed)
                    sizes = Store(url, options).sizes() if sample else None
                    reports += _check(local, remote_sizes=sizes, **how)
        else:
            if storage_options:
                raise UsageError(
                    f"{arg('storage_options')} is for a URL (s3://, gs://, https://, file://); {path} is a local path"
                )
            root = Path(path)
            check_path(root, "pack")  # the line every command gives a wrong path
            reports = [r for split_dir in find_splits(root) for r in _check(split_dir, **how)]
    return VerifyResult(path=str(path), shards=reports, ok=not any(r.problems for r in reports))


def _check(
    split_dir: Path,
    *,
    sample: int,
    seed: int,
    workers: int,
    progress: bool,
    engine: str,
    remote_sizes: dict | None = None,
) -> list[ShardReport]:
    """One split's reports: :func:`~.sampled.sampled_reports` with ``sample``, else every shard
    checked whole (:func:`verify_shard`), journaled and in parallel."""
    if sample:
        return sampled_reports(split_dir, sample, seed, remote_sizes=remote_sizes)
    m = Manifest.load(split_dir)
    skips: dict[str, list[int]] = {}
    for entry in iter_skips(split_dir, m):
        if isinstance(entry, (list, tuple)) and len(entry) in (2, 3):
            skips.setdefault(entry[0], []).append(int(entry[1]))
    jobs = [
        (
            str(split_dir),
            split_dir.name,
            s,
            len(m.classes),  # a mask is held to its own declared classes
            None,
            skips.get(s.name, []),
            "indexed_by" not in m.pack,
            m.target.to_json(),
            m.classes,  # the names a cls may hold, as the Loader reads it
        )
        for s in m.shards
    ]
    settings = {"stoker": __version__, "manifest": manifest_digest(split_dir).hex()}
    journal = journal_at(split_dir, JOURNAL_DIR, settings)
    found = run_shard_jobs(
        _verify_job,
        jobs,
        [s.name for s in m.shards],
        [stamp(split_dir / s.name, idx_path(split_dir / s.name)) for s in m.shards],
        journal=journal,
        engine=engine,
        workers=workers,
        progress=progress,
        desc=f"verify {split_dir.name}",
        what="verifying",
    )
    journal.remove()
    return [ShardReport(**r) for r in found]


def main(args: argparse.Namespace) -> int:
    result = verify(
        args.dir,
        sample=args.sample,
        seed=args.seed,
        workers=args.workers,
        storage_options=parse_storage_options(args.storage_option),
        progress=not args.quiet,
        engine=args.engine,
        ray_address=args.ray_address,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=1, default=str))
        if not result.ok:
            raise CheckFailedError(result.failure())
        return 0
    print(result.table())
    if not result.ok:
        for line in result.problem_lines():
            print(line, file=sys.stderr)
        raise CheckFailedError(result.failure())
    print(result.summary())
    return 0
