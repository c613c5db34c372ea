"""Check packed shards against their stoker.json: size and sha256 of every shard,
tar integrity, .idx equal to a fresh scan of the tar, labels in range, and
every image decoding as RGB (or --sample K random images per split).

DIR is a pack's OUT (all its splits) or one split folder. Prints one table row per
shard and exits 1 naming the shard and sample of every problem found.

examples:
  stoker verify /fast/imagenet-shards
  stoker verify /fast/imagenet-shards/val --sample 100
"""

from __future__ import annotations

import argparse
import io
import os
import random
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from stoker.pipeline.fsutil import sha256_file
from stoker.pipeline.index import IMAGE_EXTS, IdxFormatError, index_tar, read_idx, sample_key
from stoker.pipeline.manifest import MANIFEST_NAME, Manifest, ShardInfo, idx_path

from .errors import CheckFailed, UsageError

HELP = "check shards against stoker.json: checksums, tar, .idx, and that every image decodes"


@dataclass
class ShardReport:
    """What :func:`verify_shard` found in one shard."""

    split: str
    name: str
    samples: int = 0
    bytes: int = 0
    sha_ok: bool = False
    idx_ok: bool = False
    decoded: int = 0
    bad: int = 0
    skipped: int = 0
    problems: list[str] = field(default_factory=list)


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


def decode_check(data: bytes, *, require_rgb: bool = True) -> Optional[str]:
    """None when ``data`` decodes completely (to an RGB image, if ``require_rgb``),
    else what is wrong."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if require_rgb and im.mode != "RGB":
                return f"mode {im.mode}, not RGB"
    except Exception as e:  # any decoder failure is a finding, not a crash
        return f"does not decode: {str(e).strip() or type(e).__name__}"
    return None


def verify_shard(split_dir: str, split: str, info: ShardInfo, num_classes: int, check: Optional[list[int]],
                 skip: list[int], require_rgb: bool = True) -> ShardReport:
    """Check one shard; ``check`` lists the sample indices to decode (None: all),
    ``skip`` the ones the manifest marks as known-bad. Packed shards must hold RGB
    JPEGs; foreign (indexed) ones only need to decode."""
    tar = Path(split_dir) / info.name
    rep = ShardReport(split, info.name, skipped=len(skip))
    where = f"{split}/{info.name}"
    if not tar.exists():
        rep.problems.append(f"{where}: missing")
        return rep
    rep.bytes = os.path.getsize(tar)
    if rep.bytes != info.bytes:
        rep.problems.append(f"{where}: {rep.bytes} bytes, manifest says {info.bytes}")
    rep.sha_ok = sha256_file(tar) == info.sha256
    if not rep.sha_ok:
        rep.problems.append(f"{where}: sha256 differs from the manifest (corrupt or replaced)")
    try:
        samples = index_tar(tar)
    except (tarfile.TarError, OSError) as e:
        rep.problems.append(f"{where}: damaged tar: {e}")
        return rep
    rep.samples = len(samples)
    if len(samples) != info.num_samples:
        rep.problems.append(f"{where}: {len(samples)} samples, manifest says {info.num_samples}")
    try:
        rep.idx_ok = read_idx(idx_path(tar)) == samples
        if not rep.idx_ok:
            rep.problems.append(f"{where}: {idx_path(tar).name} does not match the tar (rerun `stoker index`)")
    except IdxFormatError as e:
        rep.problems.append(f"{where}: {e}")
    skip_set = set(skip)
    todo = range(len(samples)) if check is None else [i for i in check if i < len(samples)]
    with open(tar, "rb") as f:
        for i in todo:
            if i in skip_set:
                continue
            comps = {c.ext.lower(): c for c in samples[i]}
            label = f"{where} sample {i} (key {sample_key(samples[i])})"
            img = next((comps[e] for e in IMAGE_EXTS if e in comps), None)
            if img is None:
                rep.bad += 1
                rep.problems.append(f"{label}: no image component (has {', '.join(comps)})")
                continue
            if "cls" in comps:
                f.seek(comps["cls"].offset)
                raw = f.read(comps["cls"].size).strip()
                if not raw.isdigit() or (num_classes and int(raw) >= num_classes):
                    rep.problems.append(f"{label}: label {raw[:20]!r} is not a class index below {num_classes}")
            f.seek(img.offset)
            err = decode_check(f.read(img.size), require_rgb=require_rgb)
            if err:
                rep.bad += 1
                rep.problems.append(f"{label}: {err}")
            else:
                rep.decoded += 1
    return rep


def _run(job):
    return verify_shard(*job)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="a pack's OUT folder or one split folder")
    p.add_argument("--sample", type=int, default=0, metavar="K",
                   help="decode K random images per split instead of all (checksums and indexes are always checked)")
    p.add_argument("--seed", type=int, default=0, help="seed choosing the --sample images")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes checking shards in parallel")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    root = Path(args.dir)
    if not root.exists():
        raise UsageError(f"{root} does not exist")
    if args.sample < 0 or args.workers < 1:
        raise UsageError("--sample must be >= 0 and --workers >= 1")
    jobs = []
    for split_dir in find_splits(root):
        m = Manifest.load(split_dir)
        skips: dict[str, list[int]] = {}
        for shard, index in m.pack.get("skip", []):
            skips.setdefault(shard, []).append(int(index))
        picks: dict[int, list[int]] = {}
        if args.sample:
            rng = random.Random(args.seed)
            chosen = sorted(rng.sample(range(m.num_samples), min(args.sample, m.num_samples)))
            starts, acc = [], 0
            for s in m.shards:
                starts.append(acc)
                acc += s.num_samples
            for g in chosen:
                k = max(j for j, st in enumerate(starts) if st <= g)
                picks.setdefault(k, []).append(g - starts[k])
        for k, s in enumerate(m.shards):
            check = picks.get(k, []) if args.sample else None
            jobs.append((str(split_dir), split_dir.name, s, len(m.classes), check, skips.get(s.name, []),
                         "indexed_by" not in m.pack))
    reports: list[ShardReport] = []
    bar = tqdm(total=len(jobs), desc="verify", unit="shard", file=sys.stderr, disable=None if not args.quiet else True)
    if args.workers > 1 and len(jobs) > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(min(args.workers, len(jobs))) as pool:
            for rep in pool.imap(_run, jobs):
                reports.append(rep)
                bar.update(1)
    else:
        for job in jobs:
            reports.append(_run(job))
            bar.update(1)
    bar.close()
    _print_table(reports)
    problems = [p for r in reports for p in r.problems]
    if problems:
        for p in problems[:50]:
            print(f"  {p}", file=sys.stderr)
        if len(problems) > 50:
            print(f"  ... and {len(problems) - 50} more", file=sys.stderr)
        raise CheckFailed(f"{len(problems)} problem(s) in {len({(r.split, r.name) for r in reports if r.problems})} "
                          f"shard(s); first: {problems[0]}")
    total = sum(r.samples for r in reports)
    print(f"ok: {len(reports)} shards, {total:,} samples, {sum(r.decoded for r in reports):,} images decoded")
    return 0


def _print_table(reports: list[ShardReport]) -> None:
    w = max([len(f"{r.split}/{r.name}") for r in reports] + [5])
    print(f"{'shard':{w}} {'samples':>8} {'bytes':>13} {'sha256':>6} {'idx':>4} {'decoded':>8} {'bad':>5} {'skip':>5}")
    for r in reports:
        print(f"{r.split + '/' + r.name:{w}} {r.samples:>8,} {r.bytes:>13,} {'ok' if r.sha_ok else 'BAD':>6} "
              f"{'ok' if r.idx_ok else 'BAD':>4} {r.decoded:>8,} {r.bad:>5,} {r.skipped:>5,}")
