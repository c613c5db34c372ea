"""The COCO JSON reader, in the layouts labelling tools and dataset libraries export.

==============================================  ===============================================
layout                                          the images of a JSON's ``file_name`` are under
==============================================  ===============================================
``annotations/instances_<split>.json`` (COCO)   ``<split>/``, ``images/<split>/``, ``images/``, SRC
``annotations/instances_default.json`` (CVAT)   ``images/default/``, ``images/``
``result.json`` + ``images/`` (Label Studio)    the JSON's folder (``file_name`` is ``images/...``)
``labels.json`` + ``data/`` (FiftyOne)          ``data/``
any one JSON at the root beside ``images/``     the JSON's folder, ``images/``, ``data/``
``<split>/_annotations.coco.json`` (Roboflow)   the split folder itself
a JSON given as SRC (COCO by its keys)          as for the layouts above
==============================================  ===============================================

A split is named by its file (``instances_val2017.json``) or its folder (Roboflow's ``valid/``):
a name holding ``val`` is val, one holding ``test`` is left out with a note (stoker packs train
and val; a test JSON given as SRC packs as train), any other is train.
``bbox`` is ``x y w h`` in the pixels of the image whose ``width`` and ``height`` the JSON gives:
those say which frame the boxes were drawn in (the file's raw pixels or its EXIF-upright ones,
:mod:`.frames`). The category ids and names are kept (``category_ids`` in the manifest's
settings): a detection's label maps back to its COCO id.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from stoker.errors import UsageError

from .base import FileReader, Scan
from .detection import Found, check_box_targets, split_role

#: the names tools give the one COCO JSON of an export (auto-detection looks at any ``*.json`` too)
ROBOFLOW_NAME = "_annotations.coco.json"
_SNIFF_BYTES = 1 << 20
_COCO_KEY = re.compile(rb'"(images|categories)"\s*:\s*\[')


def looks_coco(path: Path) -> bool:
    """True when the JSON file ``path`` holds a COCO ``images`` or ``categories`` list (its first
    MiB read: cheap enough for auto-detection, and a COCO file names one of them early)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError:
        return False
    return bool(_COCO_KEY.search(head))


def coco_files(src: Path) -> list[Path]:
    """The COCO JSONs of ``src`` (a file, or a folder in one of the layouts of this module)."""
    if src.is_file():
        return [src] if src.suffix.lower() == ".json" and looks_coco(src) else []
    if not src.is_dir():
        return []
    found = sorted((src / "annotations").glob("instances_*.json")) or sorted(src.glob("instances_*.json"))
    if found:
        return found
    found = sorted(src.glob(f"*/{ROBOFLOW_NAME}")) or ([src / ROBOFLOW_NAME] if (src / ROBOFLOW_NAME).is_file() else [])
    if found:
        return found
    if (src / "annotations").is_dir():
        found = [p for p in sorted((src / "annotations").glob("*.json")) if looks_coco(p)]
    if not found and any((src / d).is_dir() for d in ("images", "data")):
        found = [p for p in sorted(src.glob("*.json")) if looks_coco(p)]
    return found


def _split_name(path: Path) -> str:
    """What names the split of a COCO JSON: its folder (Roboflow), else its file's stem."""
    if path.name == ROBOFLOW_NAME:
        return path.parent.name
    return path.stem.split("instances_", 1)[-1]


class CocoReader(FileReader):
    """COCO JSON: the layouts of this module's table."""

    name, priority = "coco", 12
    summary = "COCO JSON boxes (annotations/instances_*.json, one JSON beside images/ or data/, Roboflow, CVAT)"
    path_rule = "COCO file_name is relative to the image folder beside its JSON ({base})"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        return bool(isinstance(src, Path) and coco_files(src))

    def scan(self) -> Scan:
        check_box_targets(self.options, "COCO")
        src = self.src
        given = src.is_file()
        files = [src] if given else coco_files(src)  # a file named with --source coco: any .json
        if not files:
            raise UsageError(
                f"SRC {src} holds no COCO file (annotations/instances_*.json, one .json beside images/, "
                f"<split>/{ROBOFLOW_NAME}, or a .json as SRC)"
            )
        root = src.parent if given else src
        self.base = root.parent if root.name == "annotations" else root
        classes: list[str] | None = None
        found = Found()
        for path in files:
            role = split_role(_split_name(path), named=given)
            doc = _load(path)
            cats = sorted(doc["categories"], key=lambda c: c["id"])
            names = [str(c["name"]) for c in cats]
            if role is None:
                found.note(
                    f"left out the test split {path.relative_to(self.base).as_posix()} ({len(doc['images']):,} "
                    f"images): stoker packs train and val; pack it on its own (stoker pack {path} OUT)"
                )
                continue
            if classes is not None and names != classes:
                raise UsageError(f"{path}'s categories differ from {files[0]}'s: one class list per pack")
            classes = names
            found.ids = [c["id"] for c in cats]
            index = {c["id"]: k for k, c in enumerate(cats)}
            folder = self._image_folder(path, doc["images"])
            by_image: dict = {}
            for a in doc["annotations"]:
                by_image.setdefault(a.get("image_id"), []).append(a)
            found.split(role)
            for im in doc["images"]:
                rel = (folder / str(im["file_name"])).relative_to(self.base).as_posix()
                boxes, why = _boxes(by_image.get(im["id"], []), index, len(cats))
                if why:
                    found.add(role, rel, (), why)
                    continue
                size = (float(im.get("width") or 0), float(im.get("height") or 0))
                found.add_pixels(role, rel, boxes, size, len(cats), self.options, image_id=im["id"])
        return found.scan(classes or [], val_source="a val COCO file")

    def _image_folder(self, path: Path, images: list) -> Path:
        """Where the file names of ``path`` are: the first candidate holding its first image."""
        here = path.parent
        if here.name == "annotations":  # COCO, CVAT: the images are beside annotations/
            split, top = _split_name(path), here.parent
            candidates = [top / split, top / "images" / split, top / "images", top]
        else:  # one JSON at the root (Label Studio, FiftyOne), or a Roboflow split folder
            candidates = [here, here / "images", here / "data"]
        first = str(images[0]["file_name"]) if images else ""
        for c in candidates:
            if (c / first).is_file():
                return c
        return next((c for c in candidates if c.is_dir()), here)


def _boxes(anns: list, index: dict, num_classes: int) -> tuple[list, str | None]:
    """An image's annotations as ``(x0, y0, x1, y1, class, crowd)`` pixel rows (an unknown
    category is class ``num_classes``: a reject later), or why they are not boxes."""
    boxes = []
    for a in anns:
        try:
            x, y, bw, bh = (float(v) for v in a["bbox"])
        except (KeyError, TypeError, ValueError):
            return [], f"annotation {a.get('id')} has no bbox [x, y, w, h] (got {a.get('bbox')!r})"
        boxes.append((x, y, x + bw, y + bh, index.get(a.get("category_id"), num_classes), a.get("iscrowd", 0)))
    return boxes, None


def _load(path: Path) -> dict:
    """A COCO JSON's document, checked for the lists a detection pack reads."""
    try:
        doc = json.loads(path.read_text())
        for key in ("images", "categories"):
            if not isinstance(doc.get(key), list):
                raise KeyError(key)
        doc.setdefault("annotations", [])
        for key, items, fields in (
            ("categories", doc["categories"], ("id", "name")),
            ("images", doc["images"], ("id", "file_name")),
        ):
            missing = next((f for it in items for f in fields if f not in it), None)
            if missing is not None:
                raise KeyError(f"one of its {key} has no {missing!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(
            f"{path} is not a COCO instances file (images, annotations, categories): {type(e).__name__} {e}"
        ) from None
    return doc


__all__ = ["ROBOFLOW_NAME", "CocoReader", "coco_files", "looks_coco"]
