"""What a box batch adds over the same images with class labels: the Loader on a detection pack
against the Loader on a class pack of the very same images (same crops, same decode), rounds
interleaved.

    python -m stoker.benchmarks.box_cost --out /tmp/box-cost --seconds 10 --rounds 3

It generates ``--images`` scenes of shapes (:func:`stoker.tools.common.synth.make_detection_scenes`,
1-3 boxes a picture, some negatives) at ``--side`` pixels, packs them once as COCO boxes and once
as a CSV of ``path,label`` (kept in OUT), then reads each with ``Loader(backend="pil")`` for
``--seconds`` a round: train batches (RandomResizedCrop + flip, the boxes moved, clipped and
sanitized) and val batches (letterbox vs center crop). The figure is the box split's extra time a
batch over the class split's, and the time the box targets alone take a batch
(``backends.base.targets_of``: read, move, pad).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def _packs(out: Path, n: int, side: int) -> tuple[Path, Path]:
    """``(box pack, class pack)`` of the same generated pictures (made once, kept in ``out``)."""
    from stoker.tools.common.synth import make_detection_scenes
    from stoker.tools.pack import Images, pack

    boxes, classes = out / "boxes", out / "classes"
    if not (classes / "train" / "stoker.json").is_file():
        src = make_detection_scenes(out / "src", n=n, min_side=side * 3 // 4, max_side=side, formats=("coco",))
        pack(src["coco"], boxes, images=Images(short_side=0))
        images = sorted((src["coco"] / "images").glob("*.png"))
        (out / "classes.csv").write_text("".join(f"{p.resolve()},{k % 3}\n" for k, p in enumerate(images)))
        pack(out / "classes.csv", classes, images=Images(short_side=0))
    return boxes / "train", classes / "train"


def _rate(split: Path, *, train: bool, crop: int, batch_size: int, seconds: float, threads: int) -> float:
    """Seconds a batch, reading ``split`` for about ``seconds`` (after one warm-up batch)."""
    from stoker.pipeline import Loader

    loader = Loader(split, batch_size=batch_size, crop=crop, train=train, backend="pil", threads=threads)
    batches, start, epoch = 0, None, 0
    try:
        while True:
            loader.set_epoch(epoch)
            for _ in loader:
                if start is None:
                    start = time.perf_counter()
                    continue
                batches += 1
                if time.perf_counter() - start >= seconds:
                    return (time.perf_counter() - start) / batches
            epoch += 1
    finally:
        loader.close()


def _targets_alone(split: Path, *, crop: int, batch_size: int, repeats: int = 50) -> float:
    """Seconds the targets of a train batch take alone (read, crops computed again, moved, padded)."""
    from stoker.pipeline import Loader
    from stoker.pipeline.backends.base import targets_of

    loader = Loader(split, batch_size=batch_size, crop=crop, train=True, backend="pil", threads=0)
    settings = loader.decoding.settings(loader.crops)
    ids = np.arange(min(batch_size, loader.index.num_valid))
    start = time.perf_counter()
    for epoch in range(repeats):
        targets_of(settings, ids, epoch=epoch, seed=0)
    loader.close()
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stoker.benchmarks.box_cost", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="where the generated scenes and packs go (kept for reruns)")
    p.add_argument("--images", type=int, default=512, help="generated pictures (default: %(default)s)")
    p.add_argument("--side", type=int, default=400, help="their longer side in pixels (default: %(default)s)")
    p.add_argument("--crop", type=int, default=224, help="(default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="(default: %(default)s)")
    p.add_argument("--threads", type=int, default=2, help="pillow worker processes (default: %(default)s)")
    p.add_argument("--seconds", type=float, default=10.0, help="per pipeline and round (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, interleaved (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)
    boxes, classes = _packs(Path(args.out), args.images, args.side)
    kw = dict(crop=args.crop, batch_size=args.batch_size, seconds=args.seconds, threads=args.threads)
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for train in (True, False):
            for name, split in (("boxes", boxes), ("classes", classes)):
                key = f"{'train' if train else 'val'}/{name}"
                rows.setdefault(key, []).append(_rate(split, train=train, **kw))
    best = {k: min(v) for k, v in rows.items()}  # the least disturbed round of each
    alone = _targets_alone(boxes, crop=args.crop, batch_size=args.batch_size)
    report = {
        "settings": vars(args),
        "seconds_per_batch": best,
        "train_extra": best["train/boxes"] / best["train/classes"] - 1,
        "val_extra": best["val/boxes"] / best["val/classes"] - 1,
        "box_targets_alone_s": alone,
        "box_targets_share_of_train_batch": alone / best["train/boxes"],
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for k, v in best.items():
        print(f"{k:14s} {v * 1e3:8.1f} ms/batch ({args.batch_size / v:7.1f} images/s)")
    train, val = report["train_extra"], report["val_extra"]
    print(f"boxes over classes: train {train:+.1%}, val (letterbox vs center crop) {val:+.1%}")
    print(f"box targets alone: {alone * 1e3:.2f} ms a batch ({report['box_targets_share_of_train_batch']:.1%} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
