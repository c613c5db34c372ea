"""Benchmark stoker pack against a plain packing loop on the same images.

The plain loop is what a stock script does: webdataset's ShardWriter fed by
Pillow (Image.open, convert("RGB"), resize to the same short side with
the same bicubic filter, save as JPEG at the same quality, no draft mode),
parallelized the same way (a process pool, ordered results). stoker runs with
--reencode so both sides decode, resize and encode every image: equal work.
Each worker count from 1 to N is run side by side, and the table reports images/s,
images/s per worker, the stoker/plain ratio and the scaling over 1 worker.

By default the plain loop runs in this process, so it uses the same Pillow as stoker (here
pillow-simd, whose SIMD resize it then gets for free). --plain-python PATH runs it instead with
another interpreter, e.g. a venv with stock Pillow from PyPI, which is what a typical user has:
  python3 -m venv /tmp/plain-venv && /tmp/plain-venv/bin/pip install pillow webdataset
The report names the Pillow of each side (version, pillow-simd or not).

SRC is an ImageFolder tree, a train/+val/ tree, or a flat folder of images (then
taken as one class). Everything is written under a temporary folder and removed.

example:
  stoker bench-pack /work/shared/data/imagenet-sample --json
  stoker bench-pack /work/shared/data/imagenet-sample --plain-python /tmp/plain-venv/bin/python
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
    p.add_argument("--plain-python", metavar="PATH",
                   help="run the plain loop with this python (needs pillow + webdataset, e.g. stock Pillow "
                        "from PyPI; default: in this process, with this process's Pillow)")
    p.add_argument("--tmp", metavar="DIR", help="where to write the shards (default: the system temp folder)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")


# The plain loop, self-contained (stdlib + Pillow + webdataset only, no stoker, no torch) so that
# --plain-python can run it with another interpreter, e.g. a venv with stock Pillow from PyPI.
# In-process it is exec'd into a registered module (_plain_module), so both modes run this code.
PLAIN_SCRIPT = r"""
import contextlib, io, json, os, resource, sys, time


def target(w, h, short_side):
    s = short_side / min(w, h)
    if not short_side or s >= 1:
        return w, h
    return max(1, round(w * s)), max(1, round(h * s))


def encode(job):
    # the stock way to re-encode one image (module level: picklable for the pool)
    from PIL import Image

    path, short_side, quality = job
    im = Image.open(path).convert("RGB")
    size = target(*im.size, short_side)
    if size != im.size:
        im = im.resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def pack(items, out, workers, short_side, quality):
    import multiprocessing as mp

    import webdataset as wds

    jobs = [(path, short_side, quality) for path, _ in items]
    os.makedirs(out, exist_ok=True)
    n = 0
    with contextlib.ExitStack() as stack:
        if workers > 1:
            pool = stack.enter_context(mp.get_context("fork").Pool(workers))
            results = pool.imap(encode, jobs, chunksize=8)
        else:
            results = map(encode, jobs)
        sink = stack.enter_context(wds.ShardWriter(os.path.join(out, "plain-%06d.tar"), maxsize=256e6, verbose=0))
        for i, ((_, label), data) in enumerate(zip(items, results)):
            sink.write({"__key__": f"{i:09d}", "jpg": data, "cls": label})
            n += 1
    return n


def cpu_seconds():
    # this process and its reaped children (the pool workers)
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def pillow():
    import PIL
    from PIL import features
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("pillow-simd")
        simd = True
    except PackageNotFoundError:
        simd = False
    return {"version": PIL.__version__, "simd": simd,
            "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
            "python": sys.executable}


def measure(cfg):
    # imports before the clock, as on the stoker side
    import webdataset  # noqa: F401
    from PIL import Image

    Image.init()
    c0, t0 = cpu_seconds(), time.perf_counter()
    n = pack(cfg["items"], cfg["out"], cfg["workers"], cfg["short_side"], cfg["quality"])
    return {"count": n, "wall": time.perf_counter() - t0, "cpu": cpu_seconds() - c0}


if __name__ == "__main__":
    cfg = json.loads(sys.stdin.read())
    res = pillow() if cfg.get("info") else measure(cfg)
    print("RESULT " + json.dumps(res), flush=True)
"""


def _plain_module():
    """PLAIN_SCRIPT as an importable module of this process (registered in sys.modules so the
    forked pool can unpickle ``encode`` by name)."""
    import types

    name = "_stoker_bench_plain"
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        exec(compile(PLAIN_SCRIPT, "<stoker bench-pack plain loop>", "exec"), mod.__dict__)
        sys.modules[name] = mod
    return mod


def _plain_subprocess(python: str, cfg: dict) -> dict:
    """Run PLAIN_SCRIPT with ``python``, ``cfg`` on stdin; returns its RESULT."""
    import subprocess

    try:
        proc = subprocess.run([python, "-c", PLAIN_SCRIPT], input=json.dumps(cfg), capture_output=True, text=True)
    except OSError as e:
        raise UsageError(f"--plain-python {python}: cannot run it ({e.strerror or e})") from None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise UsageError(f"--plain-python {python}: the plain loop failed: {tail[:200]}")


def plain_info(python: str | None = None) -> dict:
    """Pillow of the plain side: version, simd (pillow-simd?), libjpeg_turbo, python."""
    if python is None:
        return _plain_module().pillow()
    return _plain_subprocess(python, {"info": True})


def plain_pack(src: Path, out: Path, *, workers: int, short_side: int, quality: int,
               python: str | None = None) -> dict:
    """Pack ``src`` the plain way into ``out``, in this process or with ``python``.

    Returns ``{"count", "wall", "cpu"}``: the loop's own wall and CPU seconds (pool included,
    interpreter start-up and imports excluded, so both modes measure the same thing).
    """
    from .packsource import scan

    source = scan(src, seed=0)
    cfg = {"items": [(source.path(it), it.label) for it in source.splits["train"]], "out": str(out),
           "workers": workers, "short_side": short_side, "quality": quality}
    if python is None:
        return _plain_module().measure(cfg)
    return _plain_subprocess(python, cfg)


def stoker_pack(src: Path, out: Path, *, workers: int, short_side: int, quality: int) -> int:
    """Pack ``src`` with ``stoker pack --reencode``; returns the number of samples."""
    from stoker.pipeline.manifest import Manifest

    from .cli import run_command

    with contextlib.redirect_stdout(io.StringIO()):
        run_command(["pack", str(src), str(out), "--reencode", "--short-side", str(short_side),
                     "--quality", str(quality), "--workers", str(workers), "-q"])
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
        tmp: str | None = None, plain_python: str | None = None) -> dict:
    """Run the benchmark and return the report (see ``--json``).

    ``plain_python``: interpreter for the plain loop (None: this process). Raises UsageError
    when it cannot run the loop (missing, or no pillow/webdataset).
    """
    from stoker.pipeline.deps import pillow_info

    import tqdm  # noqa: F401  (imports outside the timed region: neither side pays them)
    import webdataset  # noqa: F401
    from PIL import Image

    Image.init()
    plain_pillow = plain_info(plain_python)  # also checks --plain-python before any work
    root = Path(tempfile.mkdtemp(prefix="stoker-bench-pack-", dir=tmp))
    try:
        folder = root / "src"
        n = _image_folder(src, folder, limit)
        rows = []
        for w in workers:
            best = {"stoker": 0.0, "plain": 0.0}
            best_cpu = {"stoker": 0.0, "plain": 0.0}
            for r in range(repeat):
                for name in ("stoker", "plain"):
                    out = root / f"{name}-w{w}-r{r}"
                    if name == "stoker":
                        c0 = _cpu_seconds()
                        t0 = time.perf_counter()
                        count = stoker_pack(folder, out, workers=w, short_side=short_side, quality=quality)
                        dt = time.perf_counter() - t0
                        cpu = _cpu_seconds() - c0
                    else:  # timed by the loop itself (it may run in another interpreter)
                        res = plain_pack(folder, out, workers=w, short_side=short_side, quality=quality,
                                         python=plain_python)
                        count, dt, cpu = res["count"], res["wall"], res["cpu"]
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
                "quality": quality, "repeat": repeat, "pillow": pillow_info(), "plain_pillow": plain_pillow,
                "plain_python": plain_python, "rows": rows}
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


def _pillow_name(info: dict) -> str:
    return f"{'pillow-simd' if info['simd'] else 'Pillow (stock)'} {info['version']}"


def main(args: argparse.Namespace) -> int:
    src = Path(args.src)
    if not src.is_dir():
        raise UsageError(f"SRC {src} is not a folder")
    if args.repeat < 1 or args.limit < 0:
        raise UsageError("--repeat must be >= 1 and --limit >= 0")
    if args.plain_python and not shutil.which(args.plain_python):
        raise UsageError(f"--plain-python {args.plain_python}: no such executable")
    report = run(src, workers=_workers(args.workers), short_side=args.short_side, quality=args.quality,
                 limit=args.limit, repeat=args.repeat, tmp=args.tmp, plain_python=args.plain_python)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['images']:,} images from {src}, short side {report['short_side']}, q{report['quality']}, "
          f"{report['cores']} cores, best of {report['repeat']}")
    print(f"stoker: {_pillow_name(report['pillow'])}, in this process ({sys.executable})")
    where = f"with {report['plain_python']}" if report["plain_python"] else f"in this process ({sys.executable})"
    print(f"plain:  {_pillow_name(report['plain_pillow'])}, {where}")
    print(f"{'workers':>7} {'stoker img/s':>12} {'plain img/s':>11} {'stoker/w':>9} {'plain/w':>8} {'ratio':>6} "
          f"{'scaling s/p':>12} {'img/cpu-s s/p':>14} {'cpu ratio':>9}")
    for r in report["rows"]:
        print(f"{r['workers']:>7} {r['stoker_img_s']:>12,.0f} {r['plain_img_s']:>11,.0f} "
              f"{r['stoker_img_s_per_worker']:>9,.0f} {r['plain_img_s_per_worker']:>8,.0f} {r['ratio']:>5.2f}x "
              f"{r['stoker_scaling']:>6.2f}/{r['plain_scaling']:<5.2f} "
              f"{r['stoker_img_per_cpu_s']:>7,.0f}/{r['plain_img_per_cpu_s']:<6,.0f} {r['cpu_ratio']:>8.2f}x")
    sys.stdout.flush()
    return 0
