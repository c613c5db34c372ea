"""A detection evaluation in the dataset's own terms: ``stoker eval --coco-results`` writes the
COCO JSON's image and category ids and boxes in the original pixels, and pycocotools' ``COCOeval``
of that file gives the mAP stoker prints; ``stoker eval`` has a per-class AP row (text and
``--json``); the category id map is in the manifest and in the checkpoint."""

import contextlib
import importlib.util
import io
import json
import random

import numpy as np
import pytest
import torch

from helpers import run_cli
from stoker.pipeline import Loader
from stoker.pipeline.augment import letterbox_places
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import make_detection_scenes
from stoker.tools.pack import pack

# found, not imported: torchmetrics alone takes 3.4 s to import, in every test process that collects
pytestmark = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("pycocotools", "torchmetrics")),
    reason="needs stoker[detect] (pycocotools, torchmetrics)",
)

CROP = 48
ARGS = ["--task", "detect", "--batch-size", "4", "--crop", str(CROP), "--device", "cpu", "--threads", "0"]


def coco_map(gt_file, results: list) -> float:
    """pycocotools' mAP over IoU .5:.95 of ``results`` against the COCO JSON ``gt_file``."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints as it goes
        gt = COCO(str(gt_file))
        ev = COCOeval(gt, gt.loadRes(results), "bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return float(ev.stats[0])


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    src = make_detection_scenes(root / "src", n=8, val=8, seed=5, min_side=40, max_side=64, formats=("coco",))
    coco = src["coco"]
    ids = {1: 11, 2: 27, 3: 90}  # the dataset's own category ids: not 1..3
    for split in ("train", "val"):
        path = coco / "annotations" / f"instances_{split}.json"
        doc = json.loads(path.read_text())
        new_id = {im["id"]: 4000 + 3 * im["id"] for im in doc["images"]}
        for im in doc["images"]:
            im["id"] = new_id[im["id"]]
        for a in doc["annotations"]:
            a["image_id"], a["category_id"] = new_id[a["image_id"]], ids[a["category_id"]]
        for c in doc["categories"]:
            c["id"] = ids[c["id"]]
        path.write_text(json.dumps(doc))
    pack(coco, root / "shards")
    return root / "shards", coco


@pytest.fixture(scope="module")
def run(shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    args = ["--epochs", "2", "--optimizer", "adamw", "--lr", "3e-3", "--out", out]
    rc, stdout, err = run_cli("train", shards[0], *ARGS, *args)
    assert rc == 0, err
    (out / "said.txt").write_text(stdout + err)
    return out


def test_the_category_id_map_is_in_the_manifest_and_the_checkpoint(shards, run):
    manifest = Manifest.load(shards[0] / "train")
    assert dict(zip(manifest.classes, manifest.pack["category_ids"], strict=True)) == {"box": 11, "disc": 27, "bar": 90}
    state = torch.load(run / "last.pt", map_location="cpu", weights_only=False)
    assert state["config"]["category_ids"] == [11, 27, 90]
    assert json.loads((run / "config.json").read_text())["category_ids"] == [11, 27, 90]


def test_the_small_val_warning_names_the_tasks_own_metric(run):
    said = (run / "said.txt").read_text()
    assert "val figures rest on 8 samples: a few samples swing them (mAP)" in said, said
    assert "R²" not in said and "top-1" not in said


def test_pycocotools_scores_the_results_file_as_stoker_eval_prints(shards, run, tmp_path):
    results = tmp_path / "detections.json"
    rc, out, err = run_cli("eval", run / "last.pt", shards[0] / "val", "--json", "--coco-results", results)
    assert rc == 0, err
    r = json.loads(out)
    found = json.loads(results.read_text())
    assert r["detections"] == len(found) > 0
    gt = json.loads((shards[1] / "annotations" / "instances_val.json").read_text())
    assert {d["image_id"] for d in found} <= {im["id"] for im in gt["images"]}
    assert {d["category_id"] for d in found} <= {11, 27, 90}
    assert coco_map(shards[1] / "annotations" / "instances_val.json", found) == pytest.approx(r["map"], abs=2e-3)
    rows = {row["class"]: row for row in r["per_class"]}
    assert set(rows) == {"box", "disc", "bar"}
    boxes = {c["id"]: 0 for c in gt["categories"]}
    for a in gt["annotations"]:
        boxes[a["category_id"]] += 1
    assert [rows[n]["positives"] for n in ("box", "disc", "bar")] == [boxes[11], boxes[27], boxes[90]]
    assert all(row["ap"] is None or 0.0 <= row["ap"] <= 1.0 for row in rows.values())
    rc, text, err = run_cli("eval", run / "last.pt", shards[0] / "val")
    assert rc == 0 and "AP" in text and "positives" in text and all(f"  {n} " in text for n in rows), text


def test_noisy_detections_score_the_same_in_stoker_and_pycocotools(shards):
    """Detections of real quality (the true boxes jittered, a few false ones, random scores) of a
    letterboxed val split, scored by stoker's metric in the batch's pixels and by pycocotools on
    the results file in the original pixels: one mAP."""
    from stoker.model.train.coco_results import coco_results, sample_records
    from stoker.model.train.runtime import Dist
    from stoker.model.train.tasks import DetectMetrics, Task

    split = shards[0] / "val"
    metrics = DetectMetrics(Task("detect", 3, "map"), torch.device("cpu"))
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    for _, targets in Loader(split, batch_size=4, crop=CROP, train=False, device="cpu", backend="pil", threads=0):
        preds = []
        for t in targets.to_list():
            boxes = t["boxes"] + (torch.rand(t["boxes"].shape, generator=gen) * 4 - 2)
            labels = t["labels"].clone()
            if len(boxes):  # a false detection too
                boxes = torch.cat([boxes, torch.tensor([[1.0, 1.0, 9.0, 9.0]])])
                labels = torch.cat([labels, torch.tensor([rng.randrange(3)])])
            preds.append({"boxes": boxes, "scores": torch.rand(len(boxes), generator=gen), "labels": labels})
        metrics.update(preds, targets)
    figures = metrics.compute(Dist())
    assert 0.2 < figures["map"] < 0.95  # 0.33: far from 0 and 1, where two scorers would agree anyway
    metas, sizes, category_ids = sample_records(split)
    found = coco_results(metrics.preds, metas, letterbox_places(sizes, CROP), category_ids)
    assert coco_map(shards[1] / "annotations" / "instances_val.json", found) == pytest.approx(figures["map"], abs=2e-3)
    assert np.isclose(len(found), sum(len(p["boxes"]) for p in metrics.preds))
