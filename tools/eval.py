"""The val figures of a checkpoint on any split: ``stoker eval CKPT SPLIT``.

Builds the network as its run built it, reads SPLIT (a packed split: DATA/val, DATA/train, another
pack with the same classes) with the run's val transform, and prints the task's figures (top-1/top-5,
MSE/MAE/R², mIoU/pixel accuracy, mAP) and, where the split's targets have classes, a row per class
(a detection run: each class's COCO AP). ``--coco-results FILE`` writes a detection run's detections
as a COCO results file (the COCO JSON's image and category ids, ``[x, y, w, h]`` in the original
pixels) that pycocotools' ``COCOeval`` scores.

examples:
  stoker eval runs/a packed/val          # the run's best.pt (its last.pt when it has none)
  stoker eval runs/a/best.pt packed/val
  stoker eval runs/a/last.pt packed/train --json > train-figures.json
  stoker eval runs/det/best.pt coco-packed/val --coco-results detections.json
"""

from __future__ import annotations

import argparse
import json

from .common.loader_flags import add_decode_flags

HELP = "a checkpoint's val figures on any split, per class where it has classes (text or --json)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        metavar="CKPT",
        help="a checkpoint of `stoker train` (RUN/best.pt, RUN/last.pt), or a run folder: its best.pt, else last.pt",
    )
    p.add_argument("split", metavar="SPLIT", help="a packed split (DATA/val, DATA/train)")
    p.add_argument(
        "-b", "--batch-size", type=int, default=64, metavar="N", help="samples a batch (default: %(default)s)"
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 (default: auto)")
    add_decode_flags(p)
    p.add_argument("--json", action="store_true", help="print the figures and the per-class rows as JSON")
    p.add_argument(
        "--coco-results",
        metavar="FILE",
        help="a detection run: write its detections on SPLIT as a COCO results file (the COCO JSON's image and "
        "category ids, [x, y, w, h] in the original pixels)",
    )


def main(args: argparse.Namespace) -> int:
    import sys

    from stoker.model.train.scoring import check_paths, evaluate_checkpoint, run_checkpoint
    from stoker.pipeline.options import backend_for

    checkpoint, which = run_checkpoint(args.checkpoint)  # a run folder: its best.pt, else its last.pt
    check_paths(checkpoint, args.split)  # a wrong split is one line, before the line saying which
    if which:
        print(f"stoker eval: {which}", file=sys.stderr)
    backend = backend_for(args.backend, decode=args.decode, decoder=args.decoder)
    result = evaluate_checkpoint(
        checkpoint,
        args.split,
        batch_size=args.batch_size,
        device=args.device,
        backend=backend,
        threads=args.threads,
        coco_results=args.coco_results,
    )
    print(json.dumps(result, indent=1) if args.json else format_result(result))
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


#: per task: the per-class figure's key and heading, the count's key and heading
_COLUMNS = {
    "top1": ("top-1", "n", "samples"),
    "iou": ("IoU", "pixels", "pixels"),
    "ap": ("AP", "positives", "positives"),
}


def format_result(r: dict) -> str:
    """The figures, then a table of the per-class rows (those the split holds no sample of left out:
    a pack's manifest may name 1,000 classes of which a small split holds a few)."""
    from stoker.model.train.loop import format_val

    lines = [
        f"checkpoint {r['checkpoint']}  ({r['arch']}, {r['task']})",
        f"split      {r['split']}",
        f"figures    {format_val(r)}",
    ]
    rows = r.get("per_class") or []
    if rows:
        key = next(k for k in _COLUMNS if k in rows[0])
        heading, count, count_heading = _COLUMNS[key]
        held = [row for row in rows if row[count]]
        if len(held) < len(rows):
            lines.append(
                f"per class  ({len(rows) - len(held)} of {len(rows)} classes without {count_heading} left out)"
            )
        rows = held or rows
        width = max(len("class"), *(len(row["class"]) for row in rows))
        lines.append(f"  {'class':<{width}}  {heading:>7}  {count_heading:>9}")
        lines += [f"  {row['class']:<{width}}  {_pct(row[key]):>7}  {row[count]:>9}" for row in rows]
    if r.get("coco_results"):
        lines.append(f"wrote {r['detections']:,} detections to {r['coco_results']} (COCO image and category ids)")
    return "\n".join(lines)
