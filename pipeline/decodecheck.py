"""Which JPEG bytes every decoder of the Loader reads the same way.

``stoker pack`` copies a JPEG byte for byte only when :func:`jpeg_copy_safe` says so;
everything else is re-encoded (``stoker verify`` decodes stored samples instead:
:mod:`stoker.tools.verify.imagecheck`).
The rule is deliberately narrow, the subset that libjpeg-turbo (DALI's CPU decoder
``fn.decoders.image`` / ``image_slice``, and Pillow for the ``pil`` backend), nvJPEG and
browsers all decode identically:

* SOI first; only APPn, COM, DQT, DHT, DRI, one SOF0 and one SOS before the scan;
* SOF0: baseline DCT, Huffman coded, 8-bit samples, 1 or 3 components with sampling
  factors 1..2, size 1..65500 on each side and the height in the frame header (no DNL);
* 3 components are YCbCr (not Adobe ``transform=0`` RGB nor component ids ``R,G,B``);
* one interleaved scan over all components, Huffman and quantization tables defined
  before it;
* the entropy-coded data ends at EOI, and nothing but EOI follows it (no trailing bytes).

Progressive (SOF2), extended (SOF1), lossless (SOF3/SOF7/SOF11/SOF15), arithmetic
(SOF9..SOF15), hierarchical (SOF5..7, DHP/EXP), 12-bit, CMYK, multi-scan files, and
anything after EOI get a short reason instead. The check parses markers only (no pixel
decoding): microseconds per file, pure Python. What starts a JPEG is
:func:`stoker.pipeline.imagedecode.is_jpeg`'s rule, as everywhere.
"""

from __future__ import annotations

import struct

from .imagedecode import is_jpeg

__all__ = ["jpeg_copy_safe"]

MAX_SIDE = 65500  # libjpeg-turbo's JPEG_MAX_DIMENSION

_SOF_KIND = {
    0xC1: "extended sequential (SOF1)",
    0xC2: "progressive (SOF2)",
    0xC3: "lossless (SOF3)",
    0xC5: "hierarchical (SOF5)",
    0xC6: "hierarchical progressive (SOF6)",
    0xC7: "hierarchical lossless (SOF7)",
    0xC9: "arithmetic coding (SOF9)",
    0xCA: "progressive arithmetic coding (SOF10)",
    0xCB: "lossless arithmetic coding (SOF11)",
    0xCD: "hierarchical arithmetic coding (SOF13)",
    0xCE: "hierarchical progressive arithmetic coding (SOF14)",
    0xCF: "hierarchical lossless arithmetic coding (SOF15)",
}


def jpeg_copy_safe(data: bytes) -> str | None:
    """Decide whether JPEG ``data`` can be stored as it is.

    Args:
        data: the complete file.

    Returns:
        None when every Loader decoder reads these bytes identically; otherwise a short
        reason (e.g. ``"progressive (SOF2)"``, ``"bytes after EOI"``) why it must be
        re-encoded (or, if it does not decode at all, rejected).
    """
    if not is_jpeg(data):
        return "not a JPEG"
    n = len(data)
    pos = 2
    frame: tuple[int, int, list[int]] | None = None  # (height, width, component ids)
    have_dht = have_dqt = False
    adobe_transform: int | None = None
    while True:
        # Markers may be preceded by any number of 0xFF fill bytes.
        if pos >= n or data[pos] != 0xFF:
            return "malformed marker structure"
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            return "truncated (no scan)"
        marker = data[pos]
        pos += 1
        if marker == 0xD9:
            return "no image scan"
        if marker in (0x01,) or 0xD0 <= marker <= 0xD7 or marker == 0xD8 or marker == 0x00:
            return f"unexpected marker 0xFF{marker:02X} before the scan"
        if pos + 2 > n:
            return "truncated header"
        length = struct.unpack_from(">H", data, pos)[0]
        if length < 2 or pos + length > n:
            return "truncated header"
        seg = data[pos + 2 : pos + length]
        pos += length
        if marker in _SOF_KIND:
            return _SOF_KIND[marker]
        if marker in (0xDE, 0xDF):
            return "hierarchical (DHP/EXP)"
        if marker == 0xCC:
            return "arithmetic coding (DAC)"
        if marker == 0xDC:
            return "height defined by DNL"
        if marker == 0xC4:
            have_dht = True
        elif marker == 0xDB:
            have_dqt = True
        elif marker == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12:
            adobe_transform = seg[11]
        elif marker == 0xC0:
            if frame is not None:
                return "more than one frame header"
            if len(seg) < 6:
                return "truncated frame header"
            precision, height, width, ncomp = struct.unpack_from(">BHHB", seg)
            if precision != 8:
                return f"{precision}-bit samples"
            if height == 0:
                return "height defined by DNL"
            if width == 0:
                return "zero width"
            if height > MAX_SIDE or width > MAX_SIDE:
                return f"too large ({width}x{height})"
            if ncomp not in (1, 3):
                return f"{ncomp} components" + (" (CMYK)" if ncomp == 4 else "")
            if len(seg) < 6 + 3 * ncomp:
                return "truncated frame header"
            ids = []
            for c in range(ncomp):
                cid, hv, _tq = seg[6 + 3 * c : 9 + 3 * c]
                if not (1 <= hv >> 4 <= 2 and 1 <= hv & 15 <= 2):
                    return f"unusual sampling factors {hv >> 4}x{hv & 15}"
                ids.append(cid)
            frame = (height, width, ids)
        elif marker == 0xDA:
            if frame is None:
                return "scan before frame header"
            if not (have_dht and have_dqt):
                return "no Huffman tables" if not have_dht else "no quantization tables"
            if not seg or seg[0] != len(frame[2]):
                return "not a single interleaved scan"
            if len(frame[2]) == 3 and (adobe_transform == 0 or bytes(frame[2]) == b"RGB"):
                return "RGB colour transform"
            break
        elif not (0xE0 <= marker <= 0xEF or marker in (0xFE, 0xDD)):
            return f"unexpected marker 0xFF{marker:02X}"
    # Entropy-coded data: bytes, stuffed 0xFF00, restart markers, fill 0xFFs; then EOI.
    while True:
        j = data.find(b"\xff", pos)
        if j < 0 or j + 1 >= n:
            return "truncated (no EOI)"
        nxt = data[j + 1]
        if nxt == 0x00 or 0xD0 <= nxt <= 0xD7 or nxt == 0xFF:
            pos = j + 1 if nxt == 0xFF else j + 2
            continue
        if nxt == 0xD9:
            if j + 2 != n:
                return "bytes after EOI"
            return None
        if nxt == 0xDA:
            return "more than one scan"
        return f"marker 0xFF{nxt:02X} inside the scan"
