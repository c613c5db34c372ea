"""What every image decoder path of stoker shares, in one place.

* :data:`DAMAGED_INPUT`: what Pillow raises for bytes that do not decode (a sample to drop and
  count, an input to reject with a reason), as against a bug or an API change (a ``TypeError``,
  a ``NameError``), which must raise with its traceback and not empty an epoch or a pack;
* :data:`NATIVE_DECODE_ERRORS`: the same for the native decoders (torchvision, TorchCodec,
  nvImageCodec, DALI);
* :func:`is_jpeg` and :func:`is_jpeg_each`: the one JPEG signature rule, ``FF D8 FF`` (SOI, then
  the next marker), for one buffer and vectorized over a batch's concatenated bytes;
* :func:`open_image`: Pillow's lazy open with a pixel limit given per call, leaving Pillow's
  process-wide ``Image.MAX_IMAGE_PIXELS`` alone (a pack's ``max_pixels`` must not change what
  the same process's Loader accepts).
"""

from __future__ import annotations

import contextlib
import io
import struct
import warnings
from collections.abc import Iterator

import numpy as np
from PIL import Image

#: the first bytes of every JPEG: SOI (``FF D8``), then the next marker's ``FF``
JPEG_SIGNATURE = b"\xff\xd8\xff"

#: what Pillow raises for an image that does not decode: truncated or corrupt data
#: (``OSError``, ``UnidentifiedImageError`` included, ``SyntaxError``, ``EOFError``), a header that
#: does not parse (``ValueError``, ``struct.error``), a size past its bomb limit
DAMAGED_INPUT: tuple[type[Exception], ...] = (
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    Image.DecompressionBombError,
)

#: what a native decoder raises for bytes it cannot decode: torch's operators (torchvision's and
#: TorchCodec's ``decode_jpeg``, nvJPEG on CUDA) and pybind11 bindings (nvImageCodec, DALI's
#: ``Pipeline.run``) turn their C++ errors into ``RuntimeError``. Its subclasses
#: ``NotImplementedError`` and ``RecursionError`` are bugs: :func:`native_bug` tells them apart.
NATIVE_DECODE_ERRORS: tuple[type[Exception], ...] = (RuntimeError,)


def native_bug(exc: BaseException) -> bool:
    """True when ``exc``, a :data:`NATIVE_DECODE_ERRORS`, is a bug rather than undecodable data."""
    return isinstance(exc, (NotImplementedError, RecursionError))


def is_jpeg(data) -> bool:
    """True when ``data`` (bytes-like: bytes, a memoryview, a uint8 array) starts like a JPEG."""
    return bytes(memoryview(data)[:3]) == JPEG_SIGNATURE


def is_jpeg_each(blob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """:func:`is_jpeg` of each buffer ``blob[offsets[k]:offsets[k + 1]]`` of the concatenated
    bytes ``blob`` (1-D uint8), vectorized (a Python check per sample costs ~1 ms a batch):
    ``[len(offsets) - 1]`` bool."""
    starts, ends = offsets[:-1], offsets[1:]
    ok = (ends - starts) >= len(JPEG_SIGNATURE)
    if not ok.any():
        return ok
    head = np.where(ok, starts, 0)  # a buffer too short reads blob[0:3], which exists: ok says no
    for i, byte in enumerate(JPEG_SIGNATURE):
        ok &= blob[head + i] == byte
    return ok


class TooManyPixels(Image.DecompressionBombError):
    """An image whose header declares more pixels than the caller's limit (one of
    :data:`DAMAGED_INPUT`); ``str()`` is ``"too many pixels (WxH)"``.

    Attributes:
        size: ``(width, height)`` as the header declares it.
    """

    def __init__(self, size: tuple[int, int]):
        super().__init__(f"too many pixels ({size[0]}x{size[1]})")
        self.size = size


@contextlib.contextmanager
def quiet_pillow() -> Iterator[None]:
    """Silence, inside the block, the warnings Pillow raises about an input (a bomb warning, a
    corrupt EXIF block, a palette's transparency): a pack of a million files would print them by
    the thousand. Only warnings from Pillow's own modules, and its bomb warning wherever it is
    attributed; everything else still shows."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        warnings.filterwarnings("ignore", module=r"PIL(\.|$)")
        yield


def open_image(data: bytes, *, max_pixels: int) -> Image.Image:
    """Open ``data`` with Pillow, lazily (the header is read, no pixels decoded), with
    ``max_pixels`` as this call's decompression-bomb limit in place of Pillow's process-wide one.

    ``Image.MAX_IMAGE_PIXELS`` is read, never set: an image past Pillow's limit but within
    ``max_pixels`` is opened through its format plugin directly, which checks no limit. (A few
    plugins check the limit themselves while opening: a GIF or ICO past twice Pillow's limit still
    raises its ``DecompressionBombError``.) Call it inside :func:`quiet_pillow` to silence Pillow's
    warnings about the input for the decode that follows too; it silences them itself here.

    Args:
        data: the encoded image.
        max_pixels: the most pixels (width x height) the caller decodes.

    Returns:
        The opened image; ``load()`` decodes it.

    Raises:
        TooManyPixels: the header declares more than ``max_pixels`` pixels.
        UnidentifiedImageError: no format recognises the bytes (one of :data:`DAMAGED_INPUT`, as
            every other failure of a damaged input).
    """
    fp = io.BytesIO(data)
    with quiet_pillow():
        try:
            im = Image.open(fp)
        except Image.DecompressionBombError:
            im = _open_unlimited(fp)
    w, h = im.size
    if w * h > max_pixels:
        raise TooManyPixels((w, h))
    return im


def _open_unlimited(fp: io.BytesIO) -> Image.Image:
    """What ``Image.open`` does for bytes it identified and refused as a bomb, without its limit:
    the first registered format that accepts the prefix and whose plugin opens the file."""
    Image.init()  # every plugin registered (Image.open loads them on demand)
    fp.seek(0)
    prefix = fp.read(16)
    for fmt in Image.ID:
        factory, accept = Image.OPEN[fmt]
        accepted = accept is None or accept(prefix)
        if not accepted or isinstance(accepted, str):
            continue  # no, or (a str) why not
        fp.seek(0)
        try:
            return factory(fp, "")
        except (SyntaxError, IndexError, TypeError, struct.error):
            continue  # not this format after all: Image.open's own rule
    raise Image.UnidentifiedImageError("cannot identify image file")


__all__ = [
    "DAMAGED_INPUT",
    "JPEG_SIGNATURE",
    "NATIVE_DECODE_ERRORS",
    "TooManyPixels",
    "is_jpeg",
    "is_jpeg_each",
    "native_bug",
    "open_image",
    "quiet_pillow",
]
