"""Where the pixel tier's time goes on the CPU once decoding is gone: each stage of a warm batch,
timed one after another on one thread (CPU seconds per image).

``python -m stoker.benchmarks.pixel_stages SPLIT [--crop 224] [--batch-size 64]`` fills a store
of SPLIT in a temporary folder, then times, over ``--epochs`` warm epochs of train batches, the
stages the CPU runner's workers run (:mod:`stoker.pipeline.pixels.cpu`) and the copy its parent
makes:

=============  ======================================================================
``plan``       crop boxes and flips from the store's sizes (no header read)
``read``       the crop box's rows and columns unpacked from the store into pillow
``resize``     pillow-simd's antialiased bilinear resize to the crop
``flip``       the mirror (of the smaller of the box and the output)
``pack``       the crop written into the batch's slot (CHW bands, or HWC)
``collate``    the parent's copy of the slot into the batch it hands out, and the targets (timed
               after the rest, as the parent process runs it)
=============  ======================================================================
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time

import numpy as np

STAGES = ("plan", "read", "resize", "flip", "pack", "collate")


def pixel_stages(split: str, *, crop: int = 224, batch_size: int = 64, epochs: int = 2, channels_last: bool = False):
    """``{stage: microseconds of CPU per image}`` plus ``total`` and ``images`` (see the module)."""
    import torch
    from PIL import Image

    from stoker.pipeline import Loader
    from stoker.pipeline.backends.base import plan_batch, targets_of
    from stoker.pipeline.backends.gpu_resize import filter_regions
    from stoker.pipeline.backends.resize import _pack

    root = tempfile.mkdtemp(prefix="stoker-stages-")
    clock = time.thread_time
    took = dict.fromkeys(STAGES, 0.0)
    images, planned = 0, []
    try:
        loader = Loader(
            split, batch_size=batch_size, crop=crop, threads=0, pixel_cache=root, channels_last=channels_last
        )
        for _ in loader:  # epoch 0 fills the store
            pass
        s, store = loader.decode_settings(), loader.pixel_store
        ch, cw = s.crop
        slot = np.zeros((batch_size, ch, cw, 3) if channels_last else (batch_size, 3, ch, cw), np.uint8)
        for epoch in range(1, epochs + 1):
            order = loader.indices(epoch)
            for start in range(0, len(order) - batch_size + 1, batch_size):
                ids = order[start : start + batch_size]
                t = clock()
                plan = plan_batch(s, ids, epoch=epoch, seed=0, stand_ins=False, wh=store.wh[ids])
                _, _, lo, hi = filter_regions(plan.boxes, plan.wh[:, ::-1], s.crop)
                took["plan"] += clock() - t
                for j in range(len(plan.ids)):
                    t0 = clock()
                    px = store.pixels(int(plan.ids[j]))
                    w = px.shape[1]
                    (x0, y0), (x1, y1) = lo[j].tolist(), hi[j].tolist()
                    region = Image.core.new("RGB", (x1 - x0, y1 - y0))
                    decoder = Image.core.raw_decoder("RGB", "RGB", w * 3, 1)
                    decoder.setimage(region, (0, 0, *region.size))
                    decoder.decode(px.reshape(-1)[(y0 * w + x0) * 3 : (y1 * w) * 3])
                    t1 = clock()
                    flip = bool(plan.flips[j])
                    early = flip and region.size[0] * region.size[1] < cw * ch
                    if early:
                        region = region.transpose(Image.FLIP_LEFT_RIGHT)
                    t2 = clock()
                    out = region.resize((cw, ch), Image.BILINEAR, (0, 0, *region.size))
                    t3 = clock()
                    if flip and not early:
                        out = out.transpose(Image.FLIP_LEFT_RIGHT)
                    t4 = clock()
                    if channels_last:
                        slot[j] = np.frombuffer(_pack(out, "RGB", ch * cw * 3), np.uint8).reshape(ch, cw, 3)
                    else:
                        for c, band in enumerate("RGB"):
                            slot[j, c] = np.frombuffer(_pack(out, band, ch * cw), np.uint8).reshape(ch, cw)
                    t5 = clock()
                    took["read"] += t1 - t0
                    took["flip"] += (t2 - t1) + (t4 - t3)
                    took["resize"] += t3 - t2
                    took["pack"] += t5 - t4
                planned.append(plan.ids)
                images += len(plan.ids)
        for ids in planned:  # the parent's side, in a loop of its own as in its own process
            t = clock()
            batch = torch.empty(slot.shape, dtype=torch.uint8)
            np.copyto(batch.numpy(), slot)
            targets_of(s, ids)
            took["collate"] += clock() - t
        loader.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {k: 1e6 * v / images for k, v in took.items()}
    out["total"] = sum(out.values())
    out["images"] = images
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
            print(f"  {k:<8} {r[k]:7.1f}")
        print(f"  one core: {1e6 / r['total']:,.0f} img/s; two: {2e6 / r['total']:,.0f} img/s if nothing else ran")
    return 0


__all__ = ["STAGES", "main", "pixel_stages"]

if __name__ == "__main__":
    sys.exit(main())
