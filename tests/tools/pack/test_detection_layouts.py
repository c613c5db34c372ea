"""Detection data as people hold it: each layout a labelling tool or dataset library exports,
built in its exact folder shape from one generated scene, packs the same boxes as the canonical
COCO layout (``annotations/instances_*.json``); a folder that would pack as plain classes beside
an annotation file is refused in one line; images without a label file are counted and, when most
of a split, named with where pack looked."""

import json
from pathlib import Path

import pytest
from test_detection_sources import packed_boxes

from helpers import run_cli
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.detection_exports import copy_images, make_detection_export, yolo_tree
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


LAYOUTS = {
    "label-studio result.json": "label-studio",
    "fiftyone labels.json": "fiftyone",
    "annotations.json beside images/": "annotations-json",
    "roboflow coco": "roboflow-coco",
    "cvat images/": "cvat",
    "cvat images/default/": "cvat-default",
    "label-studio result.json as SRC": "label-studio",
    "yolo data.yaml relative path": "ultralytics",
    "yolo data.yaml as SRC": "ultralytics",
    "yolo data.yaml absolute path, list files": "ultralytics-lists",
    "yolo flat labels/": "yolo-flat",
    "roboflow yolo": "roboflow-yolo",
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_exported_layout_packs_the_canonical_boxes(layout, scenes, canonical, tmp_path):
    src = make_detection_export(scenes, LAYOUTS[layout], tmp_path / "src")
    if layout.endswith("as SRC"):
        src = src / ("data.yaml" if "yaml" in layout else "result.json")
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
