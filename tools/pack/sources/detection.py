"""The detection readers: boxes in the formats people hold them in, packed as the box kind.

- ``coco``: COCO JSON in the layouts tools export (:mod:`.coco`); ``iscrowd`` is kept (scored
  as "ignore").
- ``yolo``: ``images/`` + ``labels/`` of ``class cx cy w h`` rows in shares of the image, or
  Ultralytics' ``data.yaml`` (:mod:`.yolo`).
- ``voc``: Pascal VOC, ``Annotations/*.xml`` + ``JPEGImages/`` (+ ``ImageSets/Main/<split>.txt``
  lists); 1-based inclusive corners; ``difficult`` is kept as crowd (scored as "ignore").

Every reader hands pack its boxes as shares of the image the annotation was drawn on
(``x0 y0 x1 y1`` in ``[0, 1]``, class, crowd) with that image's size as the annotation gives it
(:class:`~stoker.pipeline.shards.boxes.BoxTarget`): pack puts them in the frame of the stored
pixels (an EXIF rotation, pack's resize). An image without boxes is a negative (kept). A box
outside its image (by more than half a pixel), with a non-positive size or naming an unknown
class makes its image a listed reject with the reason: never clipped away silently (a
part-labelled image would teach a detector that objects are background).

A folder that would pack as plain classes but holds an annotation file is refused in one line
naming the file and the ``--source`` that reads it (:func:`annotations_beside`): never a silent
one-class pack of a detection dataset.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from stoker.errors import UsageError
from stoker.pipeline.shards.boxes import BoxTarget
from stoker.pipeline.shards.kinds import Target

from ..options import setting
from .base import BOX_FRAMES, SPLITS, FileReader, Item, Scan

#: how far (pixels) a box may reach past its image before it is a reject; within it, it is clipped
EDGE_SLACK = 0.5
_KIND = "boxes"
#: folders that hold a detection format's labels, and the reader of that format
_ANNOTATION_DIRS = {"labels": "yolo", "Annotations": "voc", "annotations": "coco"}


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


def split_role(name: str, *, named: bool = False) -> str | None:
    """The split of a file or folder called ``name``: ``val`` when it says so (``val2017``,
    Roboflow's ``valid``), None for a test split (left out: stoker packs train and val) unless
    ``named`` (given as SRC itself: packed as train), else ``train``."""
    low = name.lower()
    if "val" in low:
        return "val"
    if "test" in low and not named:
        return None
    return "train"


def check_box_targets(options, name: str) -> None:
    if options.targets not in ("auto", _KIND):
        raise UsageError(f"a {name} source's targets are its boxes, not {options.targets!r}")


class Found:
    """What a box reader's walk found: per split, the images kept with their box rows, the
    rejects with why, the notes the summary prints, and the category ids of the classes."""

    def __init__(self):
        self.splits: dict[str, list[Item]] = {}
        self.rejects: dict[str, list] = {s: [] for s in SPLITS}
        self.notes: list[str] = []
        #: the dataset's own id of each class (COCO's category ids), in class order
        self.ids: list | None = None

    def split(self, name: str) -> None:
        """``name`` is one of SRC's splits, even if none of its images is kept."""
        self.splits.setdefault(name, [])

    def note(self, line: str) -> None:
        self.notes.append(line)

    def add(self, split: str, rel: str, rows, why: str | None) -> None:
        """Keep ``rel`` with its box ``rows`` (a :class:`BoxTarget`, or shares of the upright
        image), or reject it for ``why``."""
        if why:
            self.rejects[split].append((rel, why))
        else:
            self.splits.setdefault(split, []).append(Item(rel, target=rows))

    def add_pixels(
        self, split: str, rel: str, boxes: list, size: tuple, num_classes: int, options, *, image_id=None
    ) -> None:
        """Keep ``rel`` with ``boxes`` given in pixels of an image of ``size`` (as the annotation
        says: which frame they were drawn in is told from it at pack time), or reject it."""
        rows, why = normalized_rows(boxes, size, num_classes)
        frame = getattr(options, "box_frame", "auto")
        self.add(split, rel, BoxTarget(rows, (round(size[0]), round(size[1])), frame, image_id), why)

    def scan(self, classes: list[str], val_source: str) -> Scan:
        return Scan(
            classes,
            self.splits,
            {s: 0 for s in self.splits},
            self.rejects,
            box_target(),
            val_source=val_source,
            notes=self.notes,
            class_ids=self.ids,
        )


def annotations_beside(src: Path, classes: list[str]) -> None:
    """A folder auto-detection would pack as plain classes (``classes``, its folders) but that
    holds an annotation file: a one-line error naming the file and the ``--source`` that reads
    it (a detection dataset packed as one class "images" would lose every box in silence)."""
    if not isinstance(src, Path) or not src.is_dir():
        return
    hint = None
    for name in sorted(os.listdir(src)):
        path, ext = src / name, os.path.splitext(name)[1].lower()
        if ext == ".json" and path.is_file():
            coco = setting("source", "coco")
            hint = (name, f"{coco} (stoker pack {path} OUT {coco}) if it is COCO")
        elif ext in (".yaml", ".yml") and path.is_file():
            hint = (name, f"{setting('source', 'yolo')} if it is a YOLO data.yaml")
        elif name in _ANNOTATION_DIRS and path.is_dir():
            hint = (f"{name}/", setting("source", _ANNOTATION_DIRS[name]))
        if hint:
            break
    if hint:
        listed = ", ".join(f"{c}/" for c in classes[:3]) + (", ..." if len(classes) > 3 else "")
        raise UsageError(
            f"SRC {src} would pack as {len(classes)} image class(es) ({listed}) but holds {hint[0]}: "
            f"for its boxes pack with {hint[1]}; for classes, {setting('source', 'folder')}"
        )


class VocReader(FileReader):
    """Pascal VOC: ``Annotations/*.xml`` + ``JPEGImages/`` (+ ``ImageSets/Main`` lists)."""

    name, priority = "voc", 14
    summary = "Pascal VOC boxes (Annotations/*.xml + JPEGImages/ + ImageSets/Main lists)"
    path_rule = "VOC images are under {base}/JPEGImages"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return isinstance(src, Path) and (src / "Annotations").is_dir() and (src / "JPEGImages").is_dir()

    def scan(self) -> Scan:
        check_box_targets(self.options, "VOC")
        src, found = self.src, Found()
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
                found.add_pixels(split, rel, boxes, size, len(classes), self.options)
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


__all__ = ["BOX_FRAMES", "Found", "VocReader", "annotations_beside", "box_target", "normalized_rows", "split_role"]
