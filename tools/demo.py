"""The main job on a built-in dataset: generate → pack → benchmark the loader → train.

Generates a small procedural classification dataset (six pattern classes, mixed sizes,
some grayscale, CMYK, PNG and broken files) into a cache directory, packs it with
``stoker pack``, measures stoker's Loader against the torchvision ImageFolder
baseline on the same images, trains the inception-block network for a few epochs, and
prints a summary. The dataset and shards are cached and reused; each run trains anew.
Uses the GPU when there is one; under 5 minutes on a 2-core CPU.

examples:
  stoker demo
  stoker demo --epochs 8 --per-class 400
  stoker demo --tiny            # a seconds-long smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from .cli import get_args_parser, run_command
from .errors import UsageError

HELP = "the main job on a built-in dataset: generate, pack, benchmark the loader, train, summarize"


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stoker" / "demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", type=Path, default=None, help=f"where data, shards and runs go (default: {default_cache()})")
    p.add_argument("--per-class", type=int, default=200, help="training images per class (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=4, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--crop", type=int, default=None, help="crop side (default: 224 on a GPU, 64 on the CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    p.add_argument("--bench-seconds", type=float, default=8.0, help="time per loader measured (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="tiny settings: a smoke run of a few seconds")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _generate(images: Path, *, per_class: int, val_per_class: int) -> None:
    """Write SRC = images/{train,val}/<class>/ once; a crash leaves no half dataset."""
    from .synth import make_image_folder

    if (images / "train").is_dir():
        return
    tmp = images.with_name(images.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make_image_folder(tmp / "train", per_class=per_class, seed=0, nasty=True)
    make_image_folder(tmp / "val", per_class=val_per_class, seed=1)
    os.replace(tmp, images)


def main(args: argparse.Namespace) -> int:
    from stoker.pipeline.deps import has_cuda
    from stoker.pipeline.manifest import Manifest

    if args.tiny:
        args.per_class, args.epochs, args.bench_seconds = 12, 1, 1.0
        args.batch_size = min(args.batch_size, 16)
    for name in ("per_class", "epochs", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    gpu = args.device.startswith("cuda") or (args.device == "auto" and has_cuda())
    crop = args.crop or (224 if gpu else 64)
    cache = (args.cache or default_cache()).expanduser()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create cache directory {cache}: {e.strerror}") from None
    tag = f"{args.per_class}pc"
    images, shards = cache / f"images-{tag}", cache / f"shards-{tag}"
    t0 = time.perf_counter()

    print(f"[1/4] dataset: {images}", flush=True)
    _generate(images, per_class=args.per_class, val_per_class=max(4, args.per_class // 5))

    print(f"[2/4] pack: {shards}", flush=True)
    run_command(["pack", str(images), str(shards), "--quiet"])
    train_m, val_m = Manifest.load(shards / "train"), Manifest.load(shards / "val")
    rejects = (shards / "rejects.jsonl").read_text().splitlines() if (shards / "rejects.jsonl").exists() else []

    print(f"[3/4] loader benchmark ({args.bench_seconds:g} s each, crop {crop}, batch {args.batch_size})", flush=True)
    # On val: torchvision's ImageFolder would crash on the broken files planted in train/.
    bench = _bench(shards / "val", images / "val", crop=crop, batch_size=args.batch_size,
                   seconds=args.bench_seconds)

    print(f"[4/4] train the inception-block network, {args.epochs} epoch(s)", flush=True)
    from stoker.model.train import TrainConfig, train

    run_dir = cache / "runs" / time.strftime("%Y%m%d-%H%M%S")
    summary = train(TrainConfig(data=str(shards), out=str(run_dir), arch="inception", epochs=args.epochs,
                                batch_size=args.batch_size, crop=crop, device=args.device, seed=0,
                                warmup_epochs=min(1.0, args.epochs / 4), lr=0.05 if not args.tiny else None,
                                progress=sys.stderr.isatty(), log_every=10))
    result = {
        "images": str(images), "shards": str(shards), "run": str(run_dir),
        "packed": {"train": train_m.num_samples, "val": val_m.num_samples},
        "rejected": len(rejects),
        "loader": bench,
        "train": {k: summary.get(k) for k in ("images_per_s", "data_wait", "val_top1", "val_top5", "val_samples",
                                              "train_loss", "steps", "seconds", "device", "amp")},
        "chance_top1": 1 / len(train_m.classes),
        "seconds": time.perf_counter() - t0,
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(format_summary(result))
    return 0


def _bench(shards: Path, images: Path, *, crop: int, batch_size: int, seconds: float) -> dict:
    """stoker's Loader vs the torchvision ImageFolder baseline, side by side (`stoker bench`)."""
    from stoker.pipeline.deps import HAS_DALI

    from . import bench

    ours = "stoker-dali" if HAS_DALI else "stoker-pil"
    args = get_args_parser().parse_args([
        "bench", str(shards), "--images", str(images), "--only", f"torchvision,{ours}", "--crop", str(crop),
        "--batch-size", str(batch_size), "--seconds", str(seconds), "--epochs", "3", "--warmup", "1"])
    rows = {r["pipeline"]: r for r in bench.run_bench(args)["rows"]}
    for r in rows.values():
        if "img_s" not in r:
            raise UsageError(f"loader benchmark failed ({r['label']}): {r.get('error')}")
    base, mine = rows["torchvision"]["img_s"], rows[ours]["img_s"]
    return {"torchvision_images_per_s": base, "stoker_images_per_s": mine,
            "stoker_backend": ours.split("-")[1], "speedup": mine / base}


def format_summary(r: dict) -> str:
    t, b = r["train"], r["loader"]
    top1 = t["val_top1"]
    verdict = "above chance" if top1 is not None and top1 > 2 * r["chance_top1"] else "NOT clearly above chance"
    return "\n".join([
        "",
        "stoker demo: summary",
        f"  packed        {r['packed']['train']:,} train + {r['packed']['val']:,} val images, "
        f"{r['rejected']} rejected (listed in {Path(r['shards']) / 'rejects.jsonl'})",
        f"  loader        stoker {b['stoker_images_per_s']:,.0f} img/s ({b['stoker_backend']}) vs torchvision "
        f"{b['torchvision_images_per_s']:,.0f} img/s: {b['speedup']:.1f}x",
        f"  training      {t['images_per_s'] or 0:,.0f} img/s on {t['device']} (amp {t['amp']}), "
        f"data wait {100 * (t['data_wait'] or 0):.0f}% of train time, {t['steps']} steps in {t['seconds']:.0f} s",
        f"  val top-1     {100 * (top1 or 0):.1f}% (top-5 {100 * (t['val_top5'] or 0):.1f}%, chance "
        f"{100 * r['chance_top1']:.1f}%): {verdict}",
        f"  run           {r['run']}",
        f"  total         {r['seconds']:.0f} s",
    ])
