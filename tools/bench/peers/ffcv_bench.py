"""Column (4) of `stoker bench`: FFCV's Loader on a .beton of the original images.

Run by file path, by the python that has ffcv (``--ffcv-python``, which need not have stoker)::

    python /path/to/stoker/tools/peers/ffcv_bench.py '{"images": ..., "beton": ..., ...}'

The config (JSON, first argument) holds ``images`` (an ImageFolder), ``beton`` (written once
and reused), ``R`` (FFCV ``max_resolution``), ``crop``, ``batch_size``, ``workers``,
``epochs``, ``warmup`` and ``seconds``. Prints ``RESULT {json}`` as the other pipelines do:
the same augmentation (RandomResizedCrop + flip), uint8 batches, timed by
:func:`stoker.tools.bench.peers.timing.timed`.
"""

from __future__ import annotations

import json
import os
import sys

try:
    from .timing import epochs, timed
except ImportError:  # run by file path: this folder is on sys.path
    from timing import epochs, timed


def make_loader(cfg: dict):
    """FFCV's Loader over ``cfg["beton"]``, writing the .beton from ``cfg["images"]`` first if missing."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
    from torchvision.datasets import ImageFolder

    beton = cfg["beton"]
    if not os.path.exists(beton):
        fields = {
            "image": RGBImageField(write_mode="jpg", max_resolution=cfg["R"], jpeg_quality=90),
            "label": IntField(),
        }
        writer = DatasetWriter(beton + ".tmp", fields, num_workers=cfg["workers"])
        writer.from_indexed_dataset(ImageFolder(cfg["images"]))
        os.replace(beton + ".tmp", beton)
    crop = cfg["crop"]  # a side or [height, width]
    size = (crop, crop) if isinstance(crop, int) else tuple(crop)
    pipelines = {
        "image": [RandomResizedCropRGBImageDecoder(size), RandomHorizontalFlip(), ToTensor(), ToTorchImage()],
        "label": [IntDecoder(), ToTensor()],
    }
    return Loader(
        beton,
        batch_size=cfg["batch_size"],
        num_workers=cfg["workers"],
        order=OrderOption.RANDOM,
        drop_last=True,
        pipelines=pipelines,
    )


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[0])
    loader = make_loader(cfg)
    print("RESULT " + json.dumps(timed(epochs(lambda e: iter(loader), cfg["epochs"] + 1), cfg)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
