"""Aspect-ratio buckets against square batches, side by side in one run.

    python -m stoker.benchmarks.buckets --images ~/data/imagenet-sample --out /tmp/buckets

From a flat folder of photos it builds, once (kept in OUT), a class pack of them (``path,label``
rows, ten labels), generated detection scenes of many shapes (a COCO pack) and an "edge" dataset
whose label sits at the image's edges, then measures:

* **pixels shown**: the mean share of each photo's stored pixels the val transform shows the
  model, a square center crop at ``--crop`` against each photo's ``buckets="auto"`` shape;
* **padding**: the share of a val batch that is padding, the square letterbox against each
  scene's bucket (detection val);
* **img/s**: the Loader reading the photos square and bucketed, train and val, on each backend
  (rounds interleaved, ``--seconds`` a round after a warm-up batch);
* **time to accuracy**: ``stoker train`` on the edge dataset (wide and tall pictures, a coloured
  mark near one end says the class; a center crop cuts it away), square and ``--buckets auto``,
  the val top-1 and the wall time of each epoch.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _photo_pack(images: Path, out: Path) -> Path:
    from stoker.tools.pack import Images, pack

    if not (out / "photos" / "train" / "stoker.json").is_file():
        rows = [f"{p.resolve()},{k % 10}\n" for k, p in enumerate(sorted(images.iterdir()))]
        (out / "photos.csv").write_text("".join(rows))
        pack(out / "photos.csv", out / "photos", images=Images(short_side=256))
    return out / "photos" / "train"


def _scene_pack(out: Path, n: int) -> Path:
    from stoker.tools.common.synth import make_detection_scenes
    from stoker.tools.pack import Images, pack

    if not (out / "scenes" / "train" / "stoker.json").is_file():
        src = make_detection_scenes(out / "scenes-src", n=n, min_side=96, max_side=256, formats=("coco",))
        pack(src["coco"], out / "scenes", images=Images(short_side=0))
    return out / "scenes" / "train"


def _edge_data(out: Path, n: int, val: int, side: int) -> Path:
    """Wide (2:1) and tall (1:2) noise pictures; a red or green mark in the outer eighth at one
    end (which end at random) is the class; the pack has a val split."""
    from PIL import Image

    from stoker.tools.pack import Images, pack

    packed = out / "edge"
    if (packed / "val" / "stoker.json").is_file():
        return packed
    rng = random.Random(0)
    src = out / "edge-src"
    for k in range(n + val):
        label = k % 2
        wide = rng.random() < 0.5
        w, h = (2 * side, side) if wide else (side, 2 * side)
        pixels = np.random.default_rng(k).integers(60, 180, (h, w, 3)).astype(np.uint8)
        m = side // 4
        colour = (230, 30, 30) if label == 0 else (30, 200, 30)
        end = rng.random() < 0.5
        if wide:
            x0 = (w - m - 4) if end else 4
            pixels[h // 2 - m // 2 : h // 2 + m // 2, x0 : x0 + m] = colour
        else:
            y0 = (h - m - 4) if end else 4
            pixels[y0 : y0 + m, w // 2 - m // 2 : w // 2 + m // 2] = colour
        folder = src / ("red" if label == 0 else "green")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{k:05d}.png")
    pack(src, packed, images=Images(short_side=0), val_fraction=val / (n + val))
    return packed


def shares(photos: Path, scenes: Path, crop: int) -> dict:
    """The val transform's pixels shown (photos) and padding (scenes), square against bucketed."""
    from stoker.pipeline.augment import CropSpec
    from stoker.pipeline.bucketing import shown_share
    from stoker.pipeline.order.buckets import auto_buckets
    from stoker.pipeline.shards.samples import open_split

    idx = open_split(photos)
    wh = idx.stored_sizes(idx.valid_at(np.arange(idx.num_valid)))
    crops = CropSpec.of(crop)
    buckets = auto_buckets(wh, crops.size, min_count=64)
    out = {
        "photos": idx.num_valid,
        "buckets": [list(s) for s in buckets.shapes],
        "shown_square": shown_share(wh, crops),
        "shown_buckets": shown_share(wh, crops, buckets),
    }
    idx = open_split(scenes)
    wh = idx.stored_sizes(idx.valid_at(np.arange(idx.num_valid))).astype(np.float64)
    square = np.minimum(crop / wh[:, 0], crop / wh[:, 1])
    scene_buckets = auto_buckets(wh, crops.size, min_count=16)
    shapes = np.array(scene_buckets.shapes, np.float64)[scene_buckets.assign(wh)]  # (h, w) each
    fit = np.minimum(shapes[:, 1] / wh[:, 0], shapes[:, 0] / wh[:, 1])
    out.update(
        scenes=len(wh),
        scene_buckets=[list(s) for s in scene_buckets.shapes],
        padding_square=float(np.mean(1 - wh[:, 0] * wh[:, 1] * square**2 / crop**2)),
        padding_buckets=float(np.mean(1 - wh[:, 0] * wh[:, 1] * fit**2 / (shapes[:, 0] * shapes[:, 1]))),
    )
    return out


def _rate(split: Path, *, backend: str, train: bool, crop: int, batch: int, seconds: float, buckets) -> float:
    """Images a second reading ``split`` for about ``seconds`` after a warm-up epoch (a bucketed
    Loader starts each bucket's runner when its first batch comes: all of them in the first epoch)."""
    from stoker.pipeline import Loader

    kw = {"buckets": buckets} if buckets is not None else {}
    loader = Loader(split, batch_size=batch, crop=crop, train=train, backend=backend, **kw)
    images, start, epoch = 0, None, 0
    try:
        for _ in loader:
            pass
        while True:
            epoch += 1
            loader.set_epoch(epoch)
            for x, _ in loader:
                if start is None:
                    start = time.perf_counter()
                    continue
                images += len(x)
                if time.perf_counter() - start >= seconds:
                    return images / (time.perf_counter() - start)
    finally:
        loader.close()


def speeds(photos: Path, *, backends: list[str], crop: int, batch: int, seconds: float, rounds: int) -> list:
    rows: dict[tuple, list] = {}
    buckets = [list(s) for s in shares_buckets(photos, crop)]
    for _ in range(rounds):
        for backend in backends:
            for train in (True, False):
                for name, b in (("square", None), ("buckets", buckets)):
                    r = _rate(photos, backend=backend, train=train, crop=crop, batch=batch, seconds=seconds, buckets=b)
                    rows.setdefault((backend, "train" if train else "val", name), []).append(r)
    return [
        {"backend": k[0], "split": k[1], "batches": k[2], "img_s": statistics.median(v), "runs": v}
        for k, v in rows.items()
    ]


def shares_buckets(photos: Path, crop: int):
    from stoker.pipeline.order.buckets import auto_buckets
    from stoker.pipeline.shards.samples import open_split

    idx = open_split(photos)
    return auto_buckets(idx.stored_sizes(idx.valid_at(np.arange(idx.num_valid))), (crop, crop), min_count=64).shapes


def accuracy(edge: Path, out: Path, *, epochs: int, crop: int) -> list:
    """``stoker train`` on the edge data, square and bucketed: per epoch val top-1 and seconds."""
    rows = []
    for name, extra in (("square", []), ("buckets", ["--buckets", "auto"])):
        run = out / f"edge-run-{name}"
        cmd = [sys.executable, "-m", "stoker", "train", str(edge), "--out", str(run), "--epochs", str(epochs)]
        cmd += ["--crop", str(crop), "--batch-size", "32", "--no-progress", "--json", "--seed", "0"]
        if run.exists():
            import shutil

            shutil.rmtree(run)
        t0 = time.perf_counter()
        subprocess.run(cmd + extra, check=True, stdout=subprocess.DEVNULL)
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        top1 = [round(m["top1"], 3) for m in metrics if m.get("kind") == "val"]
        seconds = time.perf_counter() - t0
        rows.append({"batches": name, "seconds": seconds, "val_top1": top1, "command": " ".join(cmd[1:] + extra)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stoker.benchmarks.buckets", description=__doc__.split("\n\n")[0])
    p.add_argument("--images", required=True, help="a flat folder of photos (e.g. the ImageNet sample)")
    p.add_argument("--out", default="/tmp/stoker-buckets", help="where the packs are built (kept for reruns)")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backends", default="pil,dali")
    p.add_argument("--scenes", type=int, default=400)
    p.add_argument("--edge-crop", type=int, default=64)
    p.add_argument("--edge-epochs", type=int, default=6)
    p.add_argument("--skip", default="", help="parts to leave out: speed,accuracy")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    photos = _photo_pack(Path(args.images), out)
    result = {"shares": shares(photos, _scene_pack(out, args.scenes), args.crop)}
    print(json.dumps(result["shares"]), flush=True)
    if "speed" not in args.skip:
        backends = args.backends.split(",")
        result["speed"] = speeds(
            photos, backends=backends, crop=args.crop, batch=args.batch_size, seconds=args.seconds, rounds=args.rounds
        )
        for row in result["speed"]:
            print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
    if "accuracy" not in args.skip:
        edge = _edge_data(out, 600, 200, args.edge_crop)
        result["accuracy"] = accuracy(edge, out, epochs=args.edge_epochs, crop=args.edge_crop)
        for row in result["accuracy"]:
            print(json.dumps(row), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
