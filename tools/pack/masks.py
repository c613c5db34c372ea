"""Per-mask work of ``stoker pack --masks``: a mask file → the 8-bit grayscale PNG that is stored.

A mask holds one class index per pixel: a palette PNG's indices, or the values of an ``L``,
``1`` or 16-bit (``I;16``) image. It gets exactly its image's geometry: the image's EXIF
orientation when the mask has the image's stored size (a mask made for the upright picture,
of the upright size, is kept as it is), and the image's pack-time resize, with nearest
neighbour so no new value appears. Stored losslessly as an ``L`` PNG, so every decoder reads
the same indices. Rejects, each with a reason: a mask whose size is neither, an RGB mask (and how
to convert it), a JPEG mask (lossy: its values are not exact), values that do not fit uint8, and
values at or past ``num_classes`` other than ``ignore_index``.
"""

from __future__ import annotations

import io

import numpy as np

from stoker.errors import one_line

#: Pillow modes whose values are class indices as they are
_INDEX_MODES = ("P", "L", "1", "I", "I;16", "I;16L", "I;16B", "I;16N")


def _indices(im) -> tuple[np.ndarray | None, str | None]:
    """The mask's class indices as uint8 ``[H, W]``, or why they are not."""
    mode = im.mode
    if mode in ("RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"):
        return None, (
            f"{mode} mask: a mask holds one class index per pixel; convert its colours to indices "
            "(a palette PNG, or an L image whose values are the classes)"
        )
    if mode in ("LA", "La", "PA"):
        return None, f"mask has an alpha channel ({mode}): save it as a palette or L PNG"
    if mode not in _INDEX_MODES:
        return None, f"mask mode {mode} does not hold class indices"
    a = np.asarray(im)
    if a.dtype == bool:
        return a.astype(np.uint8), None
    if a.size and (a.min() < 0 or a.max() > 255):
        return None, f"mask values {int(a.min())}..{int(a.max())} do not fit 0..255 (uint8 masks)"
    return a.astype(np.uint8), None


def sanitize_mask(
    data: bytes,
    *,
    stored: tuple[int, int],
    orientation: int,
    transpose: str | None,
    target: tuple[int, int],
    num_classes: int = 0,
    ignore_index: int = 255,
    max_pixels: int,
) -> tuple[bytes | None, str | None, tuple[tuple[int, int], ...]]:
    """The stored PNG of the mask file ``data`` for an image whose file is ``stored`` (w, h) with
    EXIF ``orientation`` (``transpose``: the PIL transpose making it upright) and is stored at
    ``target`` (w, h, upright), its reason ``None`` and the pixel count of each value it stores
    (``((value, count), ...)``: the split's class shares); or ``(None, reason, ())``. Never raises
    for a bad mask."""
    from PIL import Image

    from stoker.pipeline.imagedecode import DAMAGED_INPUT, TooManyPixels, is_jpeg, open_image, quiet_pillow

    if not data:
        return None, "mask is an empty file", ()
    if is_jpeg(data):
        return None, "JPEG mask: JPEG is lossy, its values are not exact class indices; save masks as PNG", ()
    with quiet_pillow():
        try:
            im = open_image(data, max_pixels=max_pixels)  # the pixel count checked before decoding
            w, h = im.size
            im.load()
        except TooManyPixels as e:
            return None, f"mask has {e}", ()
        except DAMAGED_INPUT as e:  # a bug raises, with its traceback
            return None, f"mask does not decode: {one_line(e)}", ()
    swap = orientation in (5, 6, 7, 8)
    upright = (stored[1], stored[0]) if swap else stored
    if (w, h) == stored:
        follows_file = True  # drawn on the stored pixels: it turns with its image
    elif (w, h) == upright:
        follows_file = False  # drawn on the upright picture
    else:
        return None, f"mask is {w}x{h}, its image {stored[0]}x{stored[1]}", ()
    values, why = _indices(im)
    if values is None:
        return None, why, ()
    if num_classes:
        bad = (values >= num_classes) & (values != ignore_index)
        if bad.any():
            y, x = (int(v) for v in np.argwhere(bad)[0])
            return (
                None,
                (
                    f"mask value {int(values[y, x])} at ({x}, {y}) is not below --num-classes {num_classes} "
                    f"({ignore_index} is ignored)"
                ),
                (),
            )
    m = Image.fromarray(values, "L")
    if follows_file:
        size = (target[1], target[0]) if swap else target  # the target in the file's orientation
        if m.size != size:
            m = m.resize(size, Image.Resampling.NEAREST)
        if transpose:
            m = m.transpose(getattr(Image.Transpose, transpose))
    elif m.size != target:
        m = m.resize(target, Image.Resampling.NEAREST)
    buf = io.BytesIO()
    m.save(buf, "PNG", optimize=False, compress_level=6)
    counts = np.bincount(np.asarray(m).reshape(-1), minlength=256)
    return buf.getvalue(), None, tuple((int(v), int(counts[v])) for v in np.flatnonzero(counts))


__all__ = ["sanitize_mask"]
