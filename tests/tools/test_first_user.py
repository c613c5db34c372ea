"""The first user's path end to end: their own network in a file, a CSV of floats in natural units
(ages 18 to 80), `stoker pack`, `stoker train --model`, predictions in years."""

import contextlib
import io
import json

import numpy as np
import pytest
import torch

from stoker.tools.cli import main as cli

NET = """
from torch import nn

def make_net():  # no arguments: one output, as the user wrote it
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 1),
    )
"""
TRAIN = ["--epochs", "12", "--crop", "32", "--batch-size", "8", "--optimizer", "adamw", "--lr", "3e-3"]
TRAIN += ["--no-progress", "--json", "--threads", "1", "--seed", "0"]


@pytest.fixture(scope="module")
def ages(tmp_path_factory):
    """``(root, packed, net file)``: 200 pictures whose colour temperature is an age in 18..80."""
    from stoker.tools.common.synth import make_regression_csv

    root = tmp_path_factory.mktemp("first-user")
    csv = make_regression_csv(root / "ages", n=200, seed=1, low=18, high=80, column="age", min_side=40, max_side=96)
    (root / "mynet.py").write_text(NET)
    assert _cli("pack", str(csv), str(root / "packed"), "--val-fraction", "0.2")[0] == 0
    return root, root / "packed", root / "mynet.py"


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli([str(a) for a in argv])
    finally:
        torch.set_num_threads(n)
    return rc, out.getvalue(), err.getvalue()


def _train(packed, run, net, *extra):
    rc, out, err = _cli("train", packed, "--out", run, "--model", f"{net}:make_net", *TRAIN, *extra)
    assert rc == 0, err
    return json.loads(out), err


def test_the_packer_records_the_targets_statistics(ages):
    from stoker.pipeline import Loader

    _, packed, _ = ages
    rows = (packed.parent / "ages" / "targets.csv").read_text().splitlines()[1:]
    with Loader(packed / "train", batch_size=8, crop=32, threads=1) as loader:
        stats = loader.target_stats
        every = np.concatenate([y.numpy() for _, y in loader])  # the train split's targets (one epoch, no drop)
    assert stats.count == 160 and 18 <= stats.min[0] < stats.max[0] <= 80
    assert len(every) == 160 and abs(stats.mean[0] - every.mean()) < 1e-3 and abs(stats.std[0] - every.std()) < 1e-3
    assert 18 <= min(float(r.split(",")[1]) for r in rows)


def test_natural_units_learn_when_standardized_and_predict_in_years(ages, tmp_path):
    root, packed, net = ages
    summary, err = _train(packed, tmp_path / "std", net)
    assert "targets standardized (mean 4" in err  # ages around 49
    r2_std = summary["val"]["r2"]
    raw, err_raw = _train(packed, tmp_path / "raw", net, "--no-standardize-targets")
    assert "far from unit scale" in err_raw
    assert r2_std > 0.3 and raw["val"]["r2"] < 0 < r2_std  # natural units never learn raw here
    # the checkpoint predicts years, its "net" holds the user's own parameter names
    from stoker.model import Predictor

    ckpt = torch.load(tmp_path / "std" / "best.pt", weights_only=True)
    from stoker.model.user import build_user_model

    assert set(ckpt["net"]) == set(build_user_model(f"{net}:make_net", 1).state_dict())  # "0.weight", ...
    images = sorted((root / "ages" / "images").glob("*.jpg"))[:40]
    truth = {f"images/{p.name}": float(v) for p, v in _targets(root)}
    pred = Predictor.from_checkpoint(tmp_path / "std" / "best.pt")(images).squeeze(1)
    want = torch.tensor([truth[f"images/{p.name}"] for p in images])
    # years, not standardized units (which would sit within a few units of 0); the margin is a
    # small net's error on 40 images, which the train order moves
    assert 18 - 20 < float(pred.min()) and float(pred.max()) < 80 + 20
    assert float(torch.corrcoef(torch.stack([pred, want]))[0, 1]) > 0.6


def _targets(root):
    for line in (root / "ages" / "targets.csv").read_text().splitlines()[1:]:
        path, value = line.split(",")
        yield root / "ages" / path, value


def test_a_network_with_the_wrong_outputs_is_one_line(ages, tmp_path):
    _, packed, _ = ages
    bad = tmp_path / "bad.py"
    bad.write_text("from torch import nn\ndef make_net():\n    return nn.Sequential(nn.Flatten(), nn.LazyLinear(10))\n")
    rc, _, err = _cli("train", packed, "--out", tmp_path / "r", "--model", f"{bad}:make_net", *TRAIN)
    assert rc == 2 and "returns [2, 10]" in err and "needs [2, 1]" in err and err.count("\n") == 1
    rc, _, err = _cli("train", packed, "--out", tmp_path / "r", "--model", f"{bad}:nope", *TRAIN)
    assert rc == 2 and "has no attribute 'nope'" in err
    rc, _, err = _cli("train", packed, "--out", tmp_path / "r", "--model", f"{bad}:make_net", "--arch", "resnet18")
    assert rc == 2 and "not both" in err


def test_a_factory_is_given_the_outputs_and_channels_it_asks_for(tmp_path):
    from stoker.model.user import build_user_model

    f = tmp_path / "nets.py"
    f.write_text(
        "from torch import nn\ndef build(num_outputs, in_chans=3):\n    return nn.Conv2d(in_chans, num_outputs, 1)\n"
    )
    net = build_user_model(f"{f}:build", 5, in_channels=1)
    assert (net.in_channels, net.out_channels) == (1, 5)
