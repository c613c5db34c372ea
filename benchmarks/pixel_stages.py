"""Where the pixel tier's time goes on the CPU once decoding is gone: each stage of a warm batch,
timed one after another on one thread (CPU seconds per image).

``python -m stoker.benchmarks.pixel_stages SPLIT [--crop 224] [--batch-size 64]`` fills a store
of SPLIT in a temporary folder, then times, over ``--epochs`` warm epochs of train batches, the
stages the CPU runner's workers run (:mod:`stoker.pipeline.pixels.cpu`) and what its parent
does with each batch:

=============  ======================================================================
``plan``       crop boxes and flips from the store's sizes (no header read)
``warp``       the crops OpenCV resizes (:func:`stoker.pipeline.pixels.kernel.crop_into`): read
               where they lie in the store, flipped in the same pass, written into the batch
               (CHW: split into its planes)
``antialias``  the crops larger than the output on a side: unpacked into pillow, resized with
               its antialiasing filter, flipped and written into the batch
``collate``    the parent's side: the slot lent as the batch (a view, no copy) and the targets
=============  ======================================================================

Each stage is per image of all images; ``warp_each`` and ``antialias_each`` are per image of
their own path, ``warped`` the share of crops OpenCV took.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

import numpy as np

STAGES = ("plan", "warp", "antialias", "collate")


def pixel_stages(split: str, *, crop: int = 224, batch_size: int = 64, epochs: int = 2, channels_last: bool = False):
    """``{stage: microseconds of CPU per image}`` plus ``total``, ``images``, ``warped``,
    ``warp_each`` and ``antialias_each`` (see the module)."""
    import torch

    from stoker.pipeline import Loader
    from stoker.pipeline.backends.base import plan_batch, targets_of
    from stoker.pipeline.backends.gpu_resize import filter_regions
    from stoker.pipeline.pixels import PixelCache, kernel

    root = tempfile.mkdtemp(prefix="stoker-stages-")
    clock = time.thread_time
    took = dict.fromkeys(STAGES, 0.0)
    images, warped, planned = 0, 0, []
    try:
        cache = PixelCache(root, fill="inline")
        loader = Loader(
            split, batch_size=batch_size, crop=crop, threads=0, pixel_cache=cache, channels_last=channels_last
        )
        for _ in loader:  # epoch 0 fills the store
            pass
        s, store, chw = loader.decode_settings(), loader.pixel_store, not channels_last
        ch, cw = s.crop
        slot = np.zeros((batch_size, ch, cw, 3) if channels_last else (batch_size, 3, ch, cw), np.uint8)
        warps = kernel.cv2_or_none() is not None
        for epoch in range(1, epochs + 1):
            order = loader.indices(epoch)
            for start in range(0, len(order) - batch_size + 1, batch_size):
                ids = order[start : start + batch_size]
                t = clock()
                plan = plan_batch(s, ids, epoch=epoch, seed=0, stand_ins=False, wh=store.wh[ids])
                _, _, lo, hi = filter_regions(plan.boxes, plan.wh[:, ::-1], s.crop)
                boxes, lo, hi, flips = plan.boxes.tolist(), lo.tolist(), hi.tolist(), plan.flips.tolist()
                took["plan"] += clock() - t
                for j in range(len(plan.ids)):
                    fast = warps and kernel.fast(boxes[j], lo[j], hi[j], s.crop)
                    t = clock()
                    kernel.crop_into(
                        slot, j, store.pixels(int(plan.ids[j])), boxes[j], flips[j], s.crop, lo[j], hi[j], chw=chw
                    )
                    took["warp" if fast else "antialias"] += clock() - t
                    warped += fast
                planned.append(plan.ids)
                images += len(plan.ids)
        for ids in planned:  # the parent's side, in a loop of its own as in its own process
            t = clock()
            batch = torch.from_numpy(slot)[: len(ids)]  # the lent slot: a view
            targets_of(s, ids)
            took["collate"] += clock() - t
            del batch
        loader.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {k: 1e6 * v / images for k, v in took.items()}
    out["total"] = sum(out.values())
    out["images"], out["warped"] = images, warped / images
    out["warp_each"] = 1e6 * took["warp"] / warped if warped else 0.0
    out["antialias_each"] = 1e6 * took["antialias"] / (images - warped) if images > warped else 0.0
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stoker.benchmarks.pixel_stages", description=__doc__.split("\n\n")[0])
    p.add_argument("split", help="a packed split")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2, help="warm epochs timed (default 2)")
    p.add_argument("--channels-last", action="store_true", help="HWC slots (one pack per image)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = pixel_stages(
        args.split, crop=args.crop, batch_size=args.batch_size, epochs=args.epochs, channels_last=args.channels_last
    )
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"pixel tier stages, CPU microseconds per image ({r['images']} images, crop {args.crop}):")
        for k in (*STAGES, "total"):
            print(f"  {k:<9} {r[k]:7.1f}")
        print(
            f"  OpenCV warped {r['warped']:.0%} of the crops, {r['warp_each']:.1f} us each; "
            f"pillow antialiased the rest, {r['antialias_each']:.1f} us each"
        )
        print(f"  one core: {1e6 / r['total']:,.0f} img/s; two: {2e6 / r['total']:,.0f} img/s if nothing else ran")
    return 0


__all__ = ["STAGES", "main", "pixel_stages"]

if __name__ == "__main__":
    sys.exit(main())
