"""`stoker train DATA --mix a:W,b:W --balance classes` on tiny generated datasets: the mix in the
run log, validation per dataset and overall in metrics.jsonl, a bad --mix in one line."""

import contextlib
import io
import json

import pytest
import torch

from helpers import run_cli, write_split
from stoker.tools.cli import main as cli

ARGS = ["--epochs", "1", "--batch-size", "8", "--crop", "32", "--no-progress", "--json", "--threads", "1"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixtrain") / "data"
    write_split(root / "web" / "train", num_samples=40, samples_per_shard=20)
    write_split(root / "web" / "val", num_samples=12, samples_per_shard=12, seed=2)
    write_split(root / "curated" / "train", num_samples=10, samples_per_shard=10, seed=1)
    write_split(root / "curated" / "val", num_samples=6, samples_per_shard=6, seed=3)
    return root


def test_a_mixed_balanced_run_names_the_mix_and_validates_each_dataset(data, tmp_path):
    run = tmp_path / "run"
    out, err = io.StringIO(), io.StringIO()
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli(
                ["train", str(data), "--out", str(run), "--mix", "web:0.7,curated:0.3", "--balance", "classes", *ARGS]
            )
    finally:
        torch.set_num_threads(n)
    assert rc == 0, err.getvalue()
    summary, log = json.loads(out.getvalue()), err.getvalue()
    assert "mix: " in log and "web/train:0.7" in log and "curated/train:0.3" in log and "balance=classes" in log
    assert "of 48 an epoch from 40 samples" in log and "from 10 samples" in log  # the Loader's start lines
    assert summary["steps"] == 6  # 50 samples rounded down to whole batches of 8
    val = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"val"' in line][-1]
    assert val["n"] == 18 and set(val["splits"]) == {"web", "curated"}
    assert (val["splits"]["web"]["n"], val["splits"]["curated"]["n"]) == (12, 6)
    hits = sum(s["top1"] * s["n"] for s in val["splits"].values())
    assert hits == pytest.approx(val["top1"] * val["n"])  # overall = the splits together
    assert "[web: top-1" in log and "; curated: top-1" in log
    cfg = json.loads((run / "config.json").read_text())
    assert (cfg["mix"], cfg["balance"]) == ("web:0.7,curated:0.3", "classes")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mix", "web:0.7,curated:x"], "--mix web:0.7,curated:x: 'curated:x' is not NAME:WEIGHT"),
        (["--mix", "web:0,curated:0"], "at least one weight must be above 0"),
        (["--mix", "web:1,nowhere:1"], "--mix nowhere: no "),
        (["--mix", "web:1,curatd:1"], "(each dataset holds train/ and val/): did you mean curated?"),
    ],
)
def test_a_bad_mix_is_one_line(data, tmp_path, flags, message):
    rc, _, err = run_cli("train", data, "--out", tmp_path / "r", *flags, *ARGS)
    assert rc == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_unknown_balance_is_named():
    from stoker.errors import ArgumentError
    from stoker.model.train import TrainConfig

    # the CLI's parser refuses it first (a choice); a Python caller's config says the same
    with pytest.raises(ArgumentError, match="balance='labels'|--balance labels must be one of classes"):
        TrainConfig(data="d", out="r", balance="labels").validate()


def test_val_reports_the_balanced_top1_the_mean_of_each_class_recall():
    from stoker.model.train.runtime import Dist
    from stoker.model.train.tasks import ClassifyMetrics, Task

    metrics = ClassifyMetrics(Task("classify", 3, "top1"), torch.device("cpu"))
    out = torch.tensor([[5.0, 0, 0], [5, 0, 0], [5, 0, 0], [0, 5, 0], [5, 0, 0]])
    metrics.update(out, torch.tensor([0, 0, 0, 1, 2]))  # class 0: 3/3, class 1: 1/1, class 2: 0/1
    figures = metrics.compute(Dist())
    assert figures["top1"] == pytest.approx(0.8) and figures["balanced_top1"] == pytest.approx(2 / 3)
