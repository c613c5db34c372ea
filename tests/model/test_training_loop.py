"""The training loop against a fake Loader (same interface, synthetic uint8 batches)."""

import json
import math
import os
import signal
import sys

import pytest
import torch
from fake_loader import factory

from helpers import run_in_group, write_split
from stoker.errors import ArgumentError, CheckpointError
from stoker.model import build_model, load_checkpoint, with_normalize
from stoker.model.checkpoint import weights_digest
from stoker.model.train import TrainConfig, lr_factor, resolve_amp, train


@pytest.fixture(autouse=True)
def one_thread():
    # 2 cores shared with other work: one intra-op thread is several times faster than two.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def data(tmp_path):
    root = tmp_path / "data"
    (root / "train").mkdir(parents=True)
    (root / "val").mkdir()
    return root


def _cfg(data, out, **kw):
    base = dict(
        data=str(data),
        out=str(out),
        epochs=2,
        batch_size=8,
        crop=24,
        num_classes=6,
        log_every=2,
        progress=False,
        seed=0,
    )
    return TrainConfig(**{**base, **kw})


def _weights(path):
    return load_checkpoint(path)["model"]


def test_train_writes_run_and_learns(data, tmp_path):
    out = tmp_path / "run"
    s = train(_cfg(data, out, epochs=3, plot=True), loader_factory=factory())
    assert s["steps"] == s["total_steps"] == 3 * 6 and s["interrupted"] is None
    cfg = json.loads((out / "config.json").read_text())
    auto = resolve_amp("auto", "cpu").name  # bf16 on a CPU with native bf16, else off
    assert cfg["amp"] == auto and cfg["device"] == "cpu" and cfg["steps_per_epoch"] == 6 and cfg["lr"] > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tr = [r for r in rows if r["kind"] == "train"]
    va = [r for r in rows if r["kind"] == "val"]
    assert [r["step"] for r in tr] == [2, 4, 6, 8, 10, 12, 14, 16, 18]
    assert all(r["images_per_s"] > 0 and 0 <= r["data_wait"] <= 1 and math.isfinite(r["loss"]) for r in tr)
    assert [r["epoch"] for r in va] == [0, 1, 2] and all(r["n"] == 48 for r in va)
    # lr: warm-up over epoch 1 capped at a quarter of the run (4 of 18 steps), then cosine down to 0
    lrs = [r["lr"] for r in tr]
    assert cfg["warmup_steps"] == 4 and lrs[0] < lrs[1] == pytest.approx(cfg["lr"])
    assert lrs[-1] == pytest.approx(0.0, abs=1e-12)
    assert s["val_top1"] > 0.4 and s["val_top5"] >= s["val_top1"]  # chance is 1/6
    assert s["val_samples"] == 48
    assert (out / "last.pt").exists() and (out / "best.pt").exists() and (out / "curves.png").stat().st_size > 1000
    ck = load_checkpoint(out / "last.pt", arch="inception", num_outputs=6)
    assert ck["step"] == 18 and ck["epoch_complete"] and ck["loader"] is None
    m = with_normalize(build_model("inception", 6))
    m.load_state_dict(ck["model"])
    assert weights_digest(m) == s["weights_sha256"]


def test_bf16_autocast_runs_on_cpu(data, tmp_path):
    spec = resolve_amp("bf16", torch.device("cpu"))
    conv = torch.nn.Conv2d(3, 4, 3)
    with torch.autocast("cpu", dtype=spec.dtype, enabled=spec.enabled):
        assert conv(torch.randn(1, 3, 8, 8)).dtype == torch.bfloat16
    s = train(_cfg(data, tmp_path / "run", epochs=1, amp="bf16", channels_last=True), loader_factory=factory())
    assert s["amp"] == "bf16" and math.isfinite(s["train_loss"]) and s["val_samples"] == 48


def test_fp16_uses_grad_scaler(data, tmp_path):
    s = train(_cfg(data, tmp_path / "run", epochs=1, amp="fp16", optimizer="adamw"), loader_factory=factory())
    assert s["amp"] == "fp16" and math.isfinite(s["train_loss"])
    assert load_checkpoint(tmp_path / "run" / "last.pt")["scaler"]["scale"] > 0


def test_amp_auto_on_cpu_follows_native_bf16_and_bad_values_named(monkeypatch):
    from stoker.model.train import runtime

    monkeypatch.setattr(runtime, "cpu_bf16", lambda: False)
    assert resolve_amp("auto", torch.device("cpu")).name == "off"
    monkeypatch.setattr(runtime, "cpu_bf16", lambda: True)
    spec = resolve_amp("auto", torch.device("cpu"))
    assert spec.name == "bf16" and spec.dtype == torch.bfloat16 and "native bf16" in spec.why
    assert resolve_amp("auto", torch.device("cpu"), native_cpu_bf16=False).name == "off"
    with pytest.raises(ValueError, match="amp='fp8'"):
        resolve_amp("fp8", torch.device("cpu"))


def test_regress_task(data, tmp_path):
    s = train(_cfg(data, tmp_path / "run", epochs=1, task="regress", lr=0.01), loader_factory=factory())
    assert s["val_top5"] is None and math.isfinite(s["val_loss"])
    assert load_checkpoint(tmp_path / "run" / "last.pt")["model"]["net.fc.weight"].shape[0] == 1


# SIGTERM (a cluster's preemption) with resume="auto" from the start: the resubmitted job's config is the same
@pytest.mark.parametrize("signum, first, then", [(signal.SIGTERM, "auto", "auto"), (signal.SIGINT, None, "last")])
def test_signal_checkpoints_mid_epoch_and_resume_is_exact(data, tmp_path, signum, first, then):
    full = train(_cfg(data, tmp_path / "full", deterministic=True), loader_factory=factory())
    out = tmp_path / "cut"
    s = train(_cfg(data, out, deterministic=True, resume=first), loader_factory=factory(signal_at=8, signum=signum))
    assert s["interrupted"] == signal.Signals(signum).name and s["steps"] == 8  # epoch 2, batch 2 of 6
    ck = load_checkpoint(out / "last.pt")
    assert ck["step"] == 8 and not ck["epoch_complete"] and ck["loader"]["position"] == 2
    assert signal.getsignal(signum) is not None  # handlers were restored
    r = train(_cfg(data, out, deterministic=True, resume=then), loader_factory=factory())
    assert r["steps"] == 12 and r["interrupted"] is None
    assert r["weights_sha256"] == full["weights_sha256"]
    a, b = _weights(tmp_path / "full" / "last.pt"), _weights(out / "last.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_other_arch_and_other_batch_size(data, tmp_path):
    out = tmp_path / "run"
    train(_cfg(data, out, epochs=1), loader_factory=factory())
    with pytest.raises(CheckpointError, match="arch 'inception', this run uses 'resnet18'"):
        train(_cfg(data, out, epochs=1, arch="resnet18", resume="auto"), loader_factory=factory())
    with pytest.raises(ArgumentError, match="needs the run's batch size .*use batch_size=8"):
        train(_cfg(data, out, epochs=1, batch_size=4, resume="auto"), loader_factory=factory())
    with pytest.raises(ArgumentError, match="no such checkpoint, so nothing to resume: start the run without resume"):
        train(_cfg(data, tmp_path / "empty", epochs=1, resume="last"), loader_factory=factory())


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(epochs=0), "epochs=0"),
        (dict(optimizer="lamb"), "optimizer='lamb'"),
        (dict(task="keypoints"), "task='keypoints'"),
        (dict(lr=-1.0), "lr=-1.0"),
        (dict(label_smoothing=1.0), "label_smoothing=1.0"),
    ],
)
def test_bad_config_named(data, tmp_path, kw, name):
    with pytest.raises(ValueError, match=name.replace("(", r"\(")):
        train(_cfg(data, tmp_path / "run", **kw), loader_factory=factory())


def test_lr_schedule_shape():
    f = [lr_factor(s, warmup_steps=4, total_steps=20) for s in range(20)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(f[4:], f[5:], strict=False)) and f[-1] > 0
    assert lr_factor(20, warmup_steps=4, total_steps=20) == pytest.approx(0.0)
    assert lr_factor(0, warmup_steps=0, total_steps=10) == 1.0


DDP_SCRIPT = """
import json, os
from stoker.model.train import train
s = train(dict(data={data!r}, out={out!r}, epochs=2, batch_size=4, crop=16, log_every=3, progress=False,
               ckpt_every=4, threads=1))
with open(os.path.join({out!r}, "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(s, f)
"""


@pytest.mark.slow
def test_ddp_two_ranks_gloo_keep_identical_weights(tmp_path, fast_launchers):
    """torchrun, 2 processes, gloo, the real Loader: same weights on both ranks, val counted once."""
    data = tmp_path / "data"
    write_split(data / "train", num_samples=37, samples_per_shard=16)
    write_split(data / "val", num_samples=37, samples_per_shard=16, seed=1)
    out = tmp_path / "ddp"
    script = tmp_path / "ddp_train.py"
    script.write_text(DDP_SCRIPT.format(data=str(data), out=str(out)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = run_in_group(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)],
        env=env,
        timeout=240,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    r0, r1 = (json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2
    assert r0["weights_sha256"] == r1["weights_sha256"]
    # 37 train samples: 18 per rank -> 4 steps of 4 (drop_last) per epoch; val: 19 + 18 = all 37 exactly once
    assert r0["steps"] == 8 and r0["val_samples"] == r1["val_samples"] == 37
    assert r0["val_top1"] == r1["val_top1"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["world_size"] == 2 and cfg["global_batch"] == 8
    ck = load_checkpoint(out / "last.pt")
    m = with_normalize(build_model("inception", 6))
    m.load_state_dict(ck["model"])
    assert weights_digest(m) == r0["weights_sha256"]  # rank 0 wrote what both ranks hold
    torch.manual_seed(0)  # the run's seed: these are its initial weights
    m0 = with_normalize(build_model("inception", 6))
    assert weights_digest(m0) != r0["weights_sha256"]  # and it trained
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(set(lines))  # one writer: no duplicated rows
