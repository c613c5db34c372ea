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
    reason, pos = _check_headers(data)
    if reason is not None:
        return reason
    return _check_entropy_coded_data(data, pos)


def _check_headers(data: bytes) -> tuple[str | None, int]:
    """``(reason or None, where the scan's data starts)``: the marker segments from SOI up to
    and including the one SOS, checked."""
    pos = 2
    ids: list[int] | None = None  # the frame's component ids, once SOF0 is read
    have_dht = have_dqt = False
    adobe_transform: int | None = None
    while True:
        got = _read_segment(data, pos)
        if isinstance(got, str):
            return got, pos
        marker, seg, pos = got
        if marker in _SOF_KIND:
            return _SOF_KIND[marker], pos
        if marker in (0xDE, 0xDF):
            return "hierarchical (DHP/EXP)", pos
        if marker == 0xCC:
            return "arithmetic coding (DAC)", pos
        if marker == 0xDC:
            return "height defined by DNL", pos
        if marker == 0xC4:
            have_dht = True
        elif marker == 0xDB:
            have_dqt = True
        elif marker == 0xEE and seg[:5] == b"Adobe" and len(seg) >= 12:
            adobe_transform = seg[11]
        elif marker == 0xC0:
            if ids is not None:
                return "more than one frame header", pos
            frame = _frame_component_ids(seg)
            if isinstance(frame, str):
                return frame, pos
            ids = frame
        elif marker == 0xDA:
            return _check_scan_header(seg, ids, have_dht, have_dqt, adobe_transform), pos
        elif not (0xE0 <= marker <= 0xEF or marker in (0xFE, 0xDD)):
            return f"unexpected marker 0xFF{marker:02X}", pos


def _read_segment(data: bytes, pos: int) -> str | tuple[int, bytes, int]:
    """The marker segment at ``pos``: ``(marker, payload, position after it)``, or a reason
    when the bytes there are no segment that may come before the scan."""
    n = len(data)
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
    return marker, data[pos + 2 : pos + length], pos + length


def _frame_component_ids(seg: bytes) -> str | list[int]:
    """The component ids of a SOF0 payload ``seg``, or the reason it is not copy-safe."""
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
    return ids


def _check_scan_header(
    seg: bytes, ids: list[int] | None, have_dht: bool, have_dqt: bool, adobe_transform: int | None
) -> str | None:
    """Why the SOS payload ``seg`` (after a frame with component ``ids``, or none) is not the
    one interleaved YCbCr or grayscale scan with its tables defined; None when it is."""
    if ids is None:
        return "scan before frame header"
    if not (have_dht and have_dqt):
        return "no Huffman tables" if not have_dht else "no quantization tables"
    if not seg or seg[0] != len(ids):
        return "not a single interleaved scan"
    if len(ids) == 3 and (adobe_transform == 0 or bytes(ids) == b"RGB"):
        return "RGB colour transform"
    return None


def _check_entropy_coded_data(data: bytes, pos: int) -> str | None:
    """Why the scan data from ``pos`` does not run to one EOI that ends the file; None when it does."""
    n = len(data)
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
