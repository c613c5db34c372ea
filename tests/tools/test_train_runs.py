"""The everyday run: log lines a cluster reads, metrics sinks, smoke runs, extending, fine-tuning,
resuming without the flags, `stoker eval`. One redirected run is shared by the tests (module fixture)."""

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from command_server import routed
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
def logged_run(data, command_server):
    """`stoker train ... > train.out 2>&1`, one epoch, csv and TensorBoard: what a cluster job does."""
    run = data.parent / "logged"
    log = data.parent / "train.out"
    with open(log, "w") as out, pytest.MonkeyPatch.context() as mp:
        routed(command_server, mp)  # forked from the command server: the same files, no second torch import
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
    full, _ = _train(data, "--out", tmp_path / "full", "--epochs", "1", *ARGS)
    smoke, err = _train(data, "--out", tmp_path / "smoke", "--epochs", "1", *ARGS, "--max-steps", "3")
    assert smoke["steps"] == 3 and smoke["max_steps"] == 3 and not smoke["complete"]
    assert smoke["val"]["n"] == 21  # the val pass ran too
    assert "--max-steps 3: stopping after step 3 of 6" in err
    rc, _, err = run_cli("train", data, "--out", tmp_path / "smoke", "--epochs", "1", *ARGS)
    assert rc == 2 and "continue it with --resume" in err  # the smoke run is a run: continued, not overwritten
    again, err = _train("--out", tmp_path / "smoke", "--resume", "--max-steps", "3")
    assert again["steps"] == 3 and "--max-steps 3: the run is at step 3 already; nothing to train" in err
    rest, _ = _train(data, "--out", tmp_path / "smoke", "--epochs", "1", *ARGS, "--resume")
    assert rest["steps"] == 6 and rest["weights_sha256"] == full["weights_sha256"]


def _copy(run, to):
    import shutil

    shutil.copytree(run, to)
    return to


def test_resume_takes_the_saved_config_and_says_so(logged_run, tmp_path):
    run = _copy(logged_run[0], tmp_path / "run")
    s, err = _train("--out", run, "--resume")  # no DATA, no flags: the run's own
    assert s["complete"] and s["steps"] == 6 and s["arch"] == "inception"
    assert f"stoker train: the run's settings from {run / 'config.json'} (no flag changes them)" in err
    assert "nothing to resume; to train it longer, extend it with --resume --epochs 2 (or more)" in err


def test_extending_a_finished_run_and_resuming_the_extension(logged_run, tmp_path):
    straight = _copy(logged_run[0], tmp_path / "straight")
    s, err = _train("--out", straight, "--resume", "--epochs", "3")
    assert s["steps"] == 18 and s["complete"]
    assert "from the command line: --epochs 3 (was 1)" in err
    assert f"extending {straight}: it finished 1 epoch(s) (6 steps); epochs 2-3 train from its weights" in err
    config = json.loads((straight / "config.json").read_text())
    assert config["extended_from"]["step"] == 6 and config["schedule_start"] == 6 and config["warmup_steps"] == 3
    lrs = [r["lr"] for r in _rows(straight) if r["kind"] == "train" and r["step"] > 6]
    # the finished run's lr had decayed to 0: the new schedule climbs to the peak again, then decays
    assert lrs[0] == pytest.approx(config["lr"]) and lrs == sorted(lrs, reverse=True) and lrs[-1] == 0
    # the same extension stopped at step 9 (--max-steps) and resumed: the same weights
    stepped = _copy(logged_run[0], tmp_path / "stepped")
    part, _ = _train("--out", stepped, "--resume", "--epochs", "3", "--max-steps", "9")
    assert part["steps"] == 9
    rest, err = _train("--out", stepped, "--resume")  # --epochs 3 comes from its config.json
    assert rest["steps"] == 18 and rest["weights_sha256"] == s["weights_sha256"]
    # fewer epochs than it trained: one line with the fix, exit 2
    rc, _, err = run_cli("train", "--out", straight, "--resume", "--epochs", "2")
    assert rc == 2 and err.strip().endswith(
        "the run finished its 3 epoch(s); --epochs 2 is not more: give --epochs 4 or more to extend it"
    )


def test_resume_mistakes_exit_2_with_the_fix(data, logged_run, tmp_path):
    smoke = tmp_path / "smoke"
    _train(data, "--out", smoke, "--epochs", "1", *ARGS, "--max-steps", "3")
    for argv, needle in (
        (["--out", smoke, "--resume", "--epochs", "2"], "the run stopped at step 3 of its 6 (--epochs 1): finish it"),
        (
            ["--out", smoke, "--resume", "--batch-size", "4"],
            "resuming needs the run's batch size (8 x 1 process(es), now 4 x 1): use --batch-size 8",
        ),
        (["--out", tmp_path / "none", "--resume"], "holds no run to resume (config.json is missing): give DATA"),
        (["--out", tmp_path / "none"], "DATA is missing"),
        ([data, "--out", tmp_path / "x", "--resume", "--init-from", smoke / "last.pt"], "give one"),
    ):
        rc, _, err = run_cli("train", *argv)
        assert rc == 2 and needle in err.strip().splitlines()[-1], (argv, err)


def test_init_from_loads_what_fits_and_says_what_not(data, logged_run, tmp_path):
    import torch

    from helpers import CLASSES
    from stoker.model import load_checkpoint

    three = tmp_path / "three"
    write_split(three / "train", num_samples=24, samples_per_shard=24, classes=CLASSES[:3])
    best = logged_run[0] / "best.pt"
    s, err = _train(three, "--out", tmp_path / "ft", *ARGS, "--epochs", "1", "--init-from", best)
    config = json.loads((tmp_path / "ft" / "config.json").read_text())["init_from"]
    assert config["reshaped"] == ["net.fc.weight", "net.fc.bias"] and not config["absent"]
    total = config["loaded"] + 2
    assert (
        f"weights from {best}: {config['loaded']} of {total} tensors loaded; 2 skipped, shapes differ: "
        "net.fc.weight (6, 384) -> (3, 384), net.fc.bias (6,) -> (3,)" in err
    )
    # a bare network's state_dict (torchvision's kind of file) fits by its names without "net."
    bare = tmp_path / "bare.pt"
    torch.save(load_checkpoint(best)["net"], bare)
    _, err = _train(data, "--out", tmp_path / "same", *ARGS, "--epochs", "1", "--init-from", bare)
    assert f"weights from {bare}: {total} of {total} tensors loaded" in err
    for extra, needle in (
        (["--init-from", tmp_path / "nope.pt"], f"--init-from {tmp_path / 'nope.pt'}: no such file"),
        (["--init-from", best, "--arch", "resnet18"], "most of its tensors do not fit this network (resnet18)"),
    ):
        rc, _, err = run_cli("train", data, "--out", tmp_path / "x", *ARGS, "--epochs", "1", *extra)
        assert rc == 2 and needle in err.strip().splitlines()[-1], err


def test_load_matching_copies_the_tensors_that_fit():
    import torch

    from stoker.model import build_model, with_normalize
    from stoker.model.checkpoint import load_matching

    torch.manual_seed(0)
    source = with_normalize(build_model("inception", 6))
    torch.manual_seed(1)
    target = with_normalize(build_model("inception", 3))
    match = load_matching(target, source.state_dict())
    theirs, ours = source.state_dict(), target.state_dict()
    assert match.loaded and all(torch.equal(theirs[k], ours[k]) for k in match.loaded)
    assert not torch.equal(theirs["net.fc.weight"][:3], ours["net.fc.weight"])  # the new head stays new


def test_classes_only_in_val_are_named_at_the_start(data, logged_run, tmp_path):
    lopsided = tmp_path / "lopsided"
    write_split(lopsided / "train", num_samples=4, samples_per_shard=4)  # labels 0-3: no rings, no triangles
    write_split(lopsided / "val", num_samples=12, samples_per_shard=12, seed=1)
    rc, _, err = run_cli("train", lopsided, "--out", tmp_path / "r", *ARGS, "--batch-size", "2", "--max-steps", "1")
    assert rc == 0, err
    assert (
        "stoker train: 2 class(es) have val samples but no train sample, so the run cannot learn them (their val "
        "top-1 stays 0): rings, triangles; repack so that each class keeps train samples"
    ) in err.splitlines()
    assert "no train sample" not in logged_run[1]  # every class of data/val has train samples


def test_train_help_groups_its_options():
    import argparse

    from stoker.tools import train as train_cli

    p = argparse.ArgumentParser()
    train_cli.add_arguments(p)
    groups = {g.title: [(a.option_strings or [a.dest])[0] for a in g._group_actions] for g in p._action_groups}
    assert groups["options"] == ["-h", "--out"]  # everything else sits in a titled group
    assert (
        "--epochs" in groups["epochs, batches and crops"]
        and "--lr" in groups[next(t for t in groups if t.startswith("optimisation"))]
    )
    assert {"--logger", "--max-steps", "--resume", "--init-from"} <= set(
        groups["logs, checkpoints, resuming and fine-tuning"]
    )
    assert len(groups) >= 8 and all(len(v) <= 15 for v in groups.values())


def test_a_flag_given_at_its_default_value_still_counts_as_given(tmp_path):
    from stoker.tools.cli import get_args_parser
    from stoker.tools.common.saved_run import given_flags, resume_settings, saved_settings

    parser = get_args_parser()
    args = parser.parse_args(["train", "--out", str(tmp_path), "--resume", "--epochs", "5", "--no-progress"])
    assert given_flags(args) == {"out", "resume", "epochs", "progress"}
    assert given_flags(parser.parse_args(["train", "d", "--out", "r"])) == {"out"}
    (tmp_path / "config.json").write_text(json.dumps({"requested": {"data": "d", "epochs": 1, "lr": 0.5, "out": "x"}}))
    fields, said = resume_settings(tmp_path, {"data": None, "epochs": 5, "lr": None, "out": str(tmp_path)}, {"epochs"})
    assert fields == {"data": "d", "epochs": 5, "lr": 0.5, "out": str(tmp_path)}
    assert said.endswith("from the command line: --epochs 5 (was 1)")
    # a config.json written before "requested": the resolved values' requests
    old = {
        "arch": "inception",
        "arch_requested": "auto",
        "amp": "off",
        "amp_requested": "auto",
        "num_classes": 6,
        "classes": ["a"] * 6,
        "device": "cpu",
    }
    assert saved_settings(old) | {"classes": None} == {
        "arch": "auto",
        "arch_requested": "auto",
        "amp": "auto",
        "amp_requested": "auto",
        "num_classes": None,
        "classes": None,
        "device": "auto",
    }


def test_step_lines_only_where_no_bar_is_drawn():
    import io

    from stoker.model.train.logs import shows_progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    assert shows_progress_bar(True, Terminal()) and not shows_progress_bar(False, Terminal())
    assert not shows_progress_bar(True, io.StringIO())  # a file: the plain lines instead


def test_overwrite_removes_the_logs_of_the_run_it_replaces(data, logged_run, tmp_path):
    run = _copy(logged_run[0], tmp_path / "run")
    _train(data, "--out", run, *ARGS, "--epochs", "1", "--max-steps", "2", "--overwrite")
    assert not (run / "metrics.csv").exists() and not list(run.glob("events.out.tfevents.*"))
    console = (run / "console.log").read_text()
    assert "step 2/2" in console and "step 6/6" not in console  # the new run's lines only


def test_the_val_only_scan_is_bounded(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from helpers import CLASSES
    from stoker.model.train import data as run_data
    from stoker.pipeline.shards.samples import open_split

    write_split(tmp_path / "train", num_samples=4, samples_per_shard=4)  # classes 0-3
    write_split(tmp_path / "val", num_samples=6, samples_per_shard=6, seed=1)  # classes 0-5
    train, val = (SimpleNamespace(index=open_split(tmp_path / s), cache=None) for s in ("train", "val"))
    assert run_data.classes_only_in_val(train, val, list(CLASSES)) == ["rings", "triangles"]
    monkeypatch.setattr(run_data, "MAX_LABEL_SCAN", 2)  # past the bound nothing is proven: nothing said
    assert run_data.classes_only_in_val(train, val, list(CLASSES)) == []


def test_resume_of_a_run_without_a_checkpoint_says_how_to_start_it(data, tmp_path):
    (tmp_path / "r").mkdir()
    rc, _, err = run_cli("train", data, "--out", tmp_path / "r", *ARGS, "--resume")
    assert rc == 2 and err.strip().splitlines()[-1] == (
        f"stoker train: error: {tmp_path / 'r' / 'last.pt'}: no such checkpoint, so nothing to resume: start the run "
        f"without --resume (--overwrite replaces what {tmp_path / 'r'} holds)"
    )
