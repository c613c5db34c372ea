"""``stoker train --task detect`` on tiny generated scenes (seconds): the tiny detector trains, the
val figures are COCO mAP and mAP@50, and the Predictor's boxes are in each
original image's pixels."""

import contextlib
import io
import json

import numpy as np
import pytest
import torch

from helpers import run_cli
from stoker.model import Predictor
from stoker.model.train.tasks import Task
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_detection_scenes
from stoker.tools.pack import pack

ARGS = ["--task", "detect", "--batch-size", "4", "--crop", "40", "--device", "cpu", "--threads", "0"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    src = make_detection_scenes(root / "src", n=8, val=4, seed=2, min_side=40, max_side=56, formats=("coco",))
    pack(src["coco"], root / "shards")
    return root / "shards", src["coco"]


@pytest.fixture(scope="module")
def run(shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    rc, stdout, err = run_cli("train", shards[0], *ARGS, "--epochs", "1", "--out", out, "--json")
    assert rc == 0, err
    return out, json.loads(stdout)


def test_detect_trains_and_scores_coco_map(run):
    out, summary = run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["kind"] == "val"]
    assert val and 0.0 <= val[-1]["map"] <= val[-1]["map50"] <= 1.0 and val[-1]["n"] == 4
    assert (out / "last.pt").is_file() and summary["task"] == "detect"


def test_the_val_line_shows_map50_and_no_loss(run):
    out, summary = run
    val = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"val"' in line][-1]
    assert "loss" not in val and summary["val_loss"] is None  # a detector's evaluation computes none
    line = next(line for line in (out / "console.log").read_text().splitlines() if ": val mAP " in line)
    assert f"mAP@50 {100 * val['map50']:.1f}%" in line and "loss" not in line and "nan" not in line, line
    assert line.endswith("(4 samples)")


def test_predictor_boxes_are_in_the_original_pixels(run, shards):
    out, _ = run
    predict = Predictor.from_checkpoint(out / "last.pt")
    images = sorted((shards[1] / "images").glob("*.png"))[:3]
    found = predict(images)
    batch, sizes = predict._preprocess(images)
    with torch.no_grad():
        raw = predict.model(batch)
    for d, r, (w, h) in zip(found, raw, sizes, strict=True):
        scale = max(w, h) / 40  # the letterbox's one factor, back
        np.testing.assert_allclose(d["boxes"].numpy(), r["boxes"].numpy() * scale, rtol=1e-4, atol=1e-3)
        assert set(d) >= {"boxes", "scores", "labels"}


def test_scale_jitter_from_the_command_line_trains(shards, tmp_path):
    out = tmp_path / "jit"
    flags = ["--train-fit", "scale-jitter", "--jitter", "0.5:1.5", "--val-fit", "letterbox", "--max-steps", "1"]
    rc, _, err = run_cli("train", shards[0], *ARGS, "--epochs", "1", "--out", out, *flags)
    assert rc == 0, err
    config = json.loads((out / "config.json").read_text())
    assert (config["train_fit"], config["jitter"], config["val_fit"]) == ("scale-jitter", [0.5, 1.5], "letterbox")
    assert (out / "last.pt").is_file()


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--train-fit", "crop"], "--train-fit"),
        (["--val-fit", "pad"], "--val-fit"),
        (["--jitter", "2,1"], "--jitter"),
        (["--jitter", "x"], "--jitter"),
    ],
)
def test_a_bad_fit_is_one_line(shards, tmp_path, flags, says):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:  # argparse's own refusals exit
            rc = cli(["train", str(shards[0]), *ARGS, "--out", str(tmp_path / "r"), *flags])
        except SystemExit as e:
            rc = e.code
    err = err.getvalue()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and says in err and "Traceback" not in err, err


NETS = """
from torch import nn
from torchvision.models.detection import FCOS
from torchvision.models.detection.anchor_utils import AnchorGenerator

from stoker.model.detection import TinyFPN


def detector(num_classes):
    anchors = AnchorGenerator(sizes=((8,), (16,), (32,)), aspect_ratios=((1.0,),) * 3)
    return FCOS(TinyFPN(), num_classes, anchor_generator=anchors)


def classifier(num_classes):
    return nn.Sequential(nn.Flatten(), nn.LazyLinear(num_classes))
"""


def test_your_own_torchvision_detector_trains_and_predicts(shards, tmp_path):
    (tmp_path / "nets.py").write_text(NETS)
    out = tmp_path / "mine"
    rc, _, err = run_cli(
        "train", shards[0], *ARGS, "--out", out, "--model", f"{tmp_path}/nets.py:detector", "--max-steps", "1"
    )
    assert rc == 0, err
    predict = Predictor.from_checkpoint(out / "last.pt")
    fcos = predict.model[1].detector
    assert fcos.head.classification_head.num_classes == 4  # the split's 3 classes and the background
    assert fcos.transform.min_size == (40,) and fcos.transform.image_std == [1.0] * 3  # the crop, Normalize's
    found = predict(sorted((shards[1] / "images").glob("*.png"))[:2])
    assert len(found) == 2 and all(set(d) >= {"boxes", "scores", "labels"} for d in found)


def test_a_network_that_is_no_detector_is_one_line(shards, tmp_path):
    (tmp_path / "nets.py").write_text(NETS)
    spec = f"{tmp_path}/nets.py:classifier"
    rc, _, err = run_cli("train", shards[0], *ARGS, "--out", tmp_path / "r", "--model", spec)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "torchvision detection model" in err, err


def test_a_step_without_data_has_boxes():
    task = Task("detect", 3, "map")
    boxes = task.synthetic(4, (32, 32), torch.Generator().manual_seed(0))
    assert len(boxes) == 4 and (boxes.counts >= 1).all() and (boxes.labels[boxes.labels >= 0] < 3).all()
