"""`stoker eval CKPT SPLIT`: a checkpoint's figures on any split, per class, text and JSON; wrong paths exit 2."""

import json

import pytest
import torch

from helpers import CLASSES, run_cli, write_split

ARGS = ["--batch-size", "8", "--crop", "32", "--threads", "1", "--epochs", "1", "--no-progress"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    write_split(root / "data" / "train", num_samples=48, samples_per_shard=16)
    write_split(root / "data" / "val", num_samples=21, samples_per_shard=16, seed=1)
    rc, _, err = run_cli("train", root / "data", "--out", root / "run", *ARGS)
    assert rc == 0, err
    return root


def test_eval_of_last_pt_on_val_is_the_runs_last_val_row(run):
    rc, out, _ = run_cli("eval", run / "run" / "last.pt", run / "data" / "val", "--json", "--threads", "1")
    assert rc == 0
    r = json.loads(out)
    val = [json.loads(line) for line in (run / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert r["task"] == "classify" and r["n"] == val["n"] == 21
    assert r["top1"] == pytest.approx(val["top1"]) and r["top5"] == pytest.approx(val["top5"])
    assert r["loss"] == pytest.approx(val["loss"], rel=1e-4)
    rows = r["per_class"]
    assert [row["class"] for row in rows] == list(CLASSES)
    assert sum(row["n"] for row in rows) == 21  # sample i has class i % 6
    assert [row["n"] for row in rows] == [4, 4, 4, 3, 3, 3]
    assert sum(row["top1"] * row["n"] for row in rows) / 21 == pytest.approx(r["top1"])


def test_eval_text_has_the_figures_and_a_row_per_class(run):
    rc, out, _ = run_cli("eval", run / "run" / "best.pt", run / "data" / "train", "--threads", "1")
    assert rc == 0
    lines = out.splitlines()
    assert lines[2].startswith("figures    top-1 ") and lines[2].endswith("(48 samples)")
    assert lines[3].split() == ["class", "top-1", "samples"]
    assert [line.split()[0] for line in lines[4:]] == list(CLASSES) and all(
        line.split()[-1] == "8" for line in lines[4:]
    )


def test_wrong_paths_are_one_line_and_exit_2(run, tmp_path):
    from stoker.tools.common.synth import make_image_folder

    make_image_folder(tmp_path / "photos", per_class=1, min_side=32, max_side=40)
    write_split(tmp_path / "three", num_samples=6, samples_per_shard=6, classes=CLASSES[:3])
    ckpt, val = run / "run" / "last.pt", run / "data" / "val"
    for argv, message in (
        ([tmp_path, val], f"{tmp_path} holds no checkpoint (best.pt, last.pt): give a run folder"),
        ([tmp_path / "no.pt", val], f"{tmp_path / 'no.pt'} does not exist"),
        ([ckpt, run / "data"], f"give a split, did you mean {run / 'data' / 'val'}? ({run / 'data' / 'train'} for"),
        ([ckpt, tmp_path / "photos"], "is an image folder, not packed shards: run `stoker pack"),
        ([ckpt, tmp_path / "three"], "its classes are not the checkpoint's (3 vs 6"),
    ):
        rc, _, err = run_cli("eval", *argv)
        assert rc == 2 and len(err.strip().splitlines()) == 1 and message in err, err


def test_per_class_rows_of_masks_and_multilabel():
    from stoker.model.train.scoring import per_class
    from stoker.model.train.tasks import Task

    seg = Task("segment", 3, "miou", ignore_index=255)
    metrics = seg.metrics(torch.device("cpu"))
    y = torch.tensor([[[0, 0, 1, 2]]], dtype=torch.uint8)  # 1 x 1 x 4 pixels
    pred = torch.tensor([0, 1, 1, 1])  # class 0: 1 of 2 right; class 1: right, and 2 wrong ones
    metrics.update(torch.nn.functional.one_hot(pred, 3).T.float()[None, :, None, :], y)
    rows = per_class(seg, metrics, ["a", "b", "c"], None, None)
    assert rows == [
        {"class": "a", "pixels": 2, "iou": 0.5},
        {"class": "b", "pixels": 1, "iou": pytest.approx(1 / 3)},
        {"class": "c", "pixels": 1, "iou": 0.0},
    ]
    tags = Task("multilabel", 2, "map")
    metrics = tags.metrics(torch.device("cpu"))
    metrics.update(torch.tensor([[2.0, -1.0], [1.0, 1.0], [-1.0, 0.5]]), torch.tensor([[1, 0], [0, 1], [1, 0]]))
    rows = per_class(tags, metrics, ["cat", "dog"], None, None)
    assert (
        [r["positives"] for r in rows] == [2, 1]
        and rows[1]["ap"] == 1.0
        and rows[0]["ap"] == pytest.approx(0.8333, abs=1e-4)
    )


def test_text_leaves_out_the_classes_without_samples():
    from stoker.tools.eval import format_result

    rows = [{"class": f"n{k:03d}", "n": 2 if k < 2 else 0, "top1": 0.5 if k < 2 else None} for k in range(1000)]
    text = format_result(
        {
            "checkpoint": "b.pt",
            "split": "v",
            "arch": "a",
            "task": "classify",
            "n": 4,
            "loss": 1.0,
            "top1": 0.5,
            "top5": 1.0,
            "per_class": rows,
        }
    )
    assert "(998 of 1000 classes without samples left out)" in text
    assert [line.split()[0] for line in text.splitlines()[-2:]] == ["n000", "n001"]
