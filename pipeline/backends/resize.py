"""The pillow(-simd) stage: decode a crop region (JPEG DCT scaling when it pays) and resize it.

The ``pil`` backend runs both in its worker processes; the ``dali`` backend on the CPU resizes
DALI's decoded regions with :func:`resize_into` (pillow-simd's resize is ~4x faster than DALI's
CPU resize on this class of machine: docs/benchmarks.md).
"""

from __future__ import annotations

import io

import numpy as np


def resize_into(out: np.ndarray, k: int, im, crop: int, flip: bool, box=None, chw: bool = True) -> None:
    """Resize ``im`` (a PIL image; ``box`` = ``(x, y, w, h)`` region, whole image when
    ``None``) to ``crop`` x ``crop`` with antialiased bilinear (torchvision's
    ``RandomResizedCrop`` default), flip, and write it into ``out[k]``
    (``[N, 3, crop, crop]`` when ``chw`` else ``[N, crop, crop, 3]``)."""
    from PIL import Image

    if box is not None:
        x, y, w, h = box
        im = im.resize((crop, crop), Image.BILINEAR, box=(x, y, x + w, y + h))
    elif im.size != (crop, crop):
        im = im.resize((crop, crop), Image.BILINEAR)
    if flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    hwc = np.frombuffer(im.tobytes(), np.uint8).reshape(crop, crop, 3)
    # one copy into the batch; for CHW numpy's transposing copy of one image is cheap
    # (measured: 25% less than pillow split() into planes; a whole-batch torch permute is 3x slower)
    out[k] = hwc.transpose(2, 0, 1) if chw else hwc


def decode_region(data, box, crop: int):
    """Decode ``data`` (encoded bytes) with JPEG DCT scaling (pillow's ``draft``) when the
    crop box is at least twice the output size, as FFCV does; returns ``(image, box)``
    with the box in the decoded image's pixels."""
    from PIL import Image

    im = Image.open(io.BytesIO(data))
    W, H = im.size
    x, y, w, h = (int(v) for v in box)
    if im.format == "JPEG" and min(w, h) >= 2 * crop:
        im.draft("RGB", (max(1, -(-W * crop // w)), max(1, -(-H * crop // h))))
        sx, sy = im.size[0] / W, im.size[1] / H
        box = (x * sx, y * sy, w * sx, h * sy)
    if im.mode != "RGB":
        im = im.convert("RGB")
    return im, box


__all__ = ["decode_region", "resize_into"]
