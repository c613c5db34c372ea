"""The pillow(-simd) stage: decode a crop region (JPEG DCT scaling when it pays) and resize it.

The ``pil`` backend runs both in its worker processes; the ``dali`` backend on the CPU resizes
DALI's decoded regions with :func:`resize_into` (pillow-simd's resize is ~4x faster than DALI's
CPU resize on this class of machine: docs/benchmarks.md).
"""

from __future__ import annotations

import io

import numpy as np

#: the pillow mode of an output with 1 or 3 channels
MODES = {1: "L", 3: "RGB"}


def resize_into(out: np.ndarray, k: int, im, crop, flip: bool, box=None, chw: bool = True) -> None:
    """Resize ``im`` (a PIL image in the output's mode; ``box`` = ``(x, y, w, h)`` region, whole
    image when ``None``) to ``crop`` (a side, or ``(height, width)``) with antialiased bilinear
    (torchvision's ``RandomResizedCrop`` default), flip, and write it into ``out[k]``
    (``[N, C, H, W]`` when ``chw`` else ``[N, H, W, C]``)."""
    from PIL import Image

    ch, cw = (crop, crop) if isinstance(crop, int) else crop
    if box is not None:
        x, y, w, h = box
        im = im.resize((cw, ch), Image.BILINEAR, box=(x, y, x + w, y + h))
    elif im.size != (cw, ch):
        im = im.resize((cw, ch), Image.BILINEAR)
    if flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    hwc = np.frombuffer(im.tobytes(), np.uint8).reshape(ch, cw, -1)
    # one copy into the batch; for CHW numpy's transposing copy of one image is cheap
    # (measured: 25% less than pillow split() into planes; a whole-batch torch permute is 3x slower)
    out[k] = hwc.transpose(2, 0, 1) if chw else hwc


def decode_region(data, box, crop, channels: int = 3):
    """Decode ``data`` (encoded bytes) to ``channels`` (3: RGB, 1: grayscale) with JPEG DCT scaling
    (pillow's ``draft``) when the crop box is at least twice the output size, as FFCV does; returns
    ``(image, box)`` with the box in the decoded image's pixels.

    Grayscale from a colour JPEG is libjpeg's own luma (``draft("L")``: the decoder outputs Y,
    as DALI's and nvJPEG's grayscale decode do), not a conversion of decoded RGB.
    """
    from PIL import Image

    mode = MODES[channels]
    im = Image.open(io.BytesIO(data))
    W, H = im.size
    x, y, w, h = (int(v) for v in box)
    if im.format == "JPEG" and min(w, h) >= 2 * min(crop):
        im.draft(mode, (max(1, -(-W * crop[1] // w)), max(1, -(-H * crop[0] // h))))
        sx, sy = im.size[0] / W, im.size[1] / H
        box = (x * sx, y * sy, w * sx, h * sy)
    elif im.format == "JPEG" and mode == "L":
        im.draft("L", (W, H))  # the decoder's luma, at full size
    if im.mode != mode:
        im = im.convert(mode)
    return im, box


__all__ = ["MODES", "decode_region", "resize_into"]
