"""The pillow(-simd) stage: decode a crop region (JPEG DCT scaling when it pays) and resize it.

The ``pil`` backend runs both in its worker processes; the ``dali`` backend on the CPU resizes
DALI's decoded regions with :func:`resize_into` (pillow-simd's resize is ~4x faster than DALI's
CPU resize on this class of machine: docs/benchmarks.md).
"""

from __future__ import annotations

import io
import math

import numpy as np

#: the pillow mode of an output with 1 or 3 channels
MODES = {1: "L", 3: "RGB"}


def resize_into(out: np.ndarray, k: int, im, crop, flip: bool, box=None, chw: bool = True) -> None:
    """Crop ``box`` (``(x, y, w, h)``; the whole image when ``None``) out of ``im`` (a PIL image
    in the output's mode, or its core), resize it to ``crop`` (a side, or ``(height, width)``)
    with antialiased bilinear (torchvision's ``RandomResizedCrop``: crop, then resize), flip, and
    write it into ``out[k]`` (``[N, C, H, W]`` when ``chw`` else ``[N, H, W, C]``).

    Works on pillow's core images (no ``Image`` wrapper per step: ~20 us less per image, which
    shows once decoding is gone)."""
    from PIL import Image

    ch, cw = (crop, crop) if isinstance(crop, int) else crop
    if hasattr(im, "load"):  # a PIL image (perhaps not decoded yet: Image.open is lazy)
        im.load()
        core = im.im
    else:
        core = im
    if box is None:
        x, y, w, h = 0, 0, *core.size
    else:
        # crop, then resize, as torchvision's RandomResizedCrop: the filter reads nothing past the
        # box (rounded out to whole pixels where DCT scaling left it fractional), as on every backend
        x, y, w, h = box
        x0, y0 = max(0, math.floor(x)), max(0, math.floor(y))
        x1, y1 = min(core.size[0], math.ceil(x + w)), min(core.size[1], math.ceil(y + h))
        if (x0, y0, x1, y1) != (0, 0, *core.size):
            core = core.crop((x0, y0, x1, y1))
        x, y = x - x0, y - y0
    if flip and core.size[0] * core.size[1] < cw * ch:
        # mirror the smaller side of the resize: the crop before an upscale (the filter is symmetric,
        # so the pixels are the output's mirror image, within a rounding step; every path does the same)
        core = core.transpose(Image.FLIP_LEFT_RIGHT)
        x, flip = core.size[0] - x - w, False
    if (x, y, w, h) != (0, 0, cw, ch) or core.size != (cw, ch):
        core = core.resize((cw, ch), Image.BILINEAR, (x, y, x + w, y + h))
    if flip:
        core = core.transpose(Image.FLIP_LEFT_RIGHT)
    if chw and core.mode == "RGB":
        # pillow's raw encoder packs each band: 0.03 ms where numpy's transposing copy of the pixels
        # takes 0.07 ms per 224x224 image (docs/pixel-cache.md; a whole-batch torch permute is slower still)
        for c, band in enumerate("RGB"):
            out[k, c] = np.frombuffer(_pack(core, band, ch * cw), np.uint8).reshape(ch, cw)
        return
    hwc = np.frombuffer(_pack(core, core.mode, out[k].size), np.uint8).reshape(ch, cw, -1)
    out[k] = hwc.transpose(2, 0, 1) if chw else hwc


def _pack(core, rawmode: str, nbytes: int) -> bytes:
    """The pixels of a pillow core image packed as ``rawmode`` (what ``Image.tobytes`` does, in
    one encoder call of the right size)."""
    from PIL import Image

    encoder = Image.core.raw_encoder(core.mode, rawmode)
    encoder.setimage(core, (0, 0, *core.size))  # extents: required since Pillow 13
    parts = []
    while True:
        _, status, data = encoder.encode(max(nbytes, 1))
        parts.append(data)
        if status:  # done (> 0) or an error (< 0, which tobytes raises)
            if status < 0:
                raise RuntimeError(f"pillow's raw encoder failed ({status})")
            return parts[0] if len(parts) == 1 else b"".join(parts)


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
