"""Benchmark stoker pack against a plain packing loop on the same images.

The plain loop is what a stock script does: webdataset's ShardWriter fed by
Pillow (Image.open, convert("RGB"), resize to the same short side with
the same bicubic filter, save as JPEG at the same quality, no draft mode),
parallelized the same way (a process pool, ordered results). stoker runs with
--reencode so both sides decode, resize and encode every image: equal work.
Each worker count from 1 to N is run side by side, and the table reports images/s,
images/s per worker, the stoker/plain ratio and the scaling over 1 worker.

SRC is an ImageFolder tree, a train/+val/ tree, or a flat folder of images (then
taken as one class). Everything is written under a temporary folder and removed.

example:
  stoker bench-pack /work/shared/data/imagenet-sample --json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .errors import UsageError
from .sanitize import IMAGE_EXTS

HELP = "benchmark stoker pack against a plain webdataset+Pillow loop, 1..N workers"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC", help="image folder (ImageFolder tree or flat folder)")
    p.add_argument("--workers", default="", metavar="LIST",
                   help=f"worker counts to run, e.g. 1,2,4 (default: 1..{os.cpu_count()})")
    p.add_argument("--short-side", type=int, default=256, help="resize target of both sides (default 256)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of both sides (default 90)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="use only N images (a seeded random subset)")
    p.add_argument("--repeat", type=int, default=2, help="rounds per worker count; the best round counts (default 2)")
    p.add_argument("--tmp", metavar="DIR", help="where to write the shards (default: the system temp folder)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")


def _target(w: int, h: int, short_side: int) -> tuple[int, int]:
    s = short_side / min(w, h)
    if not short_side or s >= 1:
        return w, h
    return max(1, round(w * s)), max(1, round(h * s))


def plain_encode(job: tuple[str, int, int]) -> bytes:
    """The stock way to re-encode one image (module level: picklable for the pool)."""
    from PIL import Image

    path, short_side, quality = job
    im = Image.open(path).convert("RGB")
    size = _target(*im.size, short_side)
    if size != im.size:
        im = im.resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def plain_pack(src: Path, out: Path, *, workers: int, short_side: int, quality: int) -> int:
    """Pack ``src`` the plain way into ``out``; returns the number of samples."""
    import multiprocessing as mp

    import webdataset as wds

    from .packsource import scan

    source = scan(src, seed=0)
    items = source.splits["train"]
    jobs = [(source.path(it), short_side, quality) for it in items]
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    with contextlib.ExitStack() as stack:
        if workers > 1:
            pool = stack.enter_context(mp.get_context("fork").Pool(workers))
            results = pool.imap(plain_encode, jobs, chunksize=8)
        else:
            results = map(plain_encode, jobs)
        sink = stack.enter_context(wds.ShardWriter(str(out / "plain-%06d.tar"), maxsize=256e6, verbose=0))
        for i, (it, data) in enumerate(zip(items, results)):
            sink.write({"__key__": f"{i:09d}", "jpg": data, "cls": it.label})
            n += 1
    return n


def stoker_pack(src: Path, out: Path, *, workers: int, short_side: int, quality: int) -> int:
    """Pack ``src`` with ``stoker pack --reencode``; returns the number of samples."""
    from stoker.pipeline.manifest import Manifest

    from . import pack

    p = argparse.ArgumentParser()
    pack.add_arguments(p)
    args = p.parse_args([str(src), str(out), "--reencode", "--short-side", str(short_side),
                         "--quality", str(quality), "--workers", str(workers), "-q"])
    with contextlib.redirect_stdout(io.StringIO()):
        pack.main(args)
    return Manifest.load(out / "train").num_samples


def _image_folder(src: Path, dst: Path, limit: int) -> int:
    """Symlink the images of ``src`` into an ImageFolder tree at ``dst`` (a flat
    folder becomes one class); returns the number of images."""
    from .packsource import scan

    subdirs = [e for e in os.scandir(src) if e.is_dir() and not e.name.startswith(".")]
    if subdirs:
        source = scan(src, seed=0)
        items = [(source.path(it), it.rel.replace("/", "__"), source.classes[it.label])
                 for split in source.splits.values() for it in split]
    else:
        items = [(str(src / e.name), e.name, "all") for e in sorted(os.scandir(src), key=lambda e: e.name)
                 if not e.name.startswith(".") and os.path.splitext(e.name)[1].lower() in IMAGE_EXTS]
    if not items:
        raise UsageError(f"SRC {src} holds no images")
    if limit:
        import random

        items = sorted(random.Random(0).sample(items, min(limit, len(items))))
    for path, name, cls in items:
        (dst / cls).mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.abspath(path), dst / cls / name)
    return len(items)


def run(src: Path, *, workers: list[int], short_side: int, quality: int, limit: int = 0, repeat: int = 1,
        tmp: str | None = None) -> dict:
    """Run the benchmark and return the report (see ``--json``)."""
    from stoker.pipeline.deps import pillow_info

    import tqdm  # noqa: F401  (imports outside the timed region: neither side pays them)
    import webdataset  # noqa: F401
    from PIL import Image

    Image.init()
    root = Path(tempfile.mkdtemp(prefix="stoker-bench-pack-", dir=tmp))
    try:
        folder = root / "src"
        n = _image_folder(src, folder, limit)
        rows = []
        for w in workers:
            best = {"stoker": 0.0, "plain": 0.0}
            best_cpu = {"stoker": 0.0, "plain": 0.0}
            for r in range(repeat):
                for name, fn in (("stoker", stoker_pack), ("plain", plain_pack)):
                    out = root / f"{name}-w{w}-r{r}"
                    c0 = _cpu_seconds()
                    t0 = time.perf_counter()
                    count = fn(folder, out, workers=w, short_side=short_side, quality=quality)
                    dt = time.perf_counter() - t0
                    cpu = _cpu_seconds() - c0
                    if count != n:
                        raise RuntimeError(f"{name} packed {count} of {n} images")
                    best[name] = max(best[name], n / dt)
                    best_cpu[name] = max(best_cpu[name], n / cpu)
                    shutil.rmtree(out)
            rows.append({"workers": w, "stoker_img_s": best["stoker"], "plain_img_s": best["plain"],
                         "stoker_img_s_per_worker": best["stoker"] / w, "plain_img_s_per_worker": best["plain"] / w,
                         "ratio": best["stoker"] / best["plain"],
                         "stoker_img_per_cpu_s": best_cpu["stoker"], "plain_img_per_cpu_s": best_cpu["plain"],
                         "cpu_ratio": best_cpu["stoker"] / best_cpu["plain"]})
        for row in rows:
            row["stoker_scaling"] = row["stoker_img_s"] / rows[0]["stoker_img_s"]
            row["plain_scaling"] = row["plain_img_s"] / rows[0]["plain_img_s"]
        return {"src": str(src), "images": n, "cores": os.cpu_count(), "short_side": short_side,
                "quality": quality, "repeat": repeat, "pillow": pillow_info(), "rows": rows}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cpu_seconds() -> float:
    """CPU time of this process and its reaped children (the pool workers): images per
    CPU-second is the per-core cost, unlike wall time unaffected by other load."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _workers(spec: str) -> list[int]:
    if not spec:
        return list(range(1, (os.cpu_count() or 1) + 1))
    try:
        ws = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--workers {spec!r} should be a list like 1,2,4") from None
    if not ws or min(ws) < 1:
        raise UsageError(f"--workers {spec!r} should list counts >= 1")
    return ws


def main(args: argparse.Namespace) -> int:
    src = Path(args.src)
    if not src.is_dir():
        raise UsageError(f"SRC {src} is not a folder")
    if args.repeat < 1 or args.limit < 0:
        raise UsageError("--repeat must be >= 1 and --limit >= 0")
    report = run(src, workers=_workers(args.workers), short_side=args.short_side, quality=args.quality,
                 limit=args.limit, repeat=args.repeat, tmp=args.tmp)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    pi = report["pillow"]
    print(f"{report['images']:,} images from {src}, short side {report['short_side']}, q{report['quality']}, "
          f"{report['cores']} cores, Pillow {pi['version']}{' (SIMD)' if pi['simd'] else ''}, best of {report['repeat']}")
    print(f"{'workers':>7} {'stoker img/s':>12} {'plain img/s':>11} {'stoker/w':>9} {'plain/w':>8} {'ratio':>6} "
          f"{'scaling s/p':>12} {'img/cpu-s s/p':>14} {'cpu ratio':>9}")
    for r in report["rows"]:
        print(f"{r['workers']:>7} {r['stoker_img_s']:>12,.0f} {r['plain_img_s']:>11,.0f} "
              f"{r['stoker_img_s_per_worker']:>9,.0f} {r['plain_img_s_per_worker']:>8,.0f} {r['ratio']:>5.2f}x "
              f"{r['stoker_scaling']:>6.2f}/{r['plain_scaling']:<5.2f} "
              f"{r['stoker_img_per_cpu_s']:>7,.0f}/{r['plain_img_per_cpu_s']:<6,.0f} {r['cpu_ratio']:>8.2f}x")
    sys.stdout.flush()
    return 0
