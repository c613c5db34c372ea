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
  stoker bench-pack ~/data/imagenet-sample --json
  stoker bench-pack ~/data/imagenet-sample --plain-python /tmp/plain-venv/bin/python
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from stoker.errors import UsageError, arg

from ..common.results import Result
from ..pack.sanitize import IMAGE_EXTS
from .peers import plain_pack as plain

HELP = "benchmark stoker pack against a plain webdataset+Pillow loop, 1..N workers"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", metavar="SRC", help="image folder (ImageFolder tree or flat folder)")
    p.add_argument(
        "--workers", default="", metavar="LIST", help=f"worker counts to run, e.g. 1,2,4 (default: 1..{os.cpu_count()})"
    )
    p.add_argument("--short-side", type=int, default=256, help="resize target of both sides (default 256)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of both sides (default 90)")
    p.add_argument("--limit", type=int, default=0, metavar="N", help="use only N images (a seeded random subset)")
    p.add_argument("--repeat", type=int, default=2, help="rounds per worker count; the best round counts (default 2)")
    p.add_argument(
        "--plain-python",
        metavar="PATH",
        help="run the plain loop with this python (needs pillow + webdataset, e.g. stock Pillow "
        "from PyPI; default: in this process, with this process's Pillow)",
    )
    p.add_argument("--tmp", metavar="DIR", help="where to write the shards (default: the system temp folder)")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of a table")


def _plain_subprocess(python: str, cfg: dict) -> dict:
    """Run the plain loop (:mod:`stoker.tools.bench.peers.plain_pack`, by file path) with ``python``,
    ``cfg`` on stdin; returns its RESULT."""
    try:
        proc = subprocess.run([python, plain.__file__], input=json.dumps(cfg), capture_output=True, text=True)
    except OSError as e:
        raise UsageError(f"{arg('plain_python')} {python}: cannot run it ({e.strerror or e})") from None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise UsageError(f"{arg('plain_python')} {python}: the plain loop failed: {tail[:200]}")


def plain_info(python: str | None = None) -> dict:
    """Pillow of the plain side: version, simd (pillow-simd?), libjpeg_turbo, python."""
    if python is None:
        return plain.pillow()
    return _plain_subprocess(python, {"info": True})


def plain_pack(src: Path, out: Path, *, workers: int, short_side: int, quality: int, python: str | None = None) -> dict:
    """Pack ``src`` the plain way into ``out``, in this process or with ``python``.

    Returns ``{"count", "wall", "cpu"}``: the loop's own wall and CPU seconds (pool included,
    interpreter start-up and imports excluded, so both modes measure the same thing).
    """
    from ..pack.sources import scan

    source = scan(src, seed=0)
    cfg = {
        "items": [(source.path(it), it.label) for it in source.splits["train"]],
        "out": str(out),
        "workers": workers,
        "short_side": short_side,
        "quality": quality,
    }
    if python is None:
        return plain.measure(cfg)
    return _plain_subprocess(python, cfg)


def stoker_pack(src: Path, out: Path, *, workers: int, short_side: int, quality: int) -> int:
    """Pack ``src`` with ``stoker pack --reencode``; returns the number of samples."""
    from ..pack import Images, pack

    result = pack(src, out, images=Images(short_side=short_side, quality=quality, reencode=True), workers=workers)
    return result.splits["train"]["samples"]


def link_image_folder(src: Path, dst: Path, limit: int = 0) -> int:
    """Symlink the images of ``src`` into an ImageFolder tree at ``dst`` (a flat folder
    becomes one class ``all``); ``limit`` > 0 takes a seeded random subset of that many.
    Returns the number of images; UsageError when ``src`` holds none."""
    from ..pack.sources import scan

    subdirs = [e for e in os.scandir(src) if e.is_dir() and not e.name.startswith(".")]
    if subdirs:
        source = scan(src, seed=0)
        items = [
            (source.path(it), it.rel.replace("/", "__"), source.classes[it.label])
            for split in source.splits.values()
            for it in split
        ]
    else:
        items = [
            (str(src / e.name), e.name, "all")
            for e in sorted(os.scandir(src), key=lambda e: e.name)
            if not e.name.startswith(".") and os.path.splitext(e.name)[1].lower() in IMAGE_EXTS
        ]
    if not items:
        raise UsageError(f"SRC {src} holds no images")
    if limit:
        import random

        items = sorted(random.Random(0).sample(items, min(limit, len(items))))
    for path, name, cls in items:
        (dst / cls).mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.abspath(path), dst / cls / name)
    return len(items)


def _pillow_name(info: dict) -> str:
    return f"{'pillow-simd' if info['simd'] else 'Pillow (stock)'} {info['version']}"


@dataclasses.dataclass
class BenchPackResult(Result):
    """What `stoker bench-pack` measured; :meth:`to_dict` is its ``--json`` output.

    Attributes:
        src: The image folder packed.
        images: Images packed by each side per run.
        cores: CPU count of this machine.
        short_side: Resize target of both sides.
        quality: JPEG quality of both sides.
        repeat: Rounds per worker count (the best counts).
        pillow: stoker's Pillow (:func:`stoker.pipeline.deps.pillow_info`).
        plain_pillow: The plain loop's Pillow (:func:`plain_info`).
        plain_python: The interpreter of the plain loop, or None (this process).
        rows: Per worker count: ``workers``, ``stoker_img_s``, ``plain_img_s``, their per-worker
            figures, ``ratio``, images per CPU-second of each and ``cpu_ratio``, and the
            ``stoker_scaling``/``plain_scaling`` over the first row.
    """

    src: str
    images: int
    cores: int | None
    short_side: int
    quality: int
    repeat: int
    pillow: dict
    plain_pillow: dict
    plain_python: str | None
    rows: list

    def format_table(self) -> str:
        """The human report ``stoker bench-pack`` prints."""
        where = f"with {self.plain_python}" if self.plain_python else f"in this process ({sys.executable})"
        lines = [
            f"{self.images:,} images from {self.src}, short side {self.short_side}, q{self.quality}, "
            f"{self.cores} cores, best of {self.repeat}",
            f"stoker: {_pillow_name(self.pillow)}, in this process ({sys.executable})",
            f"plain:  {_pillow_name(self.plain_pillow)}, {where}",
            f"{'workers':>7} {'stoker img/s':>12} {'plain img/s':>11} {'stoker/w':>9} {'plain/w':>8} "
            f"{'ratio':>6} {'scaling s/p':>12} {'img/cpu-s s/p':>14} {'cpu ratio':>9}",
        ]
        for r in self.rows:
            lines.append(
                f"{r['workers']:>7} {r['stoker_img_s']:>12,.0f} {r['plain_img_s']:>11,.0f} "
                f"{r['stoker_img_s_per_worker']:>9,.0f} {r['plain_img_s_per_worker']:>8,.0f} "
                f"{r['ratio']:>5.2f}x {r['stoker_scaling']:>6.2f}/{r['plain_scaling']:<5.2f} "
                f"{r['stoker_img_per_cpu_s']:>7,.0f}/{r['plain_img_per_cpu_s']:<6,.0f} "
                f"{r['cpu_ratio']:>8.2f}x"
            )
        return "\n".join(lines)


def _best_rates(
    name: str,
    folder: Path,
    out: Path,
    n: int,
    *,
    workers: int,
    short_side: int,
    quality: int,
    plain_python: str | None,
) -> tuple[float, float]:
    """One run of one side: ``(images/s, images per CPU-second)``."""
    if name == "stoker":
        c0, t0 = plain.cpu_seconds(), time.perf_counter()
        count = stoker_pack(folder, out, workers=workers, short_side=short_side, quality=quality)
        dt, cpu = time.perf_counter() - t0, plain.cpu_seconds() - c0
    else:  # timed by the loop itself (it may run in another interpreter)
        res = plain_pack(folder, out, workers=workers, short_side=short_side, quality=quality, python=plain_python)
        count, dt, cpu = res["count"], res["wall"], res["cpu"]
    if count != n:
        raise RuntimeError(f"{name} packed {count} of {n} images")
    shutil.rmtree(out)
    return n / dt, n / cpu


def bench_pack(
    src: str | Path,
    *,
    workers: Sequence[int] | None = None,
    short_side: int = 256,
    quality: int = 90,
    limit: int = 0,
    repeat: int = 2,
    tmp: str | None = None,
    plain_python: str | None = None,
) -> BenchPackResult:
    """Pack ``src`` with stoker (``--reencode``) and with the plain loop, per worker count.

    Everything is written under a temporary folder (in ``tmp``) and removed.

    Args:
        src: An ImageFolder tree, a train/+val/ tree, or a flat folder of images (one class).
        workers: Worker counts to run (None: 1 .. CPU count).
        short_side: Resize target of both sides.
        quality: JPEG quality of both sides.
        limit: Use only this many images (a seeded random subset; 0: all).
        repeat: Rounds per worker count; the best round counts.
        tmp: Where the temporary folder goes (None: the system's).
        plain_python: Interpreter for the plain loop (None: this process, with its Pillow).

    Returns:
        The :class:`BenchPackResult`.

    Raises:
        UsageError: ``src`` is not a folder or holds no images, a setting is out of range, or
            ``plain_python`` cannot run the loop (missing, or no pillow/webdataset).
    """
    import tqdm  # noqa: F401  (imports outside the timed region: neither side pays them)
    import webdataset  # noqa: F401
    from PIL import Image

    from stoker.pipeline.deps import pillow_info

    src = Path(src)
    if not src.is_dir():
        raise UsageError(f"SRC {src} is not a folder")
    if repeat < 1 or limit < 0:
        raise UsageError(f"{arg('repeat')} must be >= 1 and {arg('limit')} >= 0")
    workers = list(workers) if workers else list(range(1, (os.cpu_count() or 1) + 1))
    if min(workers) < 1:
        raise UsageError(f"{arg('workers')} {','.join(map(str, workers))!r} should list counts >= 1")
    if plain_python and not shutil.which(plain_python):
        raise UsageError(f"{arg('plain_python')} {plain_python}: no such executable")
    Image.init()
    plain_pillow = plain_info(plain_python)  # also checks --plain-python before any work
    root = Path(tempfile.mkdtemp(prefix="stoker-bench-pack-", dir=tmp))
    try:
        folder = root / "src"
        n = link_image_folder(src, folder, limit)
        rows = []
        for w in workers:
            best = {"stoker": (0.0, 0.0), "plain": (0.0, 0.0)}
            for r in range(repeat):
                for name in ("stoker", "plain"):
                    rate, per_cpu = _best_rates(
                        name,
                        folder,
                        root / f"{name}-w{w}-r{r}",
                        n,
                        workers=w,
                        short_side=short_side,
                        quality=quality,
                        plain_python=plain_python,
                    )
                    best[name] = (max(best[name][0], rate), max(best[name][1], per_cpu))
            (s_rate, s_cpu), (p_rate, p_cpu) = best["stoker"], best["plain"]
            rows.append(
                {
                    "workers": w,
                    "stoker_img_s": s_rate,
                    "plain_img_s": p_rate,
                    "stoker_img_s_per_worker": s_rate / w,
                    "plain_img_s_per_worker": p_rate / w,
                    "ratio": s_rate / p_rate,
                    "stoker_img_per_cpu_s": s_cpu,
                    "plain_img_per_cpu_s": p_cpu,
                    "cpu_ratio": s_cpu / p_cpu,
                }
            )
        for row in rows:
            row["stoker_scaling"] = row["stoker_img_s"] / rows[0]["stoker_img_s"]
            row["plain_scaling"] = row["plain_img_s"] / rows[0]["plain_img_s"]
        return BenchPackResult(
            src=str(src),
            images=n,
            cores=os.cpu_count(),
            short_side=short_side,
            quality=quality,
            repeat=repeat,
            pillow=pillow_info(),
            plain_pillow=plain_pillow,
            plain_python=plain_python,
            rows=rows,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _workers(spec: str) -> list[int] | None:
    if not spec:
        return None
    try:
        ws = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--workers {spec!r} should be a list like 1,2,4") from None
    if not ws or min(ws) < 1:
        raise UsageError(f"--workers {spec!r} should list counts >= 1")
    return ws


def main(args: argparse.Namespace) -> int:
    report = bench_pack(
        args.src,
        workers=_workers(args.workers),
        short_side=args.short_side,
        quality=args.quality,
        limit=args.limit,
        repeat=args.repeat,
        tmp=args.tmp,
        plain_python=args.plain_python,
    )
    print(json.dumps(report.to_dict(), indent=1) if args.json else report.format_table())
    sys.stdout.flush()
    return 0
