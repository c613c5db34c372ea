"""The everyday run: log lines a cluster reads, metrics sinks, smoke runs, extending, fine-tuning,
resuming without the flags, `stoker eval`. One redirected run is shared by the tests (module fixture)."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from helpers import run_cli, write_split

#: a tiny run: 6 steps an epoch, a window of 2 steps
ARGS = ["--batch-size", "8", "--crop", "32", "--log-every", "2", "--threads", "1", "--deterministic"]
STEP_LINE = re.compile(
    r"^stoker train: epoch (\d+)/(\d+) step (\d+)/(\d+): loss [\d.]+, \d+ img/s, data wait \d+%, lr [\d.e-]+, "
    r"ETA \d+:\d\d:\d\d$"
)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs") / "data"
    write_split(root / "train", num_samples=48, samples_per_shard=16)
    write_split(root / "val", num_samples=21, samples_per_shard=16, seed=1)
    return root


@pytest.fixture(scope="module")
def logged_run(data):
    """`stoker train ... > train.out 2>&1`, one epoch, csv and TensorBoard: what a cluster job does."""
    run = data.parent / "logged"
    log = data.parent / "train.out"
    with open(log, "w") as out:
        p = subprocess.run(
            [sys.executable, "-m", "stoker", "train", str(data), "--out", str(run), "--epochs", "1", *ARGS]
            + ["--logger", "csv,tensorboard"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
    text = log.read_text()
    assert p.returncode == 0, text[-2000:]
    return run, text


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_redirected_output_has_a_line_per_log_window(logged_run):
    run, text = logged_run
    steps = [m.groups() for m in map(STEP_LINE.match, text.splitlines()) if m]
    assert [(s[2], s[3]) for s in steps] == [("2", "6"), ("4", "6"), ("6", "6")], text
    assert "\r" not in text  # no progress bar in a file
    console = (run / "console.log").read_text()
    # the console's copy: every line the run said, and the summary
    assert all(line in console for line in text.splitlines() if line.startswith("stoker train: "))
    assert "checkpoint " in console and "val        top-1" in console


def test_csv_and_tensorboard_hold_the_metrics_rows(logged_run):
    run, _ = logged_run
    rows = _rows(run)
    with open(run / "metrics.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["kind"] for r in table] == [r["kind"] for r in rows] == ["train"] * 3 + ["val"]
    assert [float(r["loss"]) for r in table] == pytest.approx([r["loss"] for r in rows])
    assert float(table[-1]["top1"]) == pytest.approx(rows[-1]["top1"]) and table[0]["top1"] == ""

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run))
    events.Reload()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [2, 4, 6]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in rows[:3]], rel=1e-6)
    assert events.Scalars("val/top1")[0].value == pytest.approx(rows[-1]["top1"], rel=1e-6)


def test_a_missing_tensorboard_is_one_line_naming_the_extra(data, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import tensorboard raises ImportError
    rc, _, err = run_cli("train", data, "--out", tmp_path / "r", *ARGS, "--logger", "tensorboard")
    assert rc == 2 and err.strip() == (
        "stoker train: error: --logger tensorboard needs the tensorboard package: pip install 'stoker[tensorboard]'"
    )
    assert not (tmp_path / "r").exists()
    rc, _, err = run_cli("train", data, "--out", tmp_path / "r", *ARGS, "--logger", "wandb")
    assert rc == 2 and "logger='wandb' is not one of csv, tensorboard" in err


def _train(*argv):
    """`stoker train ... --json` in this process: (summary, stderr)."""
    rc, out, err = run_cli("train", *argv, "--json", "--no-progress")
    assert rc == 0, err[-2000:]
    return json.loads(out), err


def test_one_epoch_caps_the_warm_up_and_says_so(logged_run):
    run, text = logged_run
    config = json.loads((run / "config.json").read_text())
    assert config["total_steps"] == 6 and config["warmup_steps"] == 1  # not the whole run: 25% of it
    assert "--warmup-epochs 1 is 6 step(s) of the schedule's 6: warm-up capped at 1 step(s) (25% of it)" in text
    lrs = [r["lr"] for r in _rows(run) if r["kind"] == "train"]
    assert lrs[0] > lrs[1] > lrs[2] == 0  # past the peak from the first window on: cosine decay


def test_max_steps_is_a_smoke_run_that_resume_continues(data, tmp_path):
    full, _ = _train(data, "--out", tmp_path / "full", "--epochs", "2", *ARGS)
    smoke, err = _train(data, "--out", tmp_path / "smoke", "--epochs", "2", *ARGS, "--max-steps", "3")
    assert smoke["steps"] == 3 and smoke["max_steps"] == 3 and not smoke["complete"]
    assert smoke["val"]["n"] == 21  # the val pass ran too
    assert "--max-steps 3: stopping after step 3 of 12" in err
    rc, _, err = run_cli("train", data, "--out", tmp_path / "smoke", "--epochs", "2", *ARGS)
    assert rc == 2 and "continue it with --resume" in err  # the smoke run is a run: continued, not overwritten
    rest, _ = _train(data, "--out", tmp_path / "smoke", "--epochs", "2", *ARGS, "--resume")
    assert rest["steps"] == 12 and rest["weights_sha256"] == full["weights_sha256"]
