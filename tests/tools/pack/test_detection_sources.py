"""The detection pack sources: COCO JSON, YOLO and Pascal VOC of one generated scene pack to the
same boxes; negatives are kept; bad boxes are listed rejects with their reason; pack's resize
scales the boxes; ``--source`` picks a reader SRC's layout does not name."""

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from helpers import run_cli
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import SHAPES, make_detection_scenes
from stoker.tools.pack import Images, pack


def packed_boxes(split: Path) -> dict[str, tuple]:
    """image file stem -> its boxes as ``(x0, y0, x1, y1, class name, crowd)`` rows, read from the tars."""
    classes = Manifest.load(split).classes
    out: dict[str, tuple] = {}
    for shard in sorted(split.glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        for name, raw in members.items():
            if name.endswith(".json"):
                key = name[: -len(".json")]
                rows = np.load(io.BytesIO(members[key + ".boxes.npy"]))
                stem = Path(json.loads(raw)["path"]).stem
                out[stem] = tuple((*np.round(r[:4], 3).tolist(), classes[int(r[4])], r[5]) for r in rows)
    return out


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict[str, Path]:
    return make_detection_scenes(tmp_path_factory.mktemp("scenes"), n=10, val=3, seed=4)


@pytest.fixture(scope="module")
def packs(scenes, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packs")
    return {fmt: (pack(src, root / fmt), root / fmt)[1] for fmt, src in scenes.items()}


def test_coco_yolo_and_voc_of_one_scene_pack_to_the_same_boxes(packs):
    for split in ("train", "val"):
        coco, yolo, voc = (packed_boxes(packs[f] / split) for f in ("coco", "yolo", "voc"))
        assert coco == yolo == voc
        assert sum(len(v) for v in coco.values()) > (5 if split == "train" else 0)
    assert sorted(Manifest.load(packs["coco"] / "train").classes) == sorted(SHAPES)
    assert Manifest.load(packs["yolo"] / "train").target.kind == "boxes"


def test_negatives_are_kept_and_counted(packs, scenes):
    boxes = packed_boxes(packs["coco"] / "train")
    negatives = [k for k, v in boxes.items() if not v]
    doc = json.loads((scenes["coco"] / "annotations" / "instances_train.json").read_text())
    annotated = {a["image_id"] for a in doc["annotations"]}
    assert len(negatives) == len(doc["images"]) - len(annotated) > 0
    stats = Manifest.load(packs["coco"] / "train").target.stats.detail
    assert stats["negatives"] == len(negatives) and stats["boxes"] == len(doc["annotations"])
    assert sum(stats["per_image"]["histogram"]) == len(boxes) == stats["images"]
    assert sum(stats["sizes"]) == sum(stats["coco_small_medium_large"]) == stats["boxes"]


def test_pack_resize_scales_the_boxes(scenes, packs, tmp_path):
    small = pack(scenes["coco"], tmp_path / "small", images=Images(max_side=40))
    assert small.splits["train"]["samples"] == 10
    full, half = packed_boxes(packs["coco"] / "train"), packed_boxes(tmp_path / "small" / "train")
    for stem, rows in full.items():
        for a, b in zip(rows, half[stem], strict=True):
            assert a[4] == b[4] and max(b[:4]) <= 40.001
            assert b[2] - b[0] < a[2] - a[0]  # smaller with the image


def test_bad_boxes_are_listed_rejects(tmp_path):
    src = make_detection_scenes(tmp_path / "s", n=6, seed=1, formats=("coco", "yolo"))
    ann = src["coco"] / "annotations" / "instances_train.json"
    doc = json.loads(ann.read_text())
    w = doc["images"][0]["width"]
    bad = [
        (0, [w - 2, 1, 10, 5], 1, "is outside its"),
        (1, [3, 3, 0, 4], 1, "has no positive size"),
        (2, [1, 1, 4, 4], 99, "names class"),
    ]
    for image, bbox, cat, _ in bad:
        doc["annotations"].append({"id": 900 + image, "image_id": doc["images"][image]["id"], "bbox": bbox,
                                   "category_id": cat, "iscrowd": 0})  # fmt: skip
    ann.write_text(json.dumps(doc))
    result = pack(src["coco"], tmp_path / "out")
    rejects = {
        json.loads(line)["path"]: json.loads(line)["reason"] for line in (tmp_path / "out" / "rejects.jsonl").open()
    }
    for image, _, _, why in bad:
        assert why in rejects[f"images/{doc['images'][image]['file_name']}"]
    assert result.splits["train"]["samples"] == 3 and result.splits["train"]["rejected"] == 3
    label = next(iter(sorted((src["yolo"] / "labels" / "train").glob("*.txt"))))
    label.write_text("7 0.5 0.5 0.2 0.2\n")
    rc, out, err = run_cli("pack", src["yolo"], tmp_path / "y", "--source", "yolo")
    assert rc == 0, err
    line = (tmp_path / "y" / "rejects.jsonl").read_text()
    assert "names class 7, not one of the 3 declared" in line and label.stem in line


def test_source_is_chosen_by_name_when_not_recognized(scenes, packs, tmp_path):
    """A COCO JSON of any name given as SRC is recognized by its keys (or named with ``--source
    coco``); a JSON that is not COCO is one line naming the readers; a tree of another layout
    named as VOC is one line, exit 2."""
    src = tmp_path / "coco"
    (src / "images").mkdir(parents=True)
    for png in (scenes["coco"] / "images").glob("*.png"):
        (src / "images" / png.name).write_bytes(png.read_bytes())
    doc = (scenes["coco"] / "annotations" / "instances_train.json").read_text()
    (src / "boxes.json").write_text(doc)
    for name, flags in (("auto", ()), ("named", ("--source", "coco"))):
        rc, out, err = run_cli("pack", src / "boxes.json", tmp_path / name, *flags)
        assert rc == 0, err
        assert packed_boxes(tmp_path / name / "train") == packed_boxes(packs["coco"] / "train")
    (tmp_path / "other.json").write_text(json.dumps({"tasks": [1, 2]}))
    rc, _, err = run_cli("pack", tmp_path / "other.json", tmp_path / "o1")
    assert rc == 2 and "COCO JSON" in err and "--source" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli("pack", scenes["yolo"], tmp_path / "o", "--source", "voc")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_statistics_are_right_at_300_boxes_an_image(tmp_path):
    """An image of 300 boxes: the manifest's max and mean and the summary count all 300 (the
    per-image histogram's last bin holds 64 or more), and the Loader hands out all 300."""
    from stoker.pipeline import Loader

    src = make_detection_scenes(tmp_path / "s", n=5, seed=3, formats=("coco",))["coco"]
    ann = src / "annotations" / "instances_train.json"
    doc = json.loads(ann.read_text())
    crowded = doc["images"][0]
    before = sum(a["image_id"] == crowded["id"] for a in doc["annotations"])
    for k in range(300 - before):
        x, y = k % 20 * 2, k // 20 * 2
        doc["annotations"].append({"id": 1000 + k, "image_id": crowded["id"], "bbox": [x, y, 2, 2], "category_id": 1})
    ann.write_text(json.dumps(doc))
    result = pack(src, tmp_path / "out")
    detail = Manifest.load(tmp_path / "out" / "train").target.stats.detail
    assert detail["per_image"]["max"] == 300 and detail["boxes"] == len(doc["annotations"])
    assert detail["per_image"]["histogram"][64] == 1 and sum(detail["per_image"]["histogram"]) == 5
    assert detail["per_image"]["mean"] == pytest.approx(len(doc["annotations"]) / 5)
    assert "(max 300)" in result.summary() and "max 64" not in result.summary()
    loader = Loader(tmp_path / "out" / "train", batch_size=5, crop=96, train=False, device="cpu", threads=0)
    _, targets = next(iter(loader))
    assert int(targets.counts.max()) == 300


def test_a_coco_file_missing_what_a_box_needs_is_one_line_or_a_reject(tmp_path):
    """An annotation without a bbox makes its image a listed reject; a category without a name
    is one line naming the file (exit 2), never a traceback."""
    src = make_detection_scenes(tmp_path / "s", n=5, seed=2, formats=("coco",))["coco"]
    ann = src / "annotations" / "instances_train.json"
    doc = json.loads(ann.read_text())
    doc["annotations"].append({"id": 77, "image_id": doc["images"][1]["id"], "category_id": 1, "segmentation": []})
    ann.write_text(json.dumps(doc))
    rc, out, err = run_cli("pack", src, tmp_path / "out")
    assert rc == 0, err
    reasons = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").open()]
    assert [r["path"] for r in reasons] == [f"images/{doc['images'][1]['file_name']}"]
    assert reasons[0]["reason"] == "annotation 77 has no bbox [x, y, w, h] (got None)"
    del doc["categories"][0]["name"]
    ann.write_text(json.dumps(doc))
    rc, _, err = run_cli("pack", src, tmp_path / "out2")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "instances_train.json" in err and "'name'" in err, err
