"""The warm tier's crop: one resize from the stored pixels straight into the batch.

A crop whose box is no larger than the output on either side (an upscale: at a stored size of
256 px, ~96% of RandomResizedCrop 224's boxes) is resized by OpenCV's ``INTER_LINEAR``, which reads
the stored HWC bytes where they lie (a strided view of the memory map) and writes the batch's
HWC row in place: pillow's bilinear filter upscaling is the same interpolation (half-pixel
centres, edges clamped), computed in other fixed point, so the pixels are within 1 grey level of
the JPEG path's (``tests/pipeline/test_pixels.py`` compares them). A box larger than the output
on a side is antialiased by pillow-simd as on the JPEG path (:func:`crop_stored`), where
OpenCV's filters differ by more than a grey level.

The crops run in the Loader's worker processes, not threads: OpenCV releases the GIL, but the
Python around each call holds it, and two threads measured no faster than one on two cores
(docs/pixel-cache.md). On the CPU a worker's batch slot is lent to the caller as the batch (no
copy). An NCHW batch costs one more pass (the HWC crop split into planes, ~17 us an image); a
``channels_last`` batch is written as it is stored.
"""

from __future__ import annotations

import threading

import numpy as np

from ..backends.resize import MODES, resize_into

_scratch = threading.local()


def _cv2():
    try:
        import cv2
    except ImportError:  # the wheel lacks it on this platform: every crop goes through pillow
        return None
    cv2.setNumThreads(1)  # one crop per call, many calls at once: the Loader's workers are the parallelism
    return cv2 if _agrees(cv2) else None


def _agrees(cv2) -> bool:
    """Does this OpenCV's warp give pillow's pixels within 1 grey level? Checked once a process on
    noise (the steepest gradients there are) at several scales, both ways round: another OpenCV
    build with coarser interpolation weights falls back to pillow rather than drift."""
    pixels = np.random.default_rng(0).integers(0, 256, (61, 67, 3), dtype=np.uint8)
    for (x, y, w, h), flip, crop in (
        ((0, 0, 67, 61), False, (96, 80)),
        ((5, 3, 40, 31), True, (64, 64)),
        ((20, 9, 13, 50), False, (50, 77)),
        ((1, 2, 66, 59), True, (59, 66)),
    ):
        region = np.ascontiguousarray(pixels[y : y + h, x : x + w])
        want = np.empty((1, *crop, 3), np.uint8)
        got = np.empty_like(want)
        from PIL import Image

        resize_into(want, 0, Image.fromarray(region), crop, flip, chw=False)
        _warp(cv2, pixels[y : y + h, x : x + w], crop, flip, got[0])
        if np.abs(want.astype(np.int16) - got).max() > 1:
            return False
    return True


_CV2: list = []


def cv2_or_none():
    """OpenCV, imported once (``None`` where it cannot be imported: pillow does every crop)."""
    if not _CV2:
        _CV2.append(_cv2())
    return _CV2[0]


def fast(box, lo, hi, crop) -> bool:
    """Does OpenCV crop this box: whole pixels (the box is its own filter region) and no side
    larger than the output's (an upscale or the same size, where no antialiasing applies)."""
    x, y, w, h = box
    return lo[0] == x and lo[1] == y and hi[0] == x + w and hi[1] == y + h and w <= crop[1] and h <= crop[0]


def _buffer(name: str, shape: tuple) -> np.ndarray:
    """A scratch array of this thread's, made once per shape."""
    key = (name, shape)
    buf = getattr(_scratch, "bufs", None)
    if buf is None:
        buf = _scratch.bufs = {}
    a = buf.get(key)
    if a is None:
        a = buf[key] = np.empty(shape, np.uint8)
    return a


def _scratch_region(h: int, w: int, c: int) -> np.ndarray:
    """This thread's ``[h, w, c]`` scratch (views of one buffer, grown as needed)."""
    flat = getattr(_scratch, "region", None)
    if flat is None or flat.size < h * w * c:
        flat = _scratch.region = np.empty(max(h * w * c, 256 * 256 * 3), np.uint8)
    return flat[: h * w * c].reshape(h, w, c)


def _matrix(w: int, h: int, crop, flip: bool) -> np.ndarray:
    """The output-to-input map of a ``w`` x ``h`` region resized to ``crop`` (pillow's pixel
    centres: input ``(x + 0.5) * w / width - 0.5``), mirrored where ``flip``."""
    ch, cw = crop
    sx, sy = w / cw, h / ch
    if flip:
        return np.array([[-sx, 0.0, w - 0.5 - 0.5 * sx], [0.0, sy, 0.5 * sy - 0.5]])
    return np.array([[sx, 0.0, 0.5 * sx - 0.5], [0.0, sy, 0.5 * sy - 0.5]])


def _warp(cv2, region: np.ndarray, crop, flip: bool, dst: np.ndarray) -> None:
    h, w = region.shape[:2]
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    cv2.warpAffine(region, _matrix(w, h, crop, flip), crop[::-1], dst=dst, flags=flags, borderMode=cv2.BORDER_REPLICATE)


def crop_stored(out: np.ndarray, k: int, pixels: np.ndarray, box, flip: bool, crop, lo, hi, *, chw: bool) -> None:
    """Crop ``box`` (``(x, y, w, h)``) of stored ``pixels`` (``[H, W, C]`` uint8, a read-only view)
    resized to ``crop`` (antialiased bilinear, as the JPEG path), flipped where ``flip``, into
    ``out[k]``. Only the region the filter reads, ``lo`` ``(x0, y0)`` to ``hi`` ``(x1, y1)``
    (:func:`~stoker.pipeline.backends.gpu_resize.filter_regions`: the box), is unpacked into pillow."""
    from PIL import Image

    h, w, c = pixels.shape
    x0, y0 = lo
    x1, y1 = hi
    mode = MODES[c]
    region = Image.core.new(mode, (x1 - x0, y1 - y0))  # the rows and columns the filter reads, unpacked
    decoder = Image.core.raw_decoder(mode, mode, w * c, 1)
    decoder.setimage(region, (0, 0, *region.size))  # extents: required since Pillow 13
    decoder.decode(pixels.reshape(-1)[(y0 * w + x0) * c : (y1 * w) * c])
    x, y, bw, bh = box
    resize_into(out, k, region, crop, flip, box=(x - x0, y - y0, bw, bh), chw=chw)


def crop_into(out: np.ndarray, k: int, pixels: np.ndarray, box, flip: bool, crop, lo, hi, *, chw: bool) -> None:
    """Crop ``box`` (``(x, y, w, h)``) of ``pixels`` (``[H, W, C]`` uint8, read-only) resized to
    ``crop`` (``(height, width)``) with the JPEG path's filter, flipped where ``flip``, into
    ``out[k]`` (``[N, C, H, W]`` when ``chw`` else ``[N, H, W, C]``); ``lo``/``hi``: the region
    the filter reads (see :func:`fast`)."""
    cv2 = cv2_or_none()
    if cv2 is None or not fast(box, lo, hi, crop):
        crop_stored(out, k, pixels, box, flip, crop, lo, hi, chw=chw)
        return
    x, y, w, h = (int(v) for v in box)
    c = pixels.shape[2]
    # copied out of the map first: warping straight from it measured 112 us an image against
    # 20 + 43 (the warp's reads in its own order meet each page cold; the copy reads in order)
    region = _scratch_region(h, w, c)
    np.copyto(region, pixels[y : y + h, x : x + w])
    if c == 1:  # one plane: 2-D views in and out
        _warp(cv2, region[:, :, 0], crop, flip, out[k, 0] if chw else out[k, :, :, 0])
    elif not chw:
        _warp(cv2, region, crop, flip, out[k])
    else:
        tmp = _buffer("resized", (*crop, c))
        _warp(cv2, region, crop, flip, tmp)
        cv2.split(tmp, list(out[k]))  # into the planes in place: ~17 us, a third of extractChannel's


__all__ = ["crop_into", "crop_stored", "cv2_or_none", "fast"]
