"""The YOLO reader: ``class cx cy w h`` rows in shares of the image, one label file an image.

Layouts:

- ``images/[<split>/]`` + ``labels/[<split>/]`` (no YAML): a subfolder of ``images/`` is a split.
- Ultralytics' ``data.yaml`` (or ``dataset.yaml``, or the YAML given as SRC): ``path`` the root
  (relative to the YAML's folder, or absolute; absent: the YAML's folder); ``train``, ``val``
  (and ``test``, left out with a note) each a folder of images, a list file of image paths, or a
  list of those; ``names`` a list or an ``{index: name}`` dict. A path starting ``../`` that does
  not exist is tried without it (Roboflow's exports; Ultralytics does the same).

An image's label file is where Ultralytics looks (the last ``/images/`` of its path made
``/labels/``, the suffix ``.txt``) or, when that is missing, flat in ``labels/``. An image without
one is a negative, counted; when they are most of a split, pack says so and where it looked
(a wrong layout would otherwise pack a split of negatives). YOLO's shares are of the upright
image: Ultralytics reads images and labels in the EXIF-oriented frame.
"""

from __future__ import annotations

import os
from pathlib import Path

from stoker.errors import UsageError

from ..sanitize import IMAGE_EXTS
from .base import FileReader, Scan
from .detection import Found, check_box_targets, normalized_rows, split_role

YAML_NAMES = ("data.yaml", "dataset.yaml", "data.yml", "dataset.yml")


def yaml_of(src: Path) -> Path | None:
    """The Ultralytics YAML of ``src`` (the file itself, or one of :data:`YAML_NAMES` in it)."""
    if src.is_file():
        return src if src.suffix.lower() in (".yaml", ".yml") else None
    return next((src / n for n in YAML_NAMES if (src / n).is_file()), None)


class YoloReader(FileReader):
    """YOLO: ``images/`` + ``labels/*.txt``, or Ultralytics' ``data.yaml``."""

    name, priority = "yolo", 13
    summary = "YOLO boxes (images/ + labels/*.txt, or Ultralytics' data.yaml)"
    path_rule = "YOLO image paths are relative to the dataset root {base}"

    @classmethod
    def recognizes(cls, src, options) -> bool:
        if not isinstance(src, Path):
            return False
        if src.is_dir() and (src / "images").is_dir() and (src / "labels").is_dir():
            return True
        found = yaml_of(src)
        return found is not None and "train" in _load_yaml(found)

    def scan(self) -> Scan:
        check_box_targets(self.options, "YOLO")
        found = Found()
        yaml_path = yaml_of(self.src)
        doc = _load_yaml(yaml_path) if yaml_path is not None else {}
        if doc.get("train"):
            self.base = _root(yaml_path, doc)
            layout = [(k, doc[k]) for k in ("train", "val", "test") if doc.get(k)]
        else:
            root = self.src if self.src.is_dir() else self.src.parent
            self.base = root
            subs = (
                sorted(p.name for p in (root / "images").iterdir() if p.is_dir()) if (root / "images").is_dir() else []
            )
            layout = [(s, f"images/{s}") for s in subs] or [("train", "images")]
        names = _names(doc, yaml_path, self.base)
        for key, entries in layout:
            role = split_role(key)
            images = _images(self.base, entries, yaml_path)
            if role is None:
                found.note(f"left out the {key} split ({len(images):,} images): stoker packs train and val")
                continue
            found.split(role)
            missing, looked = 0, set()
            for path in images:
                label, tried = _label_path(path, self.base)
                if label is None:
                    missing += 1
                    looked.add(tried)
                rows, why = _yolo_rows(label, len(names) if names else None)
                found.add(role, _rel(path, self.base), rows, why)
            if missing and missing * 2 > len(images):
                where = ", ".join(sorted(looked)[:2]) + (", ..." if len(looked) > 2 else "")
                found.note(f"{missing:,} of {len(images):,} {key} images have no label file: looked in {where}")
        if not names:  # no names given: classes are the indices found
            top = max((int(r[4]) for its in found.splits.values() for it in its for r in it.target), default=-1)
            names = [str(c) for c in range(top + 1)]
        return found.scan(names, val_source="a val split")


def _load_yaml(path: Path) -> dict:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is unreadable: {e}") from None
    except yaml.YAMLError as e:
        raise UsageError(f"{path} does not parse: {str(e).splitlines()[0]}") from None
    return doc if isinstance(doc, dict) else {}


def _root(yaml_path: Path, doc: dict) -> Path:
    """The dataset root of a data.yaml: its ``path`` (relative to the YAML's folder), else the folder."""
    here = yaml_path.parent
    given = doc.get("path")
    if not given:
        return here
    root = Path(os.path.expanduser(str(given)))
    root = root if root.is_absolute() else here / root
    if not root.is_dir():
        raise UsageError(f"{yaml_path}: path {given} is not a folder (looked at {root})")
    return root


def _resolve(root: Path, entry: str, yaml_path: Path | None) -> Path:
    """A train/val entry of a data.yaml as a path (``../x`` missing: ``x``, as Ultralytics)."""
    p = Path(os.path.expanduser(entry))
    p = p if p.is_absolute() else root / p
    if not p.exists() and entry.startswith("../") and (root / entry[3:]).exists():
        p = root / entry[3:]
    if not p.exists():
        raise UsageError(f"{yaml_path or root}: {entry} does not exist (looked at {p})")
    return p


def _images(root: Path, entries, yaml_path: Path | None) -> list[Path]:
    """The images of a split: each entry a folder (walked), or a list file of image paths (``./x``
    relative to the list's folder, others to the root)."""
    out: list[Path] = []
    for entry in entries if isinstance(entries, list) else [entries]:
        p = _resolve(root, str(entry), yaml_path)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_EXTS and f.is_file())
            continue
        for line in p.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("./"):
                out.append(p.parent / line[2:])
            else:
                q = Path(line)
                out.append(q if q.is_absolute() else root / q)
    return out


def _label_path(image: Path, root: Path) -> tuple[Path | None, str]:
    """``(label file or None, where it was looked for)``: Ultralytics' rule (the last ``/images/``
    of the path made ``/labels/``), then ``labels/<stem>.txt`` flat."""
    parts = image.parts
    k = max((i for i, p in enumerate(parts[:-1]) if p == "images"), default=None)
    folder = Path(*parts[:k], "labels", *parts[k + 1 : -1]) if k is not None else image.parent
    mirrored = folder / f"{image.stem}.txt"
    if mirrored.is_file():
        return mirrored, ""
    flat = root / "labels" / f"{image.stem}.txt"
    if flat.is_file():
        return flat, ""
    return None, _rel(folder, root) + "/"


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:  # a list file naming an image outside the root: its own path
        return path.as_posix()


def _names(doc: dict, yaml_path: Path | None, root: Path) -> list[str]:
    names = doc.get("names")
    if isinstance(names, dict):
        index = {int(k): str(v) for k, v in names.items()}
        return [index.get(i, str(i)) for i in range(max(index, default=-1) + 1)]
    if isinstance(names, list):
        return [str(n) for n in names]
    for folder in {yaml_path.parent if yaml_path else root, root}:
        for txt in (folder / "classes.txt", folder / "obj.names"):
            if txt.is_file():
                return [line.strip() for line in txt.read_text().splitlines() if line.strip()]
    return []


def _yolo_rows(path: Path | None, num_classes: int | None) -> tuple[tuple, str | None]:
    """A label file's rows as shares of the image (no file: a negative), or why it is a reject."""
    if path is None:
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


__all__ = ["YAML_NAMES", "YoloReader", "yaml_of"]
