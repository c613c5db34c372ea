"""Detection data as people hold it: each layout a labelling tool or dataset library exports,
built in its exact folder shape from one generated scene, packs the same boxes as the canonical
COCO layout (``annotations/instances_*.json``); a folder that would pack as plain classes beside
an annotation file is refused in one line; images without a label file are counted and, when most
of a split, named with where pack looked."""

import json
import shutil
from pathlib import Path

import pytest
from test_detection_sources import packed_boxes

from helpers import run_cli
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import SHAPES, make_detection_scenes
from stoker.tools.pack import pack


def all_boxes(out: Path) -> dict[str, tuple]:
    """Image stem -> boxes, over every split packed into ``out``."""
    found: dict[str, tuple] = {}
    for split in ("train", "val"):
        if (out / split).is_dir():
            found.update(packed_boxes(out / split))
    return found


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict[str, Path]:
    return make_detection_scenes(tmp_path_factory.mktemp("scenes"), n=8, val=2, seed=7, formats=("coco", "yolo"))


@pytest.fixture(scope="module")
def canonical(scenes, tmp_path_factory) -> dict[str, tuple]:
    out = tmp_path_factory.mktemp("canonical") / "out"
    pack(scenes["coco"], out)
    boxes = all_boxes(out)
    assert sum(len(v) for v in boxes.values()) > 5 and len(boxes) == 10
    return boxes


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
    return root / "data.yaml"


def yolo_absolute_lists(scenes, root: Path) -> Path:
    """An absolute ``path``; train as a list file of ``./`` paths, val as a list of a folder;
    names a dict."""
    data = yolo_tree(scenes, root / "data")
    listed = sorted((data / "images" / "train").glob("*.png"))
    (data / "train.txt").write_text("".join(f"./images/train/{p.name}\n" for p in listed))
    names = "".join(f"  {k}: {s}\n" for k, s in enumerate(SHAPES))
    (data / "data.yaml").write_text(f"path: {data.resolve()}\ntrain: train.txt\nval: [images/val]\nnames:\n{names}")
    return data


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


LAYOUTS = {
    "label-studio result.json": label_studio,
    "fiftyone labels.json": fiftyone,
    "annotations.json beside images/": annotations_json,
    "roboflow coco": roboflow,
    "cvat images/": lambda s, r: cvat(s, r, nested=False),
    "cvat images/default/": lambda s, r: cvat(s, r, nested=True),
    "label-studio result.json as SRC": lambda s, r: label_studio(s, r) / "result.json",
    "yolo data.yaml relative path": yolo_relative_path,
    "yolo data.yaml absolute path, list files": yolo_absolute_lists,
    "yolo flat labels/": yolo_flat_labels,
    "roboflow yolo": roboflow_yolo,
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_exported_layout_packs_the_canonical_boxes(layout, scenes, canonical, tmp_path):
    src = LAYOUTS[layout](scenes, tmp_path / "src")
    result = pack(src, tmp_path / "out")
    assert all_boxes(tmp_path / "out") == canonical
    assert sorted(Manifest.load(tmp_path / "out" / "train").classes) == sorted(
        SHAPES + (("shapes",) if layout == "roboflow coco" else ())
    )
    assert result.found_label == "boxes" and "boxes:" in result.summary() and "masks:" not in result.summary()
    if layout.startswith("roboflow coco"):
        assert any("left out the test split test/_annotations.coco.json" in n for n in result.notes())
    if "yolo" not in layout:  # COCO: its category ids, in class order
        ids = Manifest.load(tmp_path / "out" / "train").pack["category_ids"]
        assert len(ids) == len(Manifest.load(tmp_path / "out" / "train").classes)


def test_a_folder_of_classes_beside_an_annotation_file_is_refused_in_one_line(scenes, tmp_path):
    """images/ + a JSON that is not COCO (Label Studio's JSON-min) would pack as one class called
    "images": one line naming the file and the ``--source`` to use; ``--source folder`` packs classes."""
    src = tmp_path / "src"
    copy_images(scenes, src / "images")
    (src / "export.json").write_text(json.dumps([{"image": "images/00000.png", "label": []}]))
    rc, out, err = run_cli("pack", src, tmp_path / "out")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "export.json" in err and "--source coco" in err and "--source folder" in err
    rc, _, err = run_cli("pack", src, tmp_path / "classes", "--source", "folder")
    assert rc == 0, err
    assert Manifest.load(tmp_path / "classes" / "train").classes == ["images"]
    (src / "export.json").unlink()
    (src / "data.yaml").write_text("names: [a, b]\n")
    rc, _, err = run_cli("pack", src, tmp_path / "out2")
    assert rc == 2 and "data.yaml" in err and "--source yolo" in err


def test_images_without_a_label_file_are_negatives_named_when_most(scenes, tmp_path):
    data = yolo_tree(scenes, tmp_path / "src")
    (data / "labels" / "train").rename(data / "labels" / "train2")  # the labels elsewhere: not found
    result = pack(data, tmp_path / "out")
    detail = Manifest.load(tmp_path / "out" / "train").target.stats.detail
    assert detail["boxes"] == 0 and detail["negatives"] == result.splits["train"]["samples"] == 8
    notes = [n for n in result.notes() if "label file" in n]
    assert notes == ["note: 8 of 8 train images have no label file: looked in labels/train/"]
    rc, out, err = run_cli("pack", data, tmp_path / "cli")
    assert rc == 0 and "8 of 8 train images have no label file: looked in labels/train/" in err
