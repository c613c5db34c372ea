"""Generated detection data in the exact folder shapes labelling tools and dataset libraries
export: the scenes of :func:`~stoker.tools.common.synth.make_detection_scenes` (its ``coco`` and
``yolo`` folders) rearranged as each tool writes them. What the tests of the detection readers and
the Detection page pack; every layout holds the same images and boxes as the canonical COCO one.

=========================  ==========================================================================
``label-studio``           ``result.json`` beside ``images/`` (file names ``images/...``, ids from 0)
``fiftyone``               ``labels.json`` beside ``data/``
``annotations-json``       one ``annotations.json`` beside ``images/``
``roboflow-coco``          ``train/``, ``valid/``, ``test/``: images + ``_annotations.coco.json``
``cvat``                   ``annotations/instances_default.json`` + ``images/``
``cvat-default``           ``annotations/instances_default.json`` + ``images/default/``
``ultralytics``            ``data.yaml`` beside the dataset folder: ``path`` relative, names a list
``ultralytics-lists``      ``data.yaml`` beside ``dataset/``: absolute ``path``, a train list file
``yolo-flat``              ``images/{train,val}/`` with every label file flat in ``labels/``
``roboflow-yolo``          ``train/images``, ``train/labels``, ``valid/...``; ``../train/images``
=========================  ==========================================================================
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .synth import SHAPES


def coco_doc(scenes: dict[str, Path], split: str | None = None, *, prefix: str = "", first_id: int = 1) -> dict:
    """The canonical COCO of ``split`` (None: both in one), file names under ``prefix``, category
    ids from ``first_id`` (Label Studio counts from 0)."""
    docs = [
        json.loads((scenes["coco"] / "annotations" / f"instances_{s}.json").read_text())
        for s in (("train", "val") if split is None else (split,))
    ]
    shift = first_id - 1
    images = [{**im, "file_name": prefix + im["file_name"]} for d in docs for im in d["images"]]
    anns = [{**a, "category_id": a["category_id"] + shift} for d in docs for a in d["annotations"]]
    cats = [{**c, "id": c["id"] + shift} for c in docs[0]["categories"]]
    return {"images": images, "categories": cats, "annotations": anns}


def copy_images(scenes: dict[str, Path], to: Path, split: str | None = None) -> None:
    """The canonical images (of ``split``'s COCO file, or all) copied into ``to``."""
    to.mkdir(parents=True, exist_ok=True)
    names = [im["file_name"] for im in coco_doc(scenes, split)["images"]]
    for name in names:
        shutil.copy(scenes["coco"] / "images" / name, to / name)


def label_studio(scenes, root: Path) -> Path:
    """Label Studio's COCO export: ``result.json`` beside ``images/``, file names ``images/...``."""
    copy_images(scenes, root / "images")
    (root / "result.json").write_text(json.dumps(coco_doc(scenes, prefix="images/", first_id=0)))
    return root


def fiftyone(scenes, root: Path) -> Path:
    """FiftyOne's COCODetectionDataset: ``labels.json`` beside ``data/``."""
    copy_images(scenes, root / "data")
    doc = {"info": {"version": "1.0"}, "licenses": [], **coco_doc(scenes)}
    (root / "labels.json").write_text(json.dumps(doc))
    return root


def annotations_json(scenes, root: Path) -> Path:
    """Any one JSON at the root beside ``images/``."""
    copy_images(scenes, root / "images")
    (root / "annotations.json").write_text(json.dumps(coco_doc(scenes)))
    return root


def roboflow(scenes, root: Path) -> Path:
    """Roboflow's COCO export: ``train/``, ``valid/`` (and ``test/``), each its images and
    ``_annotations.coco.json``; category 0 is the dataset's supercategory, never used."""
    for split, folder in (("train", "train"), ("val", "valid")):
        copy_images(scenes, root / folder, split)
        doc = coco_doc(scenes, split)
        doc["categories"] = [{"id": 0, "name": "shapes", "supercategory": "none"}] + [
            {**c, "supercategory": "shapes"} for c in doc["categories"]
        ]
        (root / folder / "_annotations.coco.json").write_text(json.dumps(doc))
    copy_images(scenes, root / "test", "val")  # a test split: left out with a note
    (root / "test" / "_annotations.coco.json").write_text(json.dumps(coco_doc(scenes, "val")))
    return root


def cvat(scenes, root: Path, *, nested: bool) -> Path:
    """CVAT's "COCO 1.0" export: ``annotations/instances_default.json`` + ``images/`` (or
    ``images/default/`` when the task's images were in a subset)."""
    copy_images(scenes, root / "images" / "default" if nested else root / "images")
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "instances_default.json").write_text(json.dumps(coco_doc(scenes)))
    return root


def yolo_tree(scenes, root: Path) -> Path:
    """The canonical YOLO scene (``images/{train,val}``, ``labels/{train,val}``) copied to ``root``."""
    shutil.copytree(scenes["yolo"], root)
    (root / "data.yaml").unlink()
    return root


def yolo_relative_path(scenes, root: Path) -> Path:
    """Ultralytics' data.yaml beside the dataset folder: ``path`` relative, names a list."""
    yolo_tree(scenes, root / "shapes")
    names = ", ".join(SHAPES)
    (root / "data.yaml").write_text(f"path: shapes\ntrain: images/train\nval: images/val\nnames: [{names}]\n")
    return root


def yolo_absolute_lists(scenes, root: Path) -> Path:
    """``data.yaml`` beside ``dataset/``: an absolute ``path``, train a list file of ``./`` paths
    (relative to the list), val a list holding a folder; names a dict."""
    data = yolo_tree(scenes, root / "dataset")
    listed = sorted((data / "images" / "train").glob("*.png"))
    (data / "train.txt").write_text("".join(f"./images/train/{p.name}\n" for p in listed))
    names = "".join(f"  {k}: {s}\n" for k, s in enumerate(SHAPES))
    (root / "data.yaml").write_text(f"path: {data.resolve()}\ntrain: train.txt\nval: [images/val]\nnames:\n{names}")
    return root


def yolo_flat_labels(scenes, root: Path) -> Path:
    """``images/{train,val}/`` with the label files left flat in ``labels/``."""
    data = yolo_tree(scenes, root)
    for txt in list((data / "labels").rglob("*.txt")):
        txt.rename(data / "labels" / txt.name)
    for d in ("train", "val"):
        (data / "labels" / d).rmdir()
    (data / "classes.txt").write_text("".join(f"{s}\n" for s in SHAPES))
    return data


def roboflow_yolo(scenes, root: Path) -> Path:
    """Roboflow's YOLO export: ``train/images``, ``train/labels``, ``valid/...``, and a data.yaml
    whose ``../train/images`` does not exist from its folder (Ultralytics drops the ``../``)."""
    for split, folder in (("train", "train"), ("val", "valid")):
        for kind in ("images", "labels"):
            shutil.copytree(scenes["yolo"] / kind / split, root / folder / kind)
    (root / "data.yaml").write_text(f"train: ../train/images\nval: ../valid/images\nnc: 3\nnames: {list(SHAPES)}\n")
    return root


EXPORTS = {
    "label-studio": label_studio,
    "fiftyone": fiftyone,
    "annotations-json": annotations_json,
    "roboflow-coco": roboflow,
    "cvat": lambda s, r: cvat(s, r, nested=False),
    "cvat-default": lambda s, r: cvat(s, r, nested=True),
    "ultralytics": yolo_relative_path,
    "ultralytics-lists": yolo_absolute_lists,
    "yolo-flat": yolo_flat_labels,
    "roboflow-yolo": roboflow_yolo,
}


def make_detection_export(scenes: dict[str, Path], layout: str, root: str | Path) -> Path:
    """The scenes of :func:`~.synth.make_detection_scenes` (its ``coco`` and ``yolo`` folders)
    written under ``root`` as ``layout`` exports them (the module's table); returns what
    ``stoker pack`` takes as SRC (the folder, or the ``data.yaml`` of ``ultralytics``)."""
    return EXPORTS[layout](scenes, Path(root))


__all__ = ["EXPORTS", "coco_doc", "copy_images", "make_detection_export", "yolo_tree"]
