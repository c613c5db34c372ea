"""`stoker train` beyond classification: regression on float targets (MSE, MAE, R²), segmentation
on masks (mIoU, pixel accuracy), multi-label (mAP), grayscale input, and the one-line refusals of
a task the split's targets cannot train."""

import json
import os
import signal

import pytest
import torch

from stoker.model.train import TrainConfig, train
from stoker.model.train.tasks import Task, average_precision, resolve_task
from stoker.pipeline import Loader
from stoker.pipeline.shards.targets import Target
from stoker.tools.common.synth import make_regression_csv, make_segmentation_tree
from stoker.tools.pack import Masks, pack


@pytest.fixture(scope="module")
def reg_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("reg")
    pack(make_regression_csv(root / "src", n=48, seed=4), root / "data", val_fraction=0.25, workers=1)
    return root / "data"


@pytest.fixture(scope="module")
def seg_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("seg")
    images, masks = make_segmentation_tree(root / "src", n=16, seed=5, min_side=40, max_side=64)
    pack(images, root / "data", masks=Masks(masks, num_classes=4), val_fraction=0.25, workers=1)
    return root / "data"


def _cfg(data, out, **kw):
    base = dict(data=str(data), out=str(out), epochs=2, batch_size=6, crop=32, progress=False, threads=1, log_every=2)
    base.update(kw)
    return TrainConfig(**base)


def test_float_targets_are_regressed_with_r2_and_best_by_r2(reg_data, tmp_path):
    s = train(_cfg(reg_data, tmp_path / "run", lr=0.02))
    assert s["task"] == "regress" and set(s["val"]) >= {"mse", "mae", "r2", "loss", "n"} and s["val"]["n"] == 12
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    (std,) = config["target_units"]["std"]  # standardized by default: the loss is in units of the std
    assert s["val"]["loss"] == pytest.approx(s["val"]["mse"] / std**2)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["kind"] == "val"]
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=False)
    assert best["best_metric"] == "r2" and best["best_score"] == pytest.approx(max(r["r2"] for r in val))
    assert config["task"] == "regress" and config["num_outputs"] == 1 and config["arch"] == "inception"


def test_segmentation_trains_a_torchvision_model_on_grayscale_masks(seg_data, tmp_path):
    s = train(_cfg(seg_data, tmp_path / "run", batch_size=4, channels=1, epochs=1, arch="lraspp_mobilenet_v3_large"))
    assert s["task"] == "segment" and s["arch"] == "lraspp_mobilenet_v3_large"
    assert 0 <= s["val"]["miou"] <= 1 and 0 <= s["val"]["pixel_acc"] <= 1 and s["val"]["n"] == 4
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["channels"] == 1 and config["num_outputs"] == 4 and len(config["mean"]) == 1


class _StopAt:
    """The train Loader, sending this process SIGTERM when asked for the batch after its ``at``-th
    (as a preemption): the run stops after the step that batch trains."""

    def __init__(self, loader, at):
        self.loader, self.at, self.seen = loader, at, 0

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield batch
            self.seen += 1
            if self.seen == self.at:
                os.kill(os.getpid(), signal.SIGTERM)


def _factory(stop_at=None):
    def make(path, **kw):
        loader = Loader(path, **kw)
        return _StopAt(loader, stop_at) if stop_at and kw["train"] else loader

    return make


def test_segmentation_resumes_mid_epoch_to_the_same_weights(seg_data, tmp_path):
    cfg = dict(batch_size=4, epochs=2, deterministic=True, arch="lraspp_mobilenet_v3_large", log_every=1)
    full = train(_cfg(seg_data, tmp_path / "full", **cfg), loader_factory=_factory())
    cut = train(_cfg(seg_data, tmp_path / "cut", **cfg), loader_factory=_factory(stop_at=3))
    assert cut["interrupted"] == "SIGTERM" and cut["steps"] == 4  # epoch 2, batch 1 of 3
    resumed = train(_cfg(seg_data, tmp_path / "cut", **cfg, resume="auto"), loader_factory=_factory())
    assert resumed["steps"] == 6 and resumed["weights_sha256"] == full["weights_sha256"]
    assert resumed["val"]["miou"] == pytest.approx(full["val"]["miou"])


@pytest.mark.parametrize(
    ("task", "kind", "message"),
    [
        ("classify", "float", "--task classify needs class targets, but the split's are float, 1 column"),
        ("segment", "class", "--task segment needs mask targets, but the split's are class"),
        ("multilabel", "mask", "--task multilabel needs multilabel targets"),
    ],
)
def test_a_task_the_targets_cannot_train_is_one_line(task, kind, message):
    target = Target.of(kind, columns=("y",)) if kind == "float" else Target.of(kind)
    with pytest.raises(ValueError, match=message):
        resolve_task(task, target, ["a", "b"])


def test_auto_picks_the_task_of_the_targets_and_regress_on_classes_is_the_case_study():
    assert resolve_task("auto", Target.of("float", columns=("x", "y")), []).num_outputs == 2
    assert resolve_task("auto", Target.of("mask", num_classes=5), []) == Task("segment", 5, "miou", ignore_index=255)
    case = resolve_task("regress", Target(), ["a", "b", "c"])
    assert case.case_study and case.num_outputs == 1
    with pytest.raises(ValueError, match="pass num_classes"):
        resolve_task("auto", Target.of("mask"), [])


def test_average_precision_matches_a_hand_computed_ranking():
    scores = torch.tensor([[0.9, 0.1], [0.8, 0.7], [0.3, 0.2], [0.1, 0.9]])
    targets = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 0]], dtype=torch.float32)
    # class 0: positives at ranks 1 and 3 -> (1/1 + 2/3) / 2; class 1: positive at rank 2 -> 1/2
    assert average_precision(scores, targets) == pytest.approx(((1 + 2 / 3) / 2 + 0.5) / 2)


def test_multilabel_trains_with_bce_and_reports_map(tmp_path):
    from PIL import Image

    (tmp_path / "im").mkdir()
    rows = []
    for k in range(24):
        Image.new("RGB", (40, 40), (200 if k % 2 else 20, 200 if k % 3 == 0 else 20, 90)).save(
            tmp_path / "im" / f"{k}.jpg"
        )
        labels = [name for name, on in (("red", k % 2), ("green", k % 3 == 0)) if on] or ["none"]
        rows.append(f"im/{k}.jpg,{'|'.join(labels)}")
    (tmp_path / "l.csv").write_text("\n".join(rows) + "\n")
    pack(tmp_path / "l.csv", tmp_path / "data", val_fraction=0.25, workers=1)
    s = train(_cfg(tmp_path / "data", tmp_path / "run", epochs=1))
    assert s["task"] == "multilabel" and 0 <= s["val"]["map"] <= 1
