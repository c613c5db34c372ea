"""What a sample kind costs the Loader, on real photos, side by side in one run.

    python -m stoker.tools.bench.kinds --images ~/data/imagenet-sample --out /tmp/kinds

From a flat folder of photos it builds, once (kept in OUT): a class pack (one class per photo
name), a float pack of the same photos (a target per photo), and a segmentation pack (each photo
with a mask of three classes made from its brightness, full size, stored losslessly; packed at
the original size, as segmentation packs are). Then, rounds interleaved:

* **segmentation**: stoker's mask Loader against the usual ``Dataset`` returning ``(PIL image,
  PIL mask)`` with the same random resized crop and flip (torchvision v2, jointly), at ``--seg-crop``;
* **target kind**: the Loader on the float pack against the Loader on the class pack (the
  same images, the same crops): the kind of target must cost nothing measurable.

Each figure is ``stoker bench``'s (a fresh subprocess per pipeline, images/s after a warm-up).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import numpy as np


def _masks(images: Path, out: Path) -> Path:
    """A mask per photo: three classes from its brightness (dark, middle, bright), full size."""
    from PIL import Image

    masks = out / "masks"
    if masks.is_dir():
        return masks
    tmp = out / "masks.tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for path in sorted(images.iterdir()):
        if path.suffix.lower() not in (".jpg", ".jpeg", ".png"):
            continue
        gray = np.asarray(Image.open(path).convert("L"))
        mask = np.digitize(gray, [85, 170]).astype(np.uint8)
        Image.fromarray(mask, "L").save(tmp / f"{path.stem}.png")
    os.replace(tmp, masks)
    return masks


def _csvs(images: Path, out: Path) -> tuple[Path, Path]:
    """The same photos listed twice: with a class each, and with a float target each."""
    rows = [p for p in sorted(images.iterdir()) if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
    rng = random.Random(0)
    classes = out / "classes.csv"
    floats = out / "floats.csv"
    classes.write_text("".join(f"{p.resolve()},{k}\n" for k, p in enumerate(rows)))
    floats.write_text("".join(f"{p.resolve()},{rng.random():.6f}\n" for p in rows))
    return classes, floats


def _img_s(row: dict) -> float | None:
    """A row's images/s, or None (said on stderr) when its pipeline failed."""
    if row.get("img_s") is None:
        print(f"{row['pipeline']} failed: {row.get('error', 'no figure')}", file=sys.stderr)
    return row.get("img_s")


def _ratios(a: list, b: list) -> list:
    return [x / y if x and y else None for x, y in zip(a, b, strict=True)]


def _fmt(value: float | None, spec: str = "{:,.0f}") -> str:
    return "failed" if value is None else spec.format(value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stoker.tools.bench.kinds", description=__doc__.splitlines()[0])
    p.add_argument("--images", required=True, help="a flat folder of photos")
    p.add_argument("--out", required=True, help="where the packs and masks go (kept for reruns)")
    p.add_argument("--seg-crop", type=int, default=512, help="segmentation crop side (default: 512)")
    p.add_argument("--crop", type=int, default=224, help="the target-kind comparison's crop (default: 224)")
    p.add_argument("--batch-size", type=int, default=16, help="(default: 16)")
    p.add_argument("--seconds", type=float, default=20.0, help="per pipeline and round (default: 20)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, interleaved (default: 3)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = p.parse_args(argv)

    from stoker.pipeline.deps import HAS_DALI
    from stoker.tools.bench.loader import bench
    from stoker.tools.pack import Masks, Reading, pack

    images, out = Path(args.images), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    masks = _masks(images, out)
    classes_csv, floats_csv = _csvs(images, out)
    packs = {
        "class": pack(classes_csv, out / "class", reading=Reading(targets="class")),
        "float": pack(floats_csv, out / "float", reading=Reading(targets="float")),
        "mask": pack(images, out / "mask", masks=Masks(masks, num_classes=3)),
    }
    ours = "stoker-dali" if HAS_DALI else "stoker-pil"
    common = dict(batch_size=args.batch_size, seconds=args.seconds, epochs=100, warmup=3)
    rounds: dict[str, list] = {"seg-peer": [], "seg-stoker": [], "float": [], "class": []}
    for _ in range(args.rounds):
        seg = bench(
            out / "mask" / "train",
            images=images,
            masks=masks,
            only=["torchvision-seg", ours],
            crop=args.seg_crop,
            **common,
        )
        rows = {r["pipeline"]: _img_s(r) for r in seg.rows}
        rounds["seg-peer"].append(rows["torchvision-seg"])
        rounds["seg-stoker"].append(rows[ours])
        for kind in ("float", "class"):
            r = bench(out / kind / "train", only=[ours], crop=args.crop, **common)
            rounds[kind].append(_img_s(r.rows[0]))
    result = {
        "images": str(images),
        "samples": packs["class"].packed,
        "backend": ours,
        "seg_crop": args.seg_crop,
        "crop": args.crop,
        "batch_size": args.batch_size,
        "rounds": rounds,
        "seg_ratio": _ratios(rounds["seg-stoker"], rounds["seg-peer"]),
        "float_vs_class": _ratios(rounds["float"], rounds["class"]),
    }
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(
        f"| round | (PIL image, PIL mask) Dataset | stoker mask Loader ({ours}) | ratio "
        "| class Loader | float Loader | float/class |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k in range(args.rounds):
        cells = (
            _fmt(rounds["seg-peer"][k]),
            _fmt(rounds["seg-stoker"][k]),
            _fmt(result["seg_ratio"][k], "{:.2f}x"),
            _fmt(rounds["class"][k]),
            _fmt(rounds["float"][k]),
            _fmt(result["float_vs_class"][k], "{:.2f}"),
        )
        print(f"| {k + 1} | " + " | ".join(cells) + " |")
    return 0 if all(v is not None for vs in rounds.values() for v in vs) else 1


if __name__ == "__main__":
    sys.exit(main())
