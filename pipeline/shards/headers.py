"""The size of a stored image from its headers alone (JPEG start-of-frame, PNG ``IHDR``), with the
structural check every read applies (a JPEG ends in EOI, a PNG in IEND): what the Loader's header
guard and the sample table's recorded sizes both read."""

from __future__ import annotations

import struct

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers carry the image size; C4 (DHT), C8 (JPG), CC (DAC) do not.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# ... and the ones both decoders (libjpeg-turbo in DALI and pillow) handle: 8-bit Huffman
# baseline, extended, progressive. Lossless / arithmetic / 12-bit count as undecodable.
_SOF_OK = frozenset({0xC0, 0xC1, 0xC2})


def image_size(buf, start: int = 0, size: int | None = None) -> tuple[int, int] | None:
    """``(width, height)`` of a JPEG or PNG in ``buf[start:start+size]``, or ``None`` when
    the bytes are not a structurally complete JPEG/PNG (truncated, foreign, empty).

    Reads only the headers (and the last bytes for the end marker): microseconds.
    """
    from ..imagedecode import is_jpeg

    end = len(buf) if size is None else start + size
    if end - start < 24:
        return None
    if is_jpeg(buf[start : start + 3]):
        # EOI must end the data (allow trailing padding some writers add)
        tail = bytes(buf[max(start, end - 64) : end])
        if b"\xff\xd9" not in tail:
            return None
        pos = start + 2
        while pos + 10 <= end:
            if buf[pos] != 0xFF:
                return None
            marker = buf[pos + 1]
            if marker == 0xFF:  # fill byte
                pos += 1
                continue
            if marker in _SOF:
                if marker not in _SOF_OK or buf[pos + 4] != 8 or buf[pos + 9] not in (1, 3, 4):
                    return None
                h, w = struct.unpack_from(">HH", buf, pos + 5)
                return (w, h) if w and h else None
            if marker == 0xD8 or 0xD0 <= marker <= 0xD7 or marker == 0x01:
                pos += 2  # markers without a length
                continue
            if marker in (0xD9, 0xDA):  # EOI or scan data before any frame header
                return None
            (seglen,) = struct.unpack_from(">H", buf, pos + 2)
            pos += 2 + seglen
        return None
    if bytes(buf[start : start + 8]) == _PNG_SIG and bytes(buf[start + 12 : start + 16]) == b"IHDR":
        if b"IEND" not in bytes(buf[max(start, end - 16) : end]):
            return None
        w, h = struct.unpack_from(">II", buf, start + 16)
        return (w, h) if w and h else None
    return None


__all__ = ["image_size"]
