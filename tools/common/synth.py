"""Procedural image datasets: the demo's built-in default and the tests' data.

Each class is a visual pattern (shape or texture) a small CNN can learn, drawn at
random sizes, colours and positions, saved as real JPEG/PNG files of mixed sizes.
``nasty=True`` adds the inputs a real crawl contains: grayscale, CMYK, 16-bit and
RGBA PNGs, PNG bytes named ``.JPEG``, EXIF-rotated photos, odd file names, and
broken files (truncated, zero-byte, not an image, a decompression bomb header).
"""

from __future__ import annotations

import io
import random
import struct
import zlib
from pathlib import Path

CLASSES = ("circles", "squares", "stripes", "checker", "rings", "triangles")


def draw(cls: str, size: tuple[int, int], rng: random.Random):
    """One RGB PIL image of pattern ``cls``."""
    from PIL import Image, ImageDraw

    w, h = size
    bg = tuple(rng.randrange(0, 256) for _ in range(3))
    fg = tuple((c + 128 + rng.randrange(-40, 40)) % 256 for c in bg)
    im = Image.new("RGB", size, bg)
    d = ImageDraw.Draw(im)
    s = min(w, h)
    if cls == "circles":
        for _ in range(rng.randint(2, 5)):
            r = rng.randint(s // 10, s // 4)
            x, y = rng.randint(0, w), rng.randint(0, h)
            d.ellipse([x - r, y - r, x + r, y + r], fill=fg)
    elif cls == "squares":
        for _ in range(rng.randint(2, 5)):
            r = rng.randint(s // 10, s // 4)
            x, y = rng.randint(0, w), rng.randint(0, h)
            d.rectangle([x - r, y - r, x + r, y + r], fill=fg)
    elif cls == "stripes":
        step = rng.randint(max(2, s // 16), max(3, s // 6))
        for x in range(0, w + h, 2 * step):
            d.polygon([(x, 0), (x + step, 0), (x + step - h, h), (x - h, h)], fill=fg)
    elif cls == "checker":
        step = rng.randint(max(2, s // 12), max(3, s // 5))
        for y in range(0, h, step):
            for x in range((y // step % 2) * step, w, 2 * step):
                d.rectangle([x, y, x + step - 1, y + step - 1], fill=fg)
    elif cls == "rings":
        cx, cy = rng.randint(w // 4, 3 * w // 4), rng.randint(h // 4, 3 * h // 4)
        step = rng.randint(max(2, s // 20), max(3, s // 8))
        for r in range(s, 0, -2 * step):
            d.ellipse([cx - r, cy - r, cx + r, cy + r], outline=fg, width=step)
    elif cls == "triangles":
        for _ in range(rng.randint(2, 5)):
            r = rng.randint(s // 8, s // 3)
            x, y = rng.randint(0, w), rng.randint(0, h)
            d.polygon([(x, y - r), (x - r, y + r), (x + r, y + r)], fill=fg)
    else:
        raise ValueError(f"unknown pattern {cls!r}")
    return im


def encode(im, fmt: str = "JPEG", **save_kw) -> bytes:
    """``im`` saved as ``fmt`` (JPEG, PNG, ...) into bytes."""
    buf = io.BytesIO()
    im.save(buf, fmt, **save_kw)
    return buf.getvalue()


def bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A tiny PNG whose header claims ``width x height`` pixels (a decompression bomb)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def nasty_files(rng: random.Random) -> dict[str, bytes]:
    """Odd-but-valid and broken inputs, keyed by file name.

    Names starting ``bad_`` must be rejected by the packer; the rest must pack.
    """
    from PIL import Image

    base = draw("circles", (160, 120), rng)
    gray16 = Image.new("I;16", (64, 48))
    gray16.putdata([(i * 997) % 65536 for i in range(64 * 48)])
    rgba = base.convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(base.size))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display
    good = encode(base)
    return {
        "gray.jpg": encode(base.convert("L")),
        "cmyk.jpg": encode(base.convert("CMYK")),
        "rgba.png": encode(rgba, "PNG"),
        "gray16.png": encode(gray16, "PNG"),
        "palette.png": encode(base.convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        "png_named.JPEG": encode(base, "PNG"),
        "exif_rotated.jpg": encode(base, exif=exif.tobytes()),
        "progressive.jpg": encode(base, progressive=True),
        "odd name, with spaces & ünïcode's.jpg": good,
        "bad_truncated.jpg": good[: len(good) // 2],
        "bad_zero.jpg": b"",
        "bad_not_an_image.jpg": b"this is not an image\n" * 10,
        "bad_bomb.png": bomb_png(),
    }


def make_image_folder(
    root: str | Path,
    *,
    classes: tuple[str, ...] = CLASSES,
    per_class: int = 20,
    min_side: int = 64,
    max_side: int = 400,
    seed: int = 0,
    nasty: bool = False,
    quality: int = 90,
) -> Path:
    """Write an ImageFolder tree ``root/<class>/<n>.jpg`` and return ``root``.

    With ``nasty=True`` the files of :func:`nasty_files` go into the first class.
    """
    root = Path(root)
    rng = random.Random(seed)
    for cls in classes:
        d = root / cls
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            size = (rng.randint(min_side, max_side), rng.randint(min_side, max_side))
            im = draw(cls, size, rng)
            if rng.random() < 0.1:
                im = im.convert("L")
            (d / f"{cls}_{i:05d}.jpg").write_bytes(encode(im, quality=quality))
    if nasty:
        for name, data in nasty_files(rng).items():
            (root / classes[0] / name).write_bytes(data)
    return root
