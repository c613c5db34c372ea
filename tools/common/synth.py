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

import numpy as np

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


def _tint(size: tuple[int, int], t: float, rng: random.Random):
    """An RGB picture of a random pattern whose colours run from blue (``t=0``) to red (``t=1``)."""
    from PIL import Image

    im = draw(rng.choice(CLASSES), size, rng)
    a = np.asarray(im, np.float32)
    gray = a.mean(axis=2, keepdims=True) / 255.0
    warm, cool = np.array([230, 60, 40], np.float32), np.array([40, 80, 230], np.float32)
    colour = (t * warm + (1 - t) * cool)[None, None, :]
    out = 0.35 * a + 0.65 * gray * colour + rng.uniform(-8, 8)
    return Image.fromarray(np.clip(out, 0, 255).astype(np.uint8), "RGB")


def make_regression_csv(
    root: str | Path,
    *,
    n: int = 200,
    seed: int = 0,
    min_side: int = 48,
    max_side: int = 160,
    low: float = 0.0,
    high: float = 1.0,
    column: str = "temperature",
) -> Path:
    """Images whose colour temperature is their target: ``root/images/<k>.jpg`` and
    ``root/targets.csv`` (``path,<column>``, floats in ``[low, high]``: natural units such as ages
    18 to 80 with ``low=18, high=80``). The target survives crops and flips, so a small CNN learns
    it (the demo's regression task). Returns the CSV's path."""
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = [f"path,{column}"]
    for k in range(n):
        t = rng.random()
        size = (rng.randint(min_side, max_side), rng.randint(min_side, max_side))
        (root / "images" / f"{k:05d}.jpg").write_bytes(encode(_tint(size, t, rng), quality=90))
        rows.append(f"images/{k:05d}.jpg,{low + t * (high - low):.6f}")
    (root / "targets.csv").write_text("\n".join(rows) + "\n")
    return root / "targets.csv"


#: the segmentation demo's classes (index = mask value; 0 is the background)
SEG_CLASSES = ("background", "stripes", "checker", "dots")


def _texture(kind: int, h: int, w: int, rng: random.Random) -> np.ndarray:
    """A ``[h, w]`` float texture in [0, 1] of segmentation class ``kind``."""
    y, x = np.mgrid[0:h, 0:w]
    step = rng.randint(4, 8)
    if kind == 1:
        return ((x + y) // step % 2).astype(np.float32)
    if kind == 2:
        return ((x // step + y // step) % 2).astype(np.float32)
    if kind == 3:
        return (((x % (2 * step)) < step // 2 + 1) & ((y % (2 * step)) < step // 2 + 1)).astype(np.float32)
    return (x / max(1, w - 1)).astype(np.float32)  # background: a smooth gradient


def draw_segmentation(size: tuple[int, int], rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """A grayscale picture (uint8 ``[h, w]``) of 2-4 textured shapes on a smooth background and
    its mask (uint8 ``[h, w]``: 0 background, 1 stripes, 2 checker, 3 dots)."""
    w, h = size
    mask = np.zeros((h, w), np.uint8)
    y, x = np.mgrid[0:h, 0:w]
    for _ in range(rng.randint(2, 4)):
        kind = rng.randint(1, 3)
        cx, cy, r = rng.randint(0, w), rng.randint(0, h), rng.randint(min(w, h) // 6, min(w, h) // 3)
        if rng.random() < 0.5:
            inside = (x - cx) ** 2 + (y - cy) ** 2 <= r * r
        else:
            inside = (abs(x - cx) <= r) & (abs(y - cy) <= r)
        mask[inside] = kind
    image = np.zeros((h, w), np.float32)
    lo, hi = rng.uniform(0, 90), rng.uniform(150, 255)
    for kind in range(4):
        t = _texture(kind, h, w, rng)
        image = np.where(mask == kind, lo + (hi - lo) * t, image)
    return np.clip(image, 0, 255).astype(np.uint8), mask


def make_segmentation_tree(
    root: str | Path, *, n: int = 120, seed: int = 0, min_side: int = 64, max_side: int = 160
) -> tuple[Path, Path]:
    """``root/images/<k>.png`` grayscale pictures of textured shapes and ``root/masks/<k>.png``
    their masks (palette PNGs whose indices are :data:`SEG_CLASSES`): the segmentation demo's
    data, a tree pair for ``stoker pack IMAGES OUT --masks MASKS``. Returns ``(images, masks)``."""
    from PIL import Image

    root = Path(root)
    images, masks = root / "images", root / "masks"
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    palette = [0, 0, 0, 230, 80, 40, 40, 200, 90, 60, 90, 230] + [0] * (256 * 3 - 12)
    for k in range(n):
        size = (rng.randint(min_side, max_side), rng.randint(min_side, max_side))
        picture, mask = draw_segmentation(size, rng)
        Image.fromarray(picture, "L").save(images / f"{k:05d}.png")
        m = Image.fromarray(mask, "P")
        m.putpalette(palette)
        m.save(masks / f"{k:05d}.png")
    return images, masks


#: the shapes of the detection scenes (class index = position)
SHAPES = ("box", "disc", "bar")


def draw_scene(size: tuple[int, int], rng: random.Random, *, max_objects: int = 3) -> tuple[np.ndarray, list]:
    """An RGB picture (uint8 ``[h, w, 3]``) of 0 to ``max_objects`` solid shapes on a noisy
    background and their exact boxes ``[(x0, y0, x1, y1, class), ...]`` in pixels (``x1``: one
    past the last column of the shape): ``box`` a solid rectangle filling its box, ``disc`` an
    ellipse touching its box's sides, ``bar`` a rectangle three times as wide as tall."""
    w, h = size
    image = np.clip(rng.uniform(40, 200) + np.random.default_rng(rng.getrandbits(32)).normal(0, 12, (h, w, 3)), 0, 255)
    image = image.astype(np.uint8)
    boxes = []
    y, x = np.mgrid[0:h, 0:w]
    for _ in range(rng.randint(0, max_objects)):
        cls = rng.randrange(len(SHAPES))
        bw = rng.randint(max(4, w // 6), max(5, w // 2))
        bh = bw // 3 if SHAPES[cls] == "bar" else rng.randint(max(4, h // 6), max(5, h // 2))
        bh = max(3, min(bh, h - 1))
        x0, y0 = rng.randint(0, w - bw), rng.randint(0, h - bh)
        colour = np.array([rng.choice((0, 255)) if c == cls else rng.randint(0, 80) for c in range(3)], np.uint8)
        if SHAPES[cls] == "disc":
            cx, cy = x0 + (bw - 1) / 2, y0 + (bh - 1) / 2
            inside = ((x - cx) / (bw / 2)) ** 2 + ((y - cy) / (bh / 2)) ** 2 <= 1.0
        else:
            inside = (x >= x0) & (x < x0 + bw) & (y >= y0) & (y < y0 + bh)
        ys, xs = np.nonzero(inside)
        image[inside] = colour
        boxes.append((int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1, cls))
    return image, boxes


def make_detection_scenes(
    root: str | Path,
    *,
    n: int = 40,
    seed: int = 0,
    min_side: int = 48,
    max_side: int = 96,
    formats: tuple[str, ...] = ("coco", "yolo", "voc"),
    val: int = 0,
) -> dict[str, Path]:
    """``n`` scenes of :func:`draw_scene` (``val`` more for a val split), written in each of
    ``formats``: ``root/coco`` (``images/`` + ``annotations/instances_{train,val}.json``),
    ``root/yolo`` (``images/{train,val}/`` + ``labels/{train,val}/*.txt`` + ``data.yaml``),
    ``root/voc`` (``JPEGImages/``, ``Annotations/*.xml``, ``ImageSets/Main/{train,val}.txt``).
    PNG pictures (exact colours); every fifth scene (and some others) has no shape: a negative. Returns each format's
    folder (what ``stoker pack`` takes as SRC)."""
    from PIL import Image

    root = Path(root)
    rng = random.Random(seed)
    scenes = []
    for k in range(n + val):
        size = (rng.randint(min_side, max_side), rng.randint(min_side, max_side))
        image, boxes = draw_scene(size, rng, max_objects=0 if k % 5 == 4 else 3)  # every fifth a negative
        scenes.append(("val" if k >= n else "train", f"{k:05d}", image, boxes))
    out = {}
    for fmt in formats:
        folder = out[fmt] = root / fmt
        for split, name, image, _ in scenes:
            rel = {"coco": f"images/{name}.png", "yolo": f"images/{split}/{name}.png", "voc": f"JPEGImages/{name}.png"}
            path = folder / rel[fmt]
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(path)
        {"coco": _write_coco, "yolo": _write_yolo, "voc": _write_voc}[fmt](folder, scenes)
    return out


def _write_coco(folder: Path, scenes: list) -> None:
    import json

    (folder / "annotations").mkdir(parents=True, exist_ok=True)
    categories = [{"id": c + 1, "name": s} for c, s in enumerate(SHAPES)]
    for split in sorted({s[0] for s in scenes}):
        images, annotations = [], []
        for k, (sp, name, image, boxes) in enumerate(scenes):
            if sp != split:
                continue
            h, w = image.shape[:2]
            images.append({"id": k + 1, "file_name": f"{name}.png", "width": w, "height": h})
            for x0, y0, x1, y1, c in boxes:
                bbox = [x0, y0, x1 - x0, y1 - y0]
                ann = {"image_id": k + 1, "bbox": bbox, "category_id": c + 1, "iscrowd": 0, "area": bbox[2] * bbox[3]}
                annotations.append({"id": len(annotations) + 1, **ann})
        doc = {"images": images, "annotations": annotations, "categories": categories}
        (folder / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))


def _write_yolo(folder: Path, scenes: list) -> None:
    for split, name, image, boxes in scenes:
        h, w = image.shape[:2]
        lines = [
            f"{c} {(x0 + x1) / 2 / w:.8f} {(y0 + y1) / 2 / h:.8f} {(x1 - x0) / w:.8f} {(y1 - y0) / h:.8f}"
            for x0, y0, x1, y1, c in boxes
        ]
        path = folder / "labels" / split / f"{name}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))
    names = "".join(f"  {c}: {s}\n" for c, s in enumerate(SHAPES))
    splits = "".join(f"{s}: images/{s}\n" for s in ("train", "val") if any(sc[0] == s for sc in scenes))
    (folder / "data.yaml").write_text(f"{splits}names:\n{names}")


def _write_voc(folder: Path, scenes: list) -> None:
    (folder / "Annotations").mkdir(parents=True, exist_ok=True)
    lists: dict[str, list[str]] = {}
    for split, name, image, boxes in scenes:
        h, w = image.shape[:2]
        objects = "".join(
            f"<object><name>{SHAPES[c]}</name><difficult>0</difficult><bndbox><xmin>{x0 + 1}</xmin>"
            f"<ymin>{y0 + 1}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>"
            for x0, y0, x1, y1, c in boxes
        )
        xml = (
            f"<annotation><filename>{name}.png</filename><size><width>{w}</width><height>{h}</height>"
            f"<depth>3</depth></size>{objects}</annotation>"
        )
        (folder / "Annotations" / f"{name}.xml").write_text(xml)
        lists.setdefault(split, []).append(name)
    (folder / "ImageSets" / "Main").mkdir(parents=True, exist_ok=True)
    for split, names in lists.items():
        (folder / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(n + "\n" for n in names))
