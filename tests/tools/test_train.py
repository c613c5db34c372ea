"""`stoker train` end to end on tiny shards with the real Loader: run files, kill -9 + --resume, refusals."""

import contextlib
import io
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from helpers import write_split
from stoker.model import load_checkpoint
from stoker.model.train.runtime import resolve_amp
from stoker.tools.cli import main as cli

ARGS = [
    "--epochs",
    "2",
    "--batch-size",
    "8",
    "--crop",
    "32",
    "--log-every",
    "2",
    "--ckpt-every",
    "4",
    "--deterministic",
    "--no-progress",
    "--json",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("train") / "data"
    write_split(root / "train", num_samples=48, samples_per_shard=16)  # 6 steps per epoch
    write_split(root / "val", num_samples=21, samples_per_shard=16, seed=1)
    return root


@pytest.fixture(scope="module")
def full_run(data):
    """One uninterrupted run (in-process), shared by the tests below."""
    run = data.parent / "full"
    return run, _in_process(["train", str(data), "--out", str(run), "--plot", *ARGS])


def _in_process(argv):
    out = io.StringIO()
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # what the subprocesses use (OMP_NUM_THREADS=1): same arithmetic, and faster here
    try:
        with contextlib.redirect_stdout(out):
            rc = cli(argv)
    finally:
        torch.set_num_threads(n)
    assert rc == 0
    return json.loads(out.getvalue())


def _env(**extra):
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


def _stoker(*args, **env):
    return subprocess.run(
        [sys.executable, "-m", "stoker.tools.cli", *args], env=_env(**env), capture_output=True, text=True, timeout=300
    )


def test_end_to_end_writes_config_metrics_checkpoints(data, full_run):
    run, s = full_run
    assert s["steps"] == 12 and s["interrupted"] is None and s["val_samples"] == 21
    assert s["images_per_s"] > 0 and 0 <= s["data_wait"] <= 1
    cfg = json.loads((run / "config.json").read_text())
    auto = resolve_amp("auto", "cpu").name  # bf16 on a CPU with native bf16, else off
    assert cfg["arch"] == "inception" and cfg["num_classes"] == 6 and cfg["amp"] == auto
    assert cfg["classes"][0] == "circles" and cfg["steps_per_epoch"] == 6 and cfg["deterministic"] is True
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows} == {"train", "val"}
    assert [r["n"] for r in rows if r["kind"] == "val"] == [21, 21]
    assert all(k in rows[0] for k in ("step", "images_per_s", "data_wait", "loss", "lr"))
    last = load_checkpoint(run / "last.pt", arch="inception", num_outputs=6)
    assert (
        last["step"] == 12
        and last["epoch_complete"]
        and set(last) >= {"model", "optimizer", "scaler", "scheduler", "loader", "rng", "config", "epoch", "step"}
    )
    assert (run / "best.pt").exists() and (run / "curves.png").stat().st_size > 1000


# A real `kill -9` at a known point: the 10th training batch handed out (steps 1-9 done, the
# last checkpoint at step 8 = epoch 2, batch 2 of 6; step 9 is lost). The kill comes from a
# loader wrapper in this test script, so the training code carries no test hook.
KILL_SCRIPT = """
import os, signal, sys
from stoker.pipeline import Loader
from stoker.tools import cli
import stoker.model.train.loop as train_loop

handed = 0

def killing_factory(path, **kw):
    loader = Loader(path, **kw)
    if not kw["train"]:
        return loader

    class Killing:
        def __getattr__(self, name):
            return getattr(loader, name)

        def __len__(self):
            return len(loader)

        def __iter__(self):
            global handed
            for batch in loader:
                handed += 1
                if handed == 10:
                    os.kill(os.getpid(), signal.SIGKILL)
                yield batch

    return Killing()

train_loop._default_loader_factory = killing_factory
sys.exit(cli.main(sys.argv[1:]))
"""


def _killed_mid_epoch(data, run, *extra):
    """`stoker train` (with ``extra`` flags) killed (-9) at step 8, mid-epoch 2; returns its last.pt."""
    p = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, "train", str(data), "--out", str(run), *ARGS, *extra],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    return load_checkpoint(run / "last.pt")


@pytest.mark.slow
def test_kill9_mid_epoch_then_resume_reaches_the_same_weights(data, full_run):
    full, s = full_run
    run = data.parent / "killed"
    ck = _killed_mid_epoch(data, run)
    assert ck["step"] == 8 and not ck["epoch_complete"] and ck["loader"]["position"] == 16
    assert not list(run.glob("*.tmp"))
    r = _in_process(["train", str(data), "--out", str(run), *ARGS, "--resume"])  # a fresh process is not needed
    assert r["steps"] == 12 and r["steps"] - 8 == 4
    assert json.loads((run / "config.json").read_text())["resumed_from"]["step"] == 8
    assert r["weights_sha256"] == s["weights_sha256"]
    a, b = load_checkpoint(full / "last.pt")["model"], load_checkpoint(run / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def _one_line_error(capsys, argv, rc):
    assert cli(argv) == rc
    err = capsys.readouterr().err.strip().splitlines()
    # one line, after the run's own notes (amp, a small epoch, val size): no traceback anywhere
    assert err and all(line.startswith("stoker train: ") for line in err), err
    return err[-1]


def test_tampered_checkpoint_is_refused(data, full_run, tmp_path, capsys):
    full, _ = full_run
    run = tmp_path / "run"
    run.mkdir()
    raw = bytearray((full / "last.pt").read_bytes())
    w = load_checkpoint(full / "last.pt")["model"]["net.fc.weight"]
    at = raw.find(w.reshape(-1)[:4].numpy().tobytes())
    raw[at + 1] ^= 0x40
    (run / "last.pt").write_bytes(bytes(raw))
    msg = _one_line_error(capsys, ["train", str(data), "--out", str(run), *ARGS, "--resume"], 1)
    assert "digest mismatch" in msg and "last.pt" in msg


def test_checkpoint_of_another_arch_is_refused(data, full_run, tmp_path, capsys):
    full, _ = full_run
    msg = _one_line_error(
        capsys,
        [
            "train",
            str(data),
            "--out",
            str(tmp_path / "r"),
            *ARGS,
            "--arch",
            "resnet18",
            "--resume-from",
            str(full / "last.pt"),
        ],
        1,
    )
    assert "arch 'inception'" in msg and "resnet18" in msg


def test_usage_errors_are_one_line(data, tmp_path, capsys):
    assert "no train/" in _one_line_error(capsys, ["train", str(tmp_path), "--out", str(tmp_path / "r")], 2)
    msg = _one_line_error(capsys, ["train", str(data), "--out", str(tmp_path / "r"), "--arch", "resnet5O"], 2)
    assert "unknown arch 'resnet5O'" in msg and "resnet50" in msg
    assert "batch_size=0" in _one_line_error(
        capsys, ["train", str(data), "--out", str(tmp_path / "r"), "--batch-size", "0"], 2
    )
    # a batch larger than the split (48 train samples): usage error naming train's own flag and the bound
    msg = _one_line_error(capsys, ["train", str(data), "--out", str(tmp_path / "r"), "--batch-size", "100"], 2)
    assert "--batch-size 100 is larger" in msg and "use --batch-size 48 or less" in msg and "drop_last" not in msg


def test_cli_choices_are_the_configs():
    import argparse

    from stoker.model.train import config
    from stoker.model.train.mix import BALANCE_CHOICES
    from stoker.pipeline.backends import DECODES, backend_names
    from stoker.pipeline.backends.decoders import DECODER_NAMES
    from stoker.tools import train as train_cli
    from stoker.tools.common.loader_flags import TRAIN_FITS, VAL_FITS

    p = argparse.ArgumentParser()
    train_cli.add_arguments(p)
    choices = {a.dest: a.choices for a in p._actions if a.choices}
    assert choices == {
        "amp": config.AMP_CHOICES,
        "optimizer": config.OPTIMIZERS,
        "task": config.TASKS,
        "shuffle": config.SHUFFLES,
        "channels": config.CHANNELS,
        "remode": config.REMODES,
        "mixup_mode": config.MIXUP_MODES,
        "backend": backend_names(),
        "decoder": DECODER_NAMES,
        "decode": DECODES,
        "balance": BALANCE_CHOICES,
        "train_fit": TRAIN_FITS,
        "val_fit": VAL_FITS,
    }


@pytest.mark.slow
def test_resume_on_another_process_count_keeps_the_global_batch(data, tmp_path, capsys, fast_launchers):
    from helpers import run_in_group

    # one process, batch 8, killed mid-epoch 2 (last.pt at step 8: epoch 2, batch 2 of 6)
    run = tmp_path / "elastic"
    ck = _killed_mid_epoch(data, run)
    assert ck["step"] == 8 and not ck["epoch_complete"]
    args = [a if a != "8" else "4" for a in ARGS]  # --batch-size 4 on 2 processes: the global batch of 8
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = run_in_group(
        [*cmd, "-m", "stoker", "train", str(data), "--out", str(run), *args, "--resume"], timeout=300, env=_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert s["world_size"] == 2 and s["steps"] == 12 and s["total_steps"] == 12 and s["val"]["n"] == 21
    config = json.loads((run / "config.json").read_text())
    assert config["resumed_from"]["world_size"] == 1 and config["global_batch"] == 8
    # back on one process with the per-process batch size kept: one line saying which to use
    capsys.readouterr()
    assert cli(["train", str(data), "--out", str(run), *args, "--resume"]) == 2  # a user's mistake: exit 2
    assert "keeps the run's global batch of 8 (4 x 2): use --batch-size 8" in capsys.readouterr().err


def test_the_timm_recipe_flags_train(data, tmp_path):
    args = [a for a in ARGS if a != "--deterministic"]
    recipe = ["--aa", "rand-m9-mstd0.5", "--mixup", "0.8", "--cutmix", "1.0", "--reprob", "0.25", "--smoothing", "0.1"]
    s = _in_process(["train", str(data), "--out", str(tmp_path / "r"), *args, "--epochs", "1", *recipe])
    assert s["steps"] == 6 and s["val"]["n"] == 21
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["aa"] == "rand-m9-mstd0.5" and config["mixup"] == 0.8 and config["label_smoothing"] == 0.1


def test_mixup_on_a_regression_split_and_a_bad_policy_are_one_line(tmp_path, capsys):
    from stoker.tools.common.synth import make_regression_csv
    from stoker.tools.pack import pack

    pack(make_regression_csv(tmp_path / "src", n=16), tmp_path / "reg", workers=1)
    base = ["train", str(tmp_path / "reg"), "--out", str(tmp_path / "r"), "--batch-size", "4", "--crop", "32"]
    msg = _one_line_error(capsys, [*base, "--mixup", "0.8"], 2)
    assert "--mixup/--cutmix mix class targets; this run's task is regress" in msg
    msg = _one_line_error(capsys, [*base, "--aa", "rand-m9-nope"], 2)
    assert "aa='rand-m9-nope'" in msg


RESOLUTION = ["--progressive", "32:64:0-1", "--val-crop", "48"]  # epoch 1 at 32 px, epoch 2 at 64; val at 48


@pytest.mark.slow
def test_progressive_resizing_from_the_pixel_tier_resumes_exactly(data, tmp_path):
    pixels = ["--pixel-cache", str(tmp_path / "px")]  # shared by both runs: the killed run's store is reused
    full = _in_process(["train", str(data), "--out", str(tmp_path / "full"), *ARGS, *RESOLUTION, *pixels])
    run = tmp_path / "killed"
    ck = _killed_mid_epoch(data, run, *RESOLUTION, *pixels)
    assert ck["step"] == 8 and ck["loader"]["crop"] == [64, 64]  # mid-epoch 2, at its crop
    r = _in_process(["train", str(data), "--out", str(run), *ARGS, *RESOLUTION, *pixels, "--resume"])
    assert r["steps"] == 12 and r["weights_sha256"] == full["weights_sha256"]
    config = json.loads((run / "config.json").read_text())
    assert config["progressive"] == "32:64:0-1" and config["val_crop"] == 48
    assert config["pixel_cache"] == str(tmp_path / "px")
    assert {p.parent.parent.name.split("-")[0] for p in (tmp_path / "px").glob("*/*/key.json")} == {"train", "val"}


def test_resolution_flags_say_the_schedule_and_refuse_nonsense(data, tmp_path, capsys):
    s = _in_process(["train", str(data), "--out", str(tmp_path / "r"), *ARGS, "--epochs", "1", *RESOLUTION])
    assert s["steps"] == 6 and s["val"]["n"] == 21
    assert "progressive resizing: train crop 32 px for epoch 1; val crop 48 px" in capsys.readouterr().err
    for extra, needle in (
        (["--progressive", "32"], "--progressive '32' must be START:END[:EPOCHS]"),
        (["--progressive", "32:64", "--arch", "report"], "--arch report's Linear layer takes one size"),
        (["--pixel-cache-budget", "1GB"], "--pixel-cache-budget needs --pixel-cache DIR"),
    ):
        assert needle in _one_line_error(capsys, ["train", str(data), "--out", str(tmp_path / "x"), *ARGS, *extra], 2)
