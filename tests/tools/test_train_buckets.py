"""`stoker train --buckets`: each batch one shape by its images' aspect, the shapes chosen recorded
in the run's config and its checkpoint, val and eval at the same shapes; mistakes are one line."""

import contextlib
import io
import json

import pytest
import torch

from helpers import write_split
from stoker.model.train.scoring import evaluate_checkpoint
from stoker.pipeline.shards.table import write_split_table
from stoker.tools.cli import main as cli

ARGS = ["--epochs", "1", "--batch-size", "4", "--crop", "32", "--no-progress", "--json", "--threads", "0"]
ARGS += ["--backend", "pil", "--deterministic"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("bucketed") / "data"
    for split, n, seed in (("train", 40, 0), ("val", 13, 1)):
        write_split(root / split, num_samples=n, samples_per_shard=16, seed=seed, min_side=32, max_side=96)
        write_split_table(root / split)  # with the images' sizes, as pack and index write it
    return root


@pytest.fixture(scope="module")
def run(data):
    out = data.parent / "run"
    err = io.StringIO()
    stdout = io.StringIO()
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
            rc = cli(["train", str(data), "--out", str(out), "--buckets", "auto", *ARGS])
    finally:
        torch.set_num_threads(n)
    assert rc == 0, err.getvalue()
    return out, json.loads(stdout.getvalue()), err.getvalue()


def test_a_bucketed_run_records_its_shapes_and_evaluates_at_them(data, run):
    out, summary, err = run
    config = json.loads((out / "config.json").read_text())
    shapes = config["buckets"]
    assert isinstance(shapes, list) and 1 <= len(shapes) <= 7 and all(len(s) == 2 for s in shapes)
    assert "buckets: " + ", ".join(f"{h}x{w}" for h, w in shapes) in err
    assert summary["val"]["n"] == 13  # every val sample once, at the train run's shapes
    ckpt = torch.load(out / "last.pt", map_location="cpu", weights_only=False)
    assert ckpt["config"]["buckets"] == shapes
    again = evaluate_checkpoint(
        out / "last.pt", str(data / "val"), batch_size=4, device="cpu", backend="pil", threads=0
    )
    assert again["n"] == 13


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--buckets", "wide"], "--buckets wide must be auto or HxW,HxW"),
        (["--buckets", "auto", "--progressive", "32:64"], "--progressive changes the crop each epoch"),
        (["--buckets", "auto", "--arch", "report"], "--arch report takes one input size"),
    ],
)
def test_bucket_mistakes_are_one_line(data, tmp_path, capsys, extra, needle):
    assert cli(["train", str(data), "--out", str(tmp_path / "x"), *ARGS, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("stoker train: ") for line in err), err
    assert needle in err[-1]
