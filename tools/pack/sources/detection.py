"""The detection readers: boxes in the three formats people hold them in, packed as the box kind.

- ``coco``: COCO JSON, ``annotations/instances_<split>.json`` (or one ``instances_*.json`` as
  SRC) beside the image folder (``<split>/``, ``images/<split>/``, ``images/`` or SRC itself);
  ``bbox`` is ``x y w h`` in pixels; ``iscrowd`` is kept (scored as "ignore").
- ``yolo``: ``images/[<split>/]`` + ``labels/[<split>/]<stem>.txt`` of ``class cx cy w h`` rows
  in shares of the image; class names from ``data.yaml``'s ``names`` (or ``classes.txt``).
- ``voc``: Pascal VOC, ``Annotations/*.xml`` + ``JPEGImages/`` (+ ``ImageSets/Main/<split>.txt``
  lists); 1-based inclusive corners; ``difficult`` is kept as crowd (scored as "ignore").

Every reader hands pack its boxes as shares of the image (``x0 y0 x1 y1`` in ``[0, 1]``, class,
crowd): pack multiplies them by the stored image's size, so its resize scales them. An image
without boxes is a negative (kept). A box outside its image (by more than half a pixel), with a
non-positive size or naming an unknown class makes its image a listed reject with the reason:
never clipped away silently (a part-labelled image would teach a detector that objects are background).
"""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from stoker.errors import UsageError
from stoker.pipeline.shards.kinds import Target

from ..sanitize import IMAGE_EXTS
from .base import SPLITS, FileReader, Item, Scan

#: how far (pixels) a box may reach past its image before it is a reject; within it, it is clipped
EDGE_SLACK = 0.5
_KIND = "boxes"


def box_target() -> Target:
    """The target of a detection split (the box kind, found by its name in the registry)."""
    return Target.of(_KIND)


def normalized_rows(
    boxes: list, size: tuple[float, float], num_classes: int, *, slack: float = EDGE_SLACK, image: str = ""
) -> tuple[tuple, str | None]:
    """``boxes`` (``(x0, y0, x1, y1, class, crowd)`` in pixels of an image of ``size``) as shares of
    the image, or why the image is a reject (a box past the image by more than ``slack``)."""
    w, h = size
    image = image or f"its {w:g}x{h:g} image"
    if not (w > 0 and h > 0):
        return (), f"image size {w}x{h} is not positive"
    rows = []
    for x0, y0, x1, y1, cls, crowd in boxes:
        where = f"box [{x0:g}, {y0:g}, {x1:g}, {y1:g}]"
        if not (x1 > x0 and y1 > y0):
            return (), f"{where} has no positive size"
        if x0 < -slack or y0 < -slack or x1 > w + slack or y1 > h + slack:
            return (), f"{where} is outside {image}"
        if not 0 <= cls < num_classes:
            return (), f"{where} names class {cls}, not one of the {num_classes} declared"
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w), min(y1, h)
        rows.append((x0 / w, y0 / h, x1 / w, y1 / h, float(cls), float(bool(crowd))))
    return tuple(rows), None


def _split_of(name: str) -> str:
    return "val" if "val" in name.lower() else "train"


def _check_targets(options, name: str) -> None:
    if options.targets not in ("auto", _KIND):
        raise UsageError(f"a {name} source's targets are its boxes, not {options.targets!r}")


class _Found:
    """What a box reader's walk found: per split, the images kept with their box rows, and the
    rejects with why."""

    def __init__(self):
        self.splits: dict[str, list[Item]] = {}
        self.rejects: dict[str, list] = {s: [] for s in SPLITS}

    def split(self, name: str) -> None:
        """``name`` is one of SRC's splits, even if none of its images is kept."""
        self.splits.setdefault(name, [])

    def add(self, split: str, rel: str, rows: tuple, why: str | None) -> None:
        """Keep ``rel`` with its box ``rows``, or reject it for ``why``."""
        if why:
            self.rejects[split].append((rel, why))
        else:
            self.splits.setdefault(split, []).append(Item(rel, target=rows))

    def scan(self, classes: list[str], val_source: str) -> Scan:
        return Scan(
            classes, self.splits, {s: 0 for s in self.splits}, self.rejects, box_target(), val_source=val_source
        )


class CocoReader(FileReader):
    """COCO JSON: ``instances_*.json`` beside an image folder."""

    name, priority = "coco", 12
    summary = "COCO JSON boxes (annotations/instances_<split>.json beside the images)"
    path_rule = "COCO file_name is relative to the image folder beside annotations/ ({base})"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return bool(isinstance(src, Path) and _coco_files(src))

    def scan(self) -> Scan:
        _check_targets(self.options, "COCO")
        src = self.src
        files = [src] if src.is_file() and src.suffix == ".json" else _coco_files(src)  # named: any .json
        if not files:
            raise UsageError(f"SRC {src} holds no COCO file (annotations/instances_*.json, or a .json as SRC)")
        root = self.src if self.src.is_dir() else self.src.parent
        self.base = root.parent if root.name == "annotations" else root
        classes: list[str] | None = None
        found = _Found()
        for path in files:
            try:
                doc = json.loads(path.read_text())
                cats = sorted(doc["categories"], key=lambda c: c["id"])
                names = [str(c["name"]) for c in cats]
                images, anns = doc["images"], doc.get("annotations", [])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise UsageError(f"{path} is not a COCO instances file: {e}") from None
            if classes is not None and names != classes:
                raise UsageError(f"{path}'s categories differ from {files[0]}'s: one class list per pack")
            classes = names
            index = {c["id"]: k for k, c in enumerate(cats)}
            split = _split_of(path.stem)
            folder = self._image_folder(path, images)
            by_image: dict = {}
            for a in anns:
                by_image.setdefault(a.get("image_id"), []).append(a)
            found.split(split)
            for im in images:
                rel = (folder / str(im["file_name"])).relative_to(self.base).as_posix()
                boxes = []
                for a in by_image.get(im["id"], []):
                    x, y, bw, bh = (float(v) for v in a["bbox"])
                    cls = index.get(a.get("category_id"), len(cats))
                    boxes.append((x, y, x + bw, y + bh, cls, a.get("iscrowd", 0)))
                rows, why = normalized_rows(boxes, (float(im.get("width", 0)), float(im.get("height", 0))), len(cats))
                found.add(split, rel, rows, why)
        return found.scan(classes or [], val_source="a val COCO file")

    def _image_folder(self, path: Path, images: list) -> Path:
        """Where the file names of ``path`` are: the first candidate holding its first image."""
        split_name = path.stem.split("instances_", 1)[-1]
        base = self.base
        candidates = [base / split_name, base / "images" / split_name, base / "images", base]
        first = str(images[0]["file_name"]) if images else ""
        for c in candidates:
            if (c / first).is_file():
                return c
        return next((c for c in candidates if c.is_dir()), base)


def _coco_files(src: Path) -> list[Path]:
    if src.is_file():
        return [src] if src.suffix == ".json" and src.name.startswith("instances_") else []
    if not src.is_dir():
        return []
    return sorted((src / "annotations").glob("instances_*.json")) or sorted(src.glob("instances_*.json"))


class YoloReader(FileReader):
    """YOLO: ``images/`` + ``labels/*.txt`` of normalized ``class cx cy w h`` rows."""

    name, priority = "yolo", 13
    summary = "YOLO boxes (images/ + labels/*.txt, names in data.yaml)"
    path_rule = "YOLO images are under {base}/images"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return isinstance(src, Path) and (src / "images").is_dir() and (src / "labels").is_dir()

    def scan(self) -> Scan:
        _check_targets(self.options, "YOLO")
        src, found = self.src, _Found()
        names = _yolo_names(src)
        subs = sorted(p.name for p in (src / "images").iterdir() if p.is_dir())
        layout = [(s, f"images/{s}", f"labels/{s}") for s in subs] or [("train", "images", "labels")]
        for name, images, labels in layout:
            split = _split_of(name)
            found.split(split)
            for path in sorted((src / images).iterdir()):
                if path.suffix.lower() not in IMAGE_EXTS:
                    continue
                rel = f"{images}/{path.name}"
                boxes, why = _yolo_rows(src / labels / f"{path.stem}.txt", len(names) if names else None)
                found.add(split, rel, boxes, why)
        if not names:  # no names given: classes are the indices found
            found = max((int(r[4]) for its in found.splits.values() for it in its for r in it.target), default=-1)
            names = [str(c) for c in range(found + 1)]
        return found.scan(names, val_source="images/val")


def _yolo_names(src: Path) -> list[str]:
    for yaml_path in (src / "data.yaml", src / "dataset.yaml"):
        if yaml_path.is_file():
            import yaml

            try:
                names = (yaml.safe_load(yaml_path.read_text()) or {}).get("names")
            except yaml.YAMLError as e:
                raise UsageError(f"{yaml_path} does not parse: {str(e).splitlines()[0]}") from None
            if isinstance(names, dict):
                return [str(names[k]) for k in sorted(names)]
            if isinstance(names, list):
                return [str(n) for n in names]
    for txt in (src / "classes.txt", src / "obj.names"):
        if txt.is_file():
            return [line.strip() for line in txt.read_text().splitlines() if line.strip()]
    return []


def _yolo_rows(path: Path, num_classes: int | None) -> tuple[tuple, str | None]:
    """A label file's rows as shares of the image (no file: a negative), or why it is a reject."""
    if not path.is_file():
        return (), None
    boxes = []
    for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        cells = line.split()
        if not cells:
            continue
        try:
            cls, cx, cy, w, h = int(cells[0]), *(float(c) for c in cells[1:5])
        except ValueError:
            return (), f"{path.name} line {lineno} is not 'class cx cy w h': {line.strip()[:60]!r}"
        if len(cells) != 5:
            return (
                (),
                f"{path.name} line {lineno} has {len(cells)} values, not 5 (class cx cy w h; polygons are not boxes)",
            )
        boxes.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, cls, 0))
    # shares of the image already: an image of 1 x 1, the slack a share (half a pixel of 1000)
    classes = num_classes if num_classes is not None else 1 << 30
    return normalized_rows(boxes, (1.0, 1.0), classes, slack=5e-4, image="the image (shares 0..1)")


class VocReader(FileReader):
    """Pascal VOC: ``Annotations/*.xml`` + ``JPEGImages/`` (+ ``ImageSets/Main`` lists)."""

    name, priority = "voc", 14
    summary = "Pascal VOC boxes (Annotations/*.xml + JPEGImages/ + ImageSets/Main lists)"
    path_rule = "VOC images are under {base}/JPEGImages"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return isinstance(src, Path) and (src / "Annotations").is_dir() and (src / "JPEGImages").is_dir()

    def scan(self) -> Scan:
        _check_targets(self.options, "VOC")
        src, found = self.src, _Found()
        lists = src / "ImageSets" / "Main"
        layout = {s: _ids(lists / f"{s}.txt") for s in SPLITS if (lists / f"{s}.txt").is_file()}
        if not layout:
            layout = {"train": [p.stem for p in sorted((src / "Annotations").glob("*.xml"))]}
        parsed = {s: [(i, _voc_objects(src / "Annotations" / f"{i}.xml")) for i in ids] for s, ids in layout.items()}
        classes = sorted({o[0] for objs in parsed.values() for _, (_, _, ob) in objs for o in ob if o[0]})
        index = {c: k for k, c in enumerate(classes)}
        for split, objs in parsed.items():
            found.split(split)
            for name, (file_name, size, ob) in objs:
                rel = f"JPEGImages/{file_name or name + '.jpg'}"
                if isinstance(size, str):  # the XML's size is unreadable: why
                    found.add(split, rel, (), size)
                    continue
                boxes = [(x0 - 1, y0 - 1, x1, y1, index.get(c, len(classes)), hard) for c, x0, y0, x1, y1, hard in ob]
                found.add(split, rel, *normalized_rows(boxes, size, len(classes)))
        return found.scan(classes, val_source="ImageSets/Main/val.txt")


def _ids(path: Path) -> list[str]:
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]


def _voc_objects(path: Path) -> tuple[str, tuple | str, list]:
    """``(file name, (width, height) or why not, [(class, xmin, ymin, xmax, ymax, difficult)])``."""
    try:
        root = ET.parse(path).getroot()
        size = root.find("size")
        wh: tuple | str = (float(size.findtext("width")), float(size.findtext("height")))
        objects = []
        for o in root.iter("object"):
            b = o.find("bndbox")
            corners = (float(b.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax"))
            objects.append((o.findtext("name", "").strip(), *corners, int(o.findtext("difficult") or 0)))
        return root.findtext("filename", "").strip(), wh, objects
    except (OSError, ET.ParseError, AttributeError, TypeError, ValueError) as e:
        return "", f"{os.path.basename(path)} does not parse as a VOC annotation: {e}", []


__all__ = ["CocoReader", "VocReader", "YoloReader", "box_target", "normalized_rows"]
