"""Make foreign WebDataset shards loadable by stoker: write a DALI .idx next to
each tar and a stoker.json in their folder.

Works on tars written by webdataset's ShardWriter/TarWriter, GNU tar, or anything
with WebDataset's key rule (members sharing a name up to the first dot form one
sample). Keys can be anything; images may be jpg, jpeg or png (what the loader decodes);
labels come from cls members (integers as text). Unless --no-check, every
image is decoded once and samples that do not decode, or lack an image or a
label, are listed in the manifest under pack.skip as [shard, index] so the
loader leaves them out.

examples:
  stoker index /data/laion-shards/*.tar
  stoker index /data/shards --classes cat,dog,bird
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
import tarfile
from pathlib import Path

from stoker import __version__
from stoker.pipeline.fsutil import sha256_file
from stoker.pipeline.index import IMAGE_EXTS, write_idx
from stoker.pipeline.index import index_tar as scan_tar
from stoker.pipeline.manifest import Manifest, ShardInfo, idx_path

from .errors import CheckFailed, UsageError
from .verify import decode_check

HELP = "write .idx files and a stoker.json for foreign WebDataset shards"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("shards", nargs="+", metavar="SHARD", help="tar files, or one folder holding them (all in one folder)")
    p.add_argument("--classes", metavar="NAMES",
                   help="class names: comma-separated, or @FILE with one per line (default: '0'..'max cls')")
    p.add_argument("--no-check", action="store_true", help="do not decode the images (faster; nothing is skipped)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes indexing shards in parallel")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _tars(args_shards: list[str]) -> list[Path]:
    paths = [Path(s) for s in args_shards]
    if len(paths) == 1 and paths[0].is_dir():
        paths = sorted(paths[0].glob("*.tar"))
        if not paths:
            raise UsageError(f"no .tar files in {args_shards[0]}")
    for p in paths:
        if not p.is_file():
            raise UsageError(f"{p} is not a file")
    dirs = {p.resolve().parent for p in paths}
    if len(dirs) > 1:
        raise UsageError("all shards must be in one folder (its stoker.json describes them together)")
    names = [p.name for p in paths]
    if len(set(names)) != len(names):
        raise UsageError("a shard is listed twice")
    return sorted(paths, key=lambda p: p.name)


def _class_names(spec: str | None) -> list[str] | None:
    if not spec:
        return None
    if spec.startswith("@"):
        try:
            text = Path(spec[1:]).read_text()
        except OSError as e:
            raise UsageError(f"cannot read --classes file {spec[1:]}: {e.strerror}") from None
        names = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise UsageError("--classes is empty")
    return names


def index_one(tar: str, check: bool) -> dict:
    """Write ``tar``'s .idx and return what the manifest needs: its ShardInfo, the
    samples to skip as ``(index, reason)``, image extensions seen, the largest label."""
    tar_path = Path(tar)
    try:
        samples = scan_tar(tar_path)
    except (tarfile.TarError, OSError) as e:
        return {"error": f"{tar} is not a readable tar: {e}"}
    write_idx(idx_path(tar_path), samples)
    skips: list[tuple[int, str]] = []
    exts: set[str] = set()
    max_label = -1
    with open(tar_path, "rb") as f:
        for i, sample in enumerate(samples):
            comps = {c.ext.lower(): c for c in sample}
            img = next((comps[e] for e in IMAGE_EXTS if e in comps), None)
            why = None
            if img is None:
                why = "no image"
            elif "cls" not in comps:
                why = "no cls label"
            else:
                exts.add(img.ext)
                f.seek(comps["cls"].offset)
                raw = f.read(comps["cls"].size).strip()
                if not raw.isdigit():
                    why = "cls is not an integer"
                else:
                    max_label = max(max_label, int(raw))
                    if check:
                        f.seek(img.offset)
                        if decode_check(f.read(img.size), require_rgb=False):
                            why = "image does not decode"
            if why:
                skips.append((i, why))
    info = ShardInfo(tar_path.name, len(samples), os.path.getsize(tar_path), sha256_file(tar_path))
    return {"info": info, "skips": skips, "exts": exts, "max_label": max_label}


def _index_job(job: tuple[str, bool]) -> dict:
    return index_one(*job)


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    tars = _tars(args.shards)
    classes = _class_names(args.classes)
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    jobs = [(str(t), not args.no_check) for t in tars]
    bar = tqdm(total=len(jobs), desc="index", unit="shard", file=sys.stderr, disable=None if not args.quiet else True)
    with contextlib.ExitStack() as stack:
        if args.workers > 1 and len(jobs) > 1:
            import multiprocessing as mp

            pool = stack.enter_context(mp.get_context("fork").Pool(min(args.workers, len(jobs))))
            results = pool.imap(_index_job, jobs)
        else:
            results = map(_index_job, jobs)
        found = []
        for r in results:
            if "error" in r:
                raise CheckFailed(r["error"])
            found.append(r)
            bar.update(1)
    bar.close()
    shards = [r["info"] for r in found]
    skip = [[r["info"].name, i] for r in found for i, _ in r["skips"]]
    reasons = collections.Counter(why for r in found for _, why in r["skips"])
    exts = set().union(*(r["exts"] for r in found))
    max_label = max(r["max_label"] for r in found)
    if classes is None:
        classes = [str(i) for i in range(max_label + 1)]
    elif max_label >= len(classes):
        raise UsageError(f"a cls value is {max_label} but --classes names only {len(classes)} classes")
    pack = {"indexed_by": f"stoker {__version__}", "image_exts": sorted(exts), "checked": not args.no_check,
            "skip": skip}
    m = Manifest(num_samples=sum(s.num_samples for s in shards), classes=classes, shards=shards, pack=pack)
    where = m.save(tars[0].parent)
    print(f"indexed {len(shards)} shard(s), {m.num_samples:,} samples, {len(classes)} classes -> {where}")
    detail = ", ".join(f"{n} {why}" for why, n in sorted(reasons.items()))
    print(f"{len(skip)} sample(s) marked to skip" + (f" ({detail})" if detail else ""))
    return 0
