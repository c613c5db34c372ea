"""The first hour, second pass (issue 51): a network that `.view`s, `eval` on a run folder, `--resume
auto` in a job script, a finished run resumed, a smoke run's best.pt, balanced top-1 on the console.
One tiny pack (2 steps an epoch) and a few in-process runs shared by the tests (module fixtures)."""

import json

import pytest

from helpers import run_cli, write_split

ARGS = ["--batch-size", "8", "--crop", "32", "--threads", "1", "--no-progress", "--deterministic"]

#: the seed report's network, shrunk: its forward flattens with x.view(x.size(0), -1)
SEEDNET = """
import torch
from torch import nn

class SeedNet(nn.Module):
    def __init__(self, num_classes=1):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(8)
        self.fc = nn.Linear(8 * 4 * 4, num_classes)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv(x)))
        x = x.view(x.size(0), -1)
        return self.fc(x)

def make_net(num_classes=1):
    return SeedNet(num_classes)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("first_hour") / "data"
    write_split(root / "train", num_samples=16, samples_per_shard=16)  # 2 steps an epoch
    write_split(root / "val", num_samples=8, samples_per_shard=8, seed=1)
    return root


def _train(*argv):
    rc, out, err = run_cli("train", *argv)
    assert rc == 0, err
    return out, err


@pytest.fixture(scope="module")
def seednet_run(data):
    """The .view network trained with --channels-last (one epoch)."""
    (data.parent / "seednet.py").write_text(SEEDNET)
    run = data.parent / "seednet-run"
    _, err = _train(data, "--out", run, *ARGS, "--epochs", "1", "--model", f"{data.parent / 'seednet.py'}:make_net")
    return run, err


def test_a_network_that_views_trains_and_evaluates_under_channels_last(data, tmp_path):
    (tmp_path / "seednet.py").write_text(SEEDNET)
    spec = f"{tmp_path / 'seednet.py'}:make_net"
    out, err = _train(data, "--out", tmp_path / "r", *ARGS, "--epochs", "1", "--model", spec, "--channels-last")
    line = next(x for x in err.splitlines() if "--channels-last is off" in x)
    assert "forward calls .view()" in line and "forgoes channels_last's speed-up" in line
    assert ".reshape() or torch.flatten() in the forward keeps it" in line
    assert "Traceback" not in err and json.loads((tmp_path / "r" / "config.json").read_text())["channels_last"] is False
    rc, out, err = run_cli("eval", tmp_path / "r", data / "val", "--threads", "1")
    assert rc == 0 and out.splitlines()[2].startswith("figures    top-1 "), err


def test_eval_takes_a_run_folder_best_then_last_and_says_which(data, seednet_run, tmp_path):
    run, _ = seednet_run
    rc, out, err = run_cli("eval", run, data / "val", "--threads", "1", "--json")
    assert rc == 0 and json.loads(out)["checkpoint"] == str(run / "best.pt")
    assert err.strip() == f"stoker eval: {run} is a run: evaluating its best.pt (the best val figure of the run)"
    import shutil

    shutil.copy(run / "last.pt", tmp_path / "last.pt")  # a run with no best.pt (trained without val)
    rc, out, err = run_cli("eval", tmp_path, data / "val", "--threads", "1", "--json")
    assert rc == 0 and json.loads(out)["checkpoint"] == str(tmp_path / "last.pt")
    assert f"{tmp_path} is a run without a best.pt (no val figure yet, or no val split): evaluating its last.pt" in err
    rc, _, err = run_cli("eval", run, data)  # the pack's root: its val/ is what an evaluation reads
    assert rc == 2 and err.strip().endswith(
        f"give a split, did you mean {data / 'val'}? ({data / 'train'} for the train figures)"
    )


@pytest.fixture(scope="module")
def auto_runs(data):
    """The same job script twice: `--resume auto` on an empty RUN, then again on the finished run."""
    run = data.parent / "auto"
    argv = (data, "--out", run, *ARGS, "--epochs", "1", "--resume", "auto")
    return run, _train(*argv), _train(*argv)


def test_resume_auto_starts_a_run_then_continues_it(auto_runs):
    run, (out, err), _ = auto_runs
    assert f"stoker train: --resume auto: {run} holds no run yet: starting it" in err
    assert "steps      2/2 in " in out and (run / "last.pt").is_file()


def test_resume_auto_is_one_value_and_a_run_without_checkpoint_starts_over(data, tmp_path, capsys):
    from stoker.tools.cli import main as cli

    with pytest.raises(SystemExit) as e:  # argparse's own error: it exits
        cli(["train", str(data), "--out", str(tmp_path / "r"), "--resume", "lastt"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--resume takes no value (RUN/last.pt) or auto" in err
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("")  # stopped before its first checkpoint
    _, err = _train(data, "--out", tmp_path / "r", *ARGS, "--epochs", "1", "--max-steps", "1", "--resume", "auto")
    assert "holds a run stopped before its first checkpoint (metrics.jsonl): starting it over" in err


def test_resume_of_a_finished_run_says_one_thing(auto_runs):
    run, _, (out, err) = auto_runs  # the identical command once the run is finished
    assert f"--resume auto: {run} holds a run: continuing it from {run / 'last.pt'}" in err
    assert f"{run} is complete (2/2 steps): nothing to resume" in err
    assert "resumed from" not in err  # not "resumed ... at step 2", then "nothing to resume"
    assert "steps      2/2: the run is complete" in out


@pytest.fixture(scope="module")
def balanced_smoke(data):
    """A smoke run (--max-steps 1 of 4) under --balance classes: the val pass runs at its end."""
    run = data.parent / "smoke"
    out, err = _train(data, "--out", run, *ARGS, "--epochs", "2", "--max-steps", "1", "--balance", "classes")
    return run, out, err


def test_a_max_steps_run_keeps_best_pt_when_val_ran(balanced_smoke):
    from stoker.model import load_checkpoint

    run, _, _ = balanced_smoke
    best = load_checkpoint(run / "best.pt")
    assert best["step"] == 1 and best["best_score"] == pytest.approx(_val_rows(run)[-1]["top1"])


def _val_rows(run):
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "val"]


def test_balanced_top1_is_on_the_val_lines_under_balance_classes(balanced_smoke, seednet_run):
    run, out, err = balanced_smoke
    shown = f"balanced top-1 {100 * _val_rows(run)[-1]['balanced_top1']:.1f}%"
    assert "val top-1 " in err and shown in next(x for x in err.splitlines() if ": val top-1" in x)
    assert shown in next(x for x in out.splitlines() if x.startswith("val "))
    assert "balanced" not in seednet_run[1]  # without --balance classes: top-1 alone, as before


def test_a_train_only_pack_says_it_has_no_val_and_how_to_add_one(tmp_path):
    from stoker.tools.common.synth import make_image_folder

    make_image_folder(tmp_path / "imgs", per_class=2, min_side=32, max_side=40)
    rc, out, err = run_cli("pack", tmp_path / "imgs", tmp_path / "out", "--workers", "1")
    assert rc == 0, err
    line = next(x for x in out.splitlines() if x.startswith("val: "))
    assert "a train split only: `stoker train` trains without validation (no val figures, no best.pt)" in line
    assert "pack again into a new OUT with --val-fraction 0.1" in line
    rc, out, err = run_cli("pack", tmp_path / "imgs", tmp_path / "both", "--workers", "1", "--val-fraction", "0.25")
    assert rc == 0 and "val: none" not in out and out.splitlines()[2].startswith("val "), out


def test_verify_and_index_redirected_write_no_progress_bars(data, tmp_path):
    import shutil

    rc, out, err = run_cli("verify", data / "train", "--workers", "1")  # stderr a file, not a terminal
    assert rc == 0 and "\r" not in out + err and "OK" in out.upper(), out + err
    shutil.copytree(data / "train", tmp_path / "t")
    for idx in (tmp_path / "t").glob("*.idx"):
        idx.unlink()
    rc, out, err = run_cli("index", tmp_path / "t", "--workers", "1")
    assert rc == 0 and "\r" not in out + err, out + err
