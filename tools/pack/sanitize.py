"""Per-image work of ``stoker pack``: read, check, decode, fix up, resize, encode.

:func:`sanitize` turns one input file into the bytes of a baseline JPEG (RGB, or
grayscale for a grayscale input) that every reader (DALI, webdataset + PIL, torchvision)
decodes, or into a short reject reason; with a mask (``stoker pack --masks``) the mask too
gets the image's geometry (:mod:`.masks`). It runs in the pack's worker processes, so it takes and returns only
picklable values and never raises for a bad input.

What happens to an image:

* only regular files are opened (a FIFO, socket or device is a reject, never read),
  and files over ``max_bytes`` (default 256 MiB) are rejects, before they are read;
* a JPEG that every Loader decoder reads identically
  (:func:`stoker.pipeline.decodecheck.jpeg_copy_safe`: baseline SOF0 Huffman, 8-bit, one
  scan, nothing after EOI), RGB or grayscale, with no EXIF rotation, that needs no resize and
  decodes completely is copied byte for byte (unless ``reencode``);
* anything else is decoded with Pillow (JPEG draft mode when downscaling, so
  libjpeg-turbo decodes at 1/2, 1/4 or 1/8 scale in the DCT), rotated upright per
  its EXIF orientation, converted to RGB (alpha composited on white, CMYK converted) or,
  when it has one channel, kept grayscale (16-bit scaled to 8-bit), resized down to the size
  limits with an antialiased bicubic filter, and re-encoded as a baseline JPEG at ``quality``.
  A grayscale image stays one channel (a third of the bytes to store and decode); the Loader
  turns it into RGB when asked for three channels.
"""

from __future__ import annotations

import io
import os
import stat
from dataclasses import dataclass
from typing import NamedTuple

from .masks import sanitize_mask

# Extensions looked at when scanning a folder; everything else is skipped silently.
IMAGE_EXTS = frozenset(".jpg .jpeg .jpe .jfif .png .bmp .gif .webp .tif .tiff .ppm .pgm .pbm .pnm .tga".split())
PIL_MAX_PIXELS = 89_478_485  # Pillow's own decompression-bomb threshold
MAX_BYTES = 256 * 1024**2  # default input file size cap: far above any photo, far below RAM

# EXIF orientation -> the transpose that makes the image upright (as ImageOps.exif_transpose).
_ORIENT = {
    2: "FLIP_LEFT_RIGHT",
    3: "ROTATE_180",
    4: "FLIP_TOP_BOTTOM",
    5: "TRANSPOSE",
    6: "ROTATE_270",
    7: "TRANSVERSE",
    8: "ROTATE_90",
}


@dataclass(frozen=True)
class Settings:
    """What :func:`sanitize` does to each image.

    Args:
        short_side: resize down so the shorter side is at most this (0: no limit).
        max_side: resize down so the longer side is at most this (0: no limit).
        quality: JPEG quality of re-encoded images (1-100).
        reencode: re-encode even images that could be copied byte for byte.
        max_pixels: reject images whose header declares more pixels than this.
        max_bytes: reject input files larger than this many bytes (before reading them).
        mask_classes: masks: values at or past this (other than ``ignore_index``) are rejects
            (0: not checked).
        ignore_index: masks: the "no class" value.
    """

    short_side: int = 256
    max_side: int = 0
    quality: int = 90
    reencode: bool = False
    max_pixels: int = PIL_MAX_PIXELS
    max_bytes: int = MAX_BYTES
    mask_classes: int = 0
    ignore_index: int = 255

    def __post_init__(self) -> None:
        if self.short_side < 0:
            raise ValueError(f"short_side must be >= 0, got {self.short_side}")
        if self.max_side < 0:
            raise ValueError(f"max_side must be >= 0, got {self.max_side}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be in 1..100, got {self.quality}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be >= 1, got {self.max_pixels}")
        if self.max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {self.max_bytes}")
        if not 0 <= self.mask_classes <= 256:
            raise ValueError(f"num_classes must be in 1..256 for uint8 masks, got {self.mask_classes}")
        if not 0 <= self.ignore_index <= 255:
            raise ValueError(f"ignore_index must be in 0..255 (uint8 masks), got {self.ignore_index}")


class Sanitized(NamedTuple):
    """Result for one input: ``jpg`` bytes (and its ``mask``'s PNG), or ``reason`` why it was rejected."""

    jpg: bytes | None
    width: int = 0  # original size, upright (after EXIF orientation)
    height: int = 0
    copied: bool = False
    reason: str | None = None
    mask: bytes | None = None
    mask_counts: tuple = ()  # ((value, pixels), ...) of the stored mask: the split's class shares
    resized: bool = False  # stored smaller than it came (--short-side, --max-side)
    orientation: int = 1  # the file's EXIF orientation, undone in the stored pixels (boxes follow it)


def target_size(width: int, height: int, short_side: int, max_side: int) -> tuple[int, int]:
    """Size after resizing ``width x height`` down (never up) to the limits."""
    scale = 1.0
    if short_side:
        scale = min(scale, short_side / min(width, height))
    if max_side:
        scale = min(scale, max_side / max(width, height))
    if scale >= 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


def _reason(exc: BaseException) -> str:
    """A short, specific reject reason for a decode failure."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    low = msg.lower()
    if "truncated" in low or "premature end" in low or "unexpected end" in low:
        return "truncated"
    return f"corrupt: {msg[:120]}"


def _to_rgb_or_l(im):
    """Any Pillow mode -> "RGB" or "L" (kept as L until after the resize: 1/3 the work)."""
    from PIL import Image

    mode = im.mode
    if mode in ("RGB", "L"):
        return im
    if (mode == "P" and "transparency" in im.info) or mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if mode.startswith("I") or mode == "F":
        import numpy as np

        a = np.asarray(im)
        if mode == "F":
            a8 = np.clip(a, 0, 255).astype(np.uint8)
        else:  # 16-bit data (PNG, TIFF): keep the top 8 bits
            a8 = (np.clip(a.astype(np.int64), 0, 65535) >> 8).astype(np.uint8)
        return Image.fromarray(a8, "L")
    if mode == "1":
        return im.convert("L")
    # CMYK (Pillow undoes Adobe's inverted CMYK on load), P, YCbCr, LAB, HSV, ...
    return im.convert("RGB")


def encode_jpeg(im, quality: int) -> bytes:
    """Baseline (non-progressive) JPEG bytes of an RGB or grayscale image, no metadata."""
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality, progressive=False, optimize=False)
    return buf.getvalue()


def _kind(mode: int) -> str:
    names = (
        (stat.S_ISDIR, "folder"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    )
    return next((name for test, name in names if test(mode)), "special file")


def read_input(path: str, max_bytes: int = MAX_BYTES) -> tuple[bytes | None, str | None]:
    """The bytes of the regular file ``path``, or ``(None, reason)``. A FIFO, socket,
    device or folder is never read (it could block or never end); a file larger than
    ``max_bytes`` is not read either."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return None, f"not a regular file ({_kind(st.st_mode)})"
        if st.st_size > max_bytes:
            return None, f"file too large ({st.st_size:,} bytes > {max_bytes:,})"
        # O_NONBLOCK: if the path was swapped for a FIFO since the stat, open must not block.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return None, f"unreadable: errno {e.errno} ({e.strerror})"
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None, f"not a regular file ({_kind(st.st_mode)})"
            data = f.read(max_bytes + 1)
        except OSError as e:
            return None, f"unreadable: errno {e.errno} ({e.strerror})"
    if len(data) > max_bytes:
        return None, f"file too large (> {max_bytes:,} bytes)"
    return data, None


def sanitize(path: str, settings: Settings, mask: str | None = None) -> Sanitized:
    """Read the file ``path`` and return its sanitized JPEG (with the file ``mask``, its mask's PNG
    too), or a reject reason. Never raises for a bad input (only for bugs)."""
    data, reason = read_input(path, settings.max_bytes)
    read_mask = None if mask is None else lambda: read_input(mask, settings.max_bytes)
    return _sanitize_read(data, reason, read_mask, settings)


def _sanitize_read(data: bytes | None, reason: str | None, read_mask, settings: Settings) -> Sanitized:
    if data is None:
        return Sanitized(None, reason=reason)
    res, geometry = _sanitize_bytes(data, settings)
    if read_mask is None or res.jpg is None:
        return res
    mask_data, reason = read_mask()
    if mask_data is None:
        return Sanitized(None, reason=f"mask {reason}")
    png, why, counts = sanitize_mask(
        mask_data,
        **geometry,
        num_classes=settings.mask_classes,
        ignore_index=settings.ignore_index,
        max_pixels=settings.max_pixels,
    )
    return res._replace(mask=png, mask_counts=counts) if png is not None else Sanitized(None, reason=why)


def sanitize_bytes(data: bytes, settings: Settings) -> Sanitized:
    """:func:`sanitize` on bytes already in memory."""
    return _sanitize_bytes(data, settings)[0]


def _sanitize_bytes(data: bytes, settings: Settings) -> tuple[Sanitized, dict | None]:
    """``(result, geometry)``: the geometry is what a mask of this image must follow (stored
    size, EXIF orientation and its transpose, stored target size)."""
    from PIL import UnidentifiedImageError

    from stoker.pipeline.decodecheck import jpeg_copy_safe
    from stoker.pipeline.imagedecode import DAMAGED_INPUT, TooManyPixels, is_jpeg, open_image, quiet_pillow

    if not data:
        return Sanitized(None, reason="empty file"), None
    with quiet_pillow():
        try:
            # --max-pixels, not Pillow's process-wide limit, before anything is decoded
            im = open_image(data, max_pixels=settings.max_pixels)
        except TooManyPixels as e:
            return Sanitized(None, reason=str(e)), None
        except UnidentifiedImageError:
            if is_jpeg(data):  # a JPEG flavour Pillow cannot read (12-bit, lossless, ...): say which
                why = f"unsupported JPEG: {jpeg_copy_safe(data) or 'unknown variant'}"
                return Sanitized(None, reason=why), None
            return Sanitized(None, reason="not an image"), None
        except DAMAGED_INPUT as e:  # a header Pillow recognises but cannot parse
            return Sanitized(None, reason=_reason(e)), None
        try:
            return _convert(im, data, settings)
        except DAMAGED_INPUT as e:  # the pixels do not decode (a bug raises, with its traceback)
            return Sanitized(None, reason=_reason(e)), None


def _convert(im, data: bytes, settings: Settings) -> tuple[Sanitized, dict | None]:
    from PIL import Image

    from stoker.pipeline.decodecheck import jpeg_copy_safe
    from stoker.pipeline.imagedecode import DAMAGED_INPUT

    w, h = im.size
    if w < 1 or h < 1:
        return Sanitized(None, reason=f"empty image ({w}x{h})"), None
    try:
        orientation = int(im.getexif().get(0x0112, 1) or 1)
    except DAMAGED_INPUT:  # a broken EXIF block must not cost the image
        orientation = 1
    if orientation not in _ORIENT:
        orientation = 1
    swap = orientation in (5, 6, 7, 8)
    uw, uh = (h, w) if swap else (w, h)  # upright size
    tw, th = target_size(uw, uh, settings.short_side, settings.max_side)
    resize = (tw, th) != (uw, uh)
    is_jpeg = im.format == "JPEG"
    geometry = {"stored": (w, h), "orientation": orientation, "transpose": _ORIENT.get(orientation), "target": (tw, th)}

    if (
        is_jpeg
        and not settings.reencode
        and not resize
        and orientation == 1
        and im.mode in ("RGB", "L")
        and jpeg_copy_safe(data) is None
    ):
        # Candidate for copy-through: prove it decodes completely. A 1/8-scale draft
        # still entropy-decodes every scan (truncation shows) at a fraction of the cost.
        im.draft(im.mode, (max(1, w // 8), max(1, h // 8)))
        im.load()
        return Sanitized(data, uw, uh, copied=True), geometry

    stored_target = (th, tw) if swap else (tw, th)  # target in the file's own orientation
    if is_jpeg and resize:
        # DCT-domain downscale by 1/2, 1/4 or 1/8 to no less than the target, then exact resize.
        im.draft("RGB", stored_target)
    im.load()
    im = _to_rgb_or_l(im)
    if im.size != stored_target:
        im = im.resize(stored_target, Image.Resampling.BICUBIC)
    if orientation != 1:
        im = im.transpose(getattr(Image.Transpose, _ORIENT[orientation]))
    return Sanitized(encode_jpeg(im, settings.quality), uw, uh, resized=resize, orientation=orientation), geometry
