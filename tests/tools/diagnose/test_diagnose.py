"""``stoker diagnose``'s measurements and what it makes of them, on stand-in loaders and models:
the verdict (which stage bounds), the figures and their trust, the ranked next steps, the batch
that fits. The command itself: test_diagnose_command.py."""

import json
import time

import pytest
import torch
from torch import nn

from stoker.model.audit import audit_model
from stoker.tools.diagnose.engine import run_diagnosis
from stoker.tools.diagnose.measure import measure_loader, measure_transfer
from stoker.tools.diagnose.report import judge, next_steps
from stoker.tools.diagnose.text import format_report


class SlowLoader:
    """A loader that sleeps before every batch: deliberately the bottleneck."""

    def __init__(self, *, batch=4, crop=16, batches=4, sleep=0.0):
        self.batch, self.crop, self.batches, self.sleep = batch, crop, batches, sleep
        self.epochs = []
        g = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (batch, 3, crop, crop), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (batch,), generator=g)

    def set_epoch(self, e):
        self.epochs.append(e)

    def __len__(self):
        return self.batches

    def __iter__(self):
        for _ in range(self.batches):
            if self.sleep:
                time.sleep(self.sleep)
            yield self.images, self.labels


def light_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 10))


def heavy_model():
    # ~0.2 GFLOP forward per 16x16 image: a few images/s on a CPU core.
    return nn.Sequential(
        nn.Conv2d(3, 192, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(192, 192, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(192, 192, 3, padding=1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(192, 10),
    )


FIGURES = ("images_per_s",)


def _run(loader, model, **kw):
    # A budget large enough for every figure (the default, 12x seconds, may skip some on a busy machine).
    kw = {"batch_size": 4, "crop": 16, "device": "cpu", "seconds": 0.3, "warmup_batches": 1, "budget_s": 60, **kw}
    return run_diagnosis(loader, model, **kw)


def test_slow_loader_is_loader_bound():
    rep = _run(SlowLoader(sleep=0.25), light_model(), channels_last="off")
    v = rep["verdict"]
    assert v["label"] == "loader-bound"
    assert v["stages"]["loader"] <= 16  # 4 images per 0.25 s sleep
    assert v["ratio"] == pytest.approx(v["stages"]["model"] / v["stages"]["loader"])
    # The model idles waiting for batches end to end.
    assert rep["end_to_end"]["data_wait_fraction"] > 0.5
    assert "loader-bound" in format_report(rep)


def test_heavy_model_is_model_bound_and_batch_size_is_measured():
    rep = _run(SlowLoader(), heavy_model())
    v = rep["verdict"]
    assert v["label"] == "model-bound"
    assert v["ratio"] == pytest.approx(v["stages"]["loader"] / v["stages"]["model"])
    assert rep["end_to_end"]["data_wait_fraction"] < 0.5
    # Conv model: channels_last measured; no native bf16 here: AMP skipped with the reason (or measured).
    assert rep["model"]["channels_last"]["images_per_s"] > 0
    assert rep["model"]["fp32_batch_x2"]["batch_size"] == 8
    assert "AMP" in format_report(rep)
    ids = [s["id"] for s in rep["next_steps"] + rep["not_helping"]]
    assert "channels_last" in ids and "batch_size" in ids


def test_report_is_json_with_every_figure():
    rep = _run(SlowLoader(sleep=0.01), light_model(), amp="bf16")
    d = json.loads(json.dumps(rep))
    for key in (
        "environment",
        "settings",
        "loader",
        "model",
        "end_to_end",
        "transfer",
        "audit",
        "verdict",
        "next_steps",
        "not_helping",
    ):
        assert key in d
    assert d["loader"]["images_per_s"] > 0 and d["loader"]["batch_shape"] == [4, 3, 16, 16]
    assert d["model"]["fp32"]["images_per_s"] > 0
    assert d["model"]["amp"]["images_per_s"] > 0 and d["model"]["amp"]["amp"] == "bf16"
    assert d["model"]["channels_last"]["applies"] is False  # no convolutions
    assert 0 <= d["end_to_end"]["data_wait_fraction"] <= 1
    assert d["transfer"]["bytes_uint8"] == 4 * 3 * 16 * 16
    assert d["transfer"]["bytes_float32"] == 4 * d["transfer"]["bytes_uint8"]
    assert d["audit"]["total_params"] == 3 * 16 * 16 * 10 + 10
    env = d["environment"]
    assert env["torch"] == torch.__version__ and env["cpu_count"] >= 1
    assert isinstance(env["pillow"]["simd"], bool) and "gpu" in env


def test_measure_loader_runs_over_epochs():
    loader = SlowLoader(batches=2)
    r = measure_loader(loader, seconds=0.05, warmup_batches=3)
    assert r["images"] == 4 * r["batches"] and r["images_per_s"] > 0
    assert loader.epochs[:1] == [1]  # warm-up alone needs a second epoch
    assert loader.epochs == list(range(1, len(loader.epochs) + 1))
    with pytest.raises(ValueError, match="seconds"):
        measure_loader(loader, seconds=0)


class _Resumable(SlowLoader):
    """Like stoker's Loader: iterating again continues a half-read epoch."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.epoch, self.position = 0, 0

    def set_epoch(self, e):
        super().set_epoch(e)
        if e != self.epoch:
            self.epoch, self.position = e, 0

    def __iter__(self):
        while self.position < self.batches:
            self.position += 1
            yield self.images, self.labels


def test_measurements_continue_a_half_read_epoch_then_go_on():
    loader = _Resumable(batches=3)
    it = iter(loader)
    for _ in range(3):  # read to the end without finishing the generator: nothing left in epoch 0
        next(it)
    r = measure_loader(loader, seconds=0.01, warmup_batches=4)
    assert r["batches"] >= 1 and loader.epochs[:2] == [1, 2]


def test_transfer_bytes_on_cpu():
    t = measure_transfer([64, 3, 224, 224], device="cpu")
    assert t["bytes_uint8"] == 64 * 3 * 224 * 224 == t["bytes_float32"] // 4
    assert t["applies"] is False and t["uint8_images_per_s"] is None


def test_transfer_bound_verdict():
    v = judge({"loader": 900.0, "model": 1200.0, "transfer": 300.0}, {"images_per_s": 280.0, "data_wait_fraction": 0.7})
    assert v["label"] == "transfer-bound" and v["next"] == "loader"
    assert v["ratio"] == pytest.approx(3.0)
    v = judge({"loader": 100.0, "model": 105.0}, {"images_per_s": 90.0, "data_wait_fraction": 0.3})
    assert v["balanced"] and "balanced" in v["text"]
    assert v["consistent"]
    # Loader-bound on paper, but end to end the model hardly ever waits: say so.
    v = judge({"loader": 500.0, "model": 900.0}, {"images_per_s": 150.0, "data_wait_fraction": 0.03})
    assert v["label"] == "loader-bound" and v["consistent"] is False and "Caution" in v["text"]


def _report_net():
    from stoker.model.nets import build_model

    return build_model("report", 1)


def test_report_network_flatten_head_step_and_flag():
    net = _report_net()
    audit = audit_model(net, input_size=(3, 224, 224))
    stages = {"loader": 850.0, "model": 120.0}
    model_r = {
        "fp32": {"images_per_s": 120.0},
        "amp": {"images_per_s": 300.0},
        "channels_last": {"images_per_s": 90.0},
        "fp32_batch_x2": {"images_per_s": 130.0},
    }
    transfer = {"applies": False}
    steps, others = next_steps(stages, model_r, transfer, audit, 64, torch.device("cuda"), "bf16", [], [])
    # The stem (estimated, ~16x on the model) would move the bound to the loader: 850/120.
    assert [s["id"] for s in steps][:3] == ["stem", "amp", "batch_size"]
    assert steps[0]["est_speedup"] == pytest.approx(850 / 120) and steps[0]["rank"] == 1
    assert steps[1]["est_speedup"] == pytest.approx(2.5) and "bfloat16" in steps[1]["action"]
    head = next(s for s in steps + others if s["id"] == "flatten_head")
    assert "301,057" in head["title"] and "61%" in head["title"] and not head["measured"]
    assert "AdaptiveAvgPool2d" in head["action"]
    stem = next(s for s in steps if s["id"] == "stem")
    assert 10 < stem["stage_speedup"] <= 16 and not stem["measured"]
    assert "224x224" in stem["title"]
    cl = next(s for s in others if s["id"] == "channels_last")
    assert cl["stage_speedup"] == pytest.approx(0.75)
    # Loader-side hints only pay up to the model's rate.
    steps, _ = next_steps(
        {"loader": 100.0, "model": 150.0},
        {"fp32": {"images_per_s": 150.0}},
        transfer,
        audit,
        64,
        torch.device("cpu"),
        None,
        [],
        [{"id": "pack_smaller", "title": "t", "action": "a", "est_loader_speedup": 3.0, "basis": "b"}],
    )
    assert steps[0]["id"] == "pack_smaller" and steps[0]["est_speedup"] == pytest.approx(1.5)


def test_uint8_transfer_step_when_float_batches_cross_the_bus():
    audit = audit_model(light_model(), input_size=(3, 16, 16))
    transfer = {
        "applies": True,
        "loader_dtype": "float32",
        "uint8_images_per_s": 4000.0,
        "float32_images_per_s": 1000.0,
    }

    def steps_with(alternatives: list) -> list:
        rates = {"loader": 2000.0, "model": 3000.0, "transfer": 1000.0}
        model = {"fp32": {"images_per_s": 3000.0}}
        return next_steps(rates, model, transfer, audit, 64, torch.device("cuda"), None, alternatives, [])[0]

    steps = steps_with([])
    assert steps[0]["id"] == "uint8_transfer" and steps[0]["est_speedup"] == pytest.approx(2.0)
    # stoker's Loader yields uint8 already on the GPU: no bus stage left, the model bounds.
    alt = [
        {
            "id": "pack",
            "title": "stoker pack",
            "action": "stoker pack SRC OUT",
            "result": {"images_per_s": 5000.0, "device": "cuda:0"},
        }
    ]
    steps = steps_with(alt)
    assert [s["id"] for s in steps] == ["pack", "uint8_transfer"]
    assert steps[0]["est_speedup"] == pytest.approx(3.0) and steps[0]["measured"]


@pytest.mark.parametrize("kw", [dict(amp="fp8"), dict(channels_last="yes"), dict(seconds=0), dict(batch_size=0)])
def test_run_diagnosis_validates(kw):
    with pytest.raises(ValueError):
        _run(SlowLoader(), light_model(), **kw)


# ----------------------------------------------------------------- issue 23: the figures tell the truth


class SleepyModel(nn.Module):
    """A model whose step costs ``sleep`` seconds whatever the batch: 2x the batch is 2x the images/s."""

    def __init__(self, sleep):
        super().__init__()
        self.sleep = sleep
        self.lin = nn.Linear(3 * 16 * 16, 10)

    def forward(self, x):
        time.sleep(self.sleep)
        return self.lin(x.flatten(1))


class JitteryLoader(SlowLoader):
    """Fast for 0.2 s, then 25x slower for 0.2 s, over and over: the rate swings on the scale of a window
    (measured for 0.4 s, windows are 0.1 s: some fall in a fast phase, some in a slow one)."""

    def __iter__(self):
        for _ in range(self.batches):
            time.sleep(0.002 if int(time.perf_counter() / 0.2) % 2 == 0 else 0.05)
            yield self.images, self.labels


def _claims(rep):
    """Every speed-up number the report gives."""
    return [c for c in rep["next_steps"] + rep["not_helping"] if c.get("est_speedup") is not None]


def test_each_figure_gets_the_minimum_steps_and_a_spread():
    from stoker.tools.diagnose.measure import MIN_STEPS

    # 0.03 s holds three 0.01 s batches: the measurement goes on to the minimum number of batches.
    r = measure_loader(SlowLoader(sleep=0.01, batches=50), seconds=0.03, warmup_batches=1)
    assert r["batches"] >= MIN_STEPS and r["trust"] != "few"  # (a busy machine may make it noisy)
    assert len(r["windows_images_per_s"]) >= 2 and r["spread"] is not None and r["spread"] >= 0


@pytest.mark.parametrize("case", ["slow_model", "slow_loader"])
def test_one_or_two_steps_give_no_speed_up_claim(case):
    if case == "slow_model":
        # 0.25 s a step, 0.1 s a measurement: one timed step each; batch x2 would claim 2x on that.
        rep = _run(SlowLoader(batches=50), SleepyModel(0.25), seconds=0.1, amp="off")
        assert rep["verdict"]["bound"] == "model"
        assert rep["model"]["fp32"]["steps"] <= 2 and rep["model"]["fp32"]["trust"] == "few"
    else:
        # 0.3 s a batch, against a fast alternative loader (as after stoker pack) that would claim ~100x.
        alt = {"id": "pack", "title": "stoker pack", "action": "stoker pack SRC OUT", "loader": SlowLoader(batches=50)}
        rep = _run(SlowLoader(sleep=0.3, batches=50), light_model(), seconds=0.1, amp="off", alternatives=[alt])
        assert rep["verdict"]["bound"] == "loader" and rep["loader"]["trust"] == "few"
    assert rep["verdict"]["reliable"] is False
    assert rep["next_steps"] == [] and _claims(rep) == []
    text = format_report(rep)
    assert "too few steps" in text and "not settled" in text
    assert "next steps, by estimated" not in text


def test_jittery_loader_is_flagged_noisy():
    # A loader that sleeps the same before every batch is steady (sleeping needs no CPU: a busy machine agrees).
    steady = measure_loader(SlowLoader(sleep=0.02, batches=500), seconds=0.4, warmup_batches=1)
    assert steady["trust"] == "ok", steady
    r = measure_loader(JitteryLoader(batches=500), seconds=0.4, warmup_batches=1)
    assert r["trust"] == "noisy" and r["spread"] > 0.25 and "±" in r["caveat"]
    rep = _run(JitteryLoader(batches=500), light_model(), seconds=0.4, amp="off", channels_last="off")
    assert rep["loader"]["trust"] == "noisy" and rep["verdict"]["reliable"] is False
    assert rep["next_steps"] == [] and _claims(rep) == []
    text = format_report(rep)
    assert "noisy" in text and "loader alone" in text


def test_run_budget_skips_extra_figures_and_says_so():
    # A budget the two figures the verdict needs already spend: the extra model variants are skipped, with why.
    rep = _run(SlowLoader(batches=50), SleepyModel(0.05), seconds=0.2, amp="bf16", budget_s=0.1)
    assert rep["model"]["fp32"]["images_per_s"] > 0 and rep["end_to_end"]["images_per_s"] > 0
    assert rep["model"]["amp"].get("images_per_s") is None
    assert "time budget" in rep["model"]["amp"]["why"]
    assert "time budget" in format_report(rep)


def test_a_slow_model_says_how_long_the_run_takes_and_what_settles_it():
    # a step of 0.3 s at --seconds 0.1: the promise (1.2 s) cannot hold, and 1 timed step a figure is too few
    from stoker.tools.diagnose.engine import settle_seconds, slow_model_line

    said = []
    t0 = time.perf_counter()
    rep = _run(SlowLoader(batches=50), SleepyModel(0.3), seconds=0.1, budget_s=None, progress=said.append)
    wall = time.perf_counter() - t0
    step = rep["model"]["fp32"]["step_ms"] / 1000
    line = next(x for x in said if x.startswith("the model takes "))
    assert line.startswith(f"the model takes {step:.1f} s a step on cpu: this run takes about ")
    total = float(line.split("this run takes about ")[1].split(" s")[0])
    assert 0.5 * wall <= total <= 1.5 * wall  # what it says is what it took
    need = settle_seconds(step)  # 5 steps of 0.3 s by 3x --seconds: 0.5 s
    assert need == settle_seconds(0.3) == 0.5 or step > 0.3
    assert ", past the 1 s said; 1 timed step(s) a figure are too few to advise on (5 needed)" in line
    assert f"(5 needed): --seconds {need:g} settles them (about " in line
    assert rep["settings"]["settle_seconds"] == need and rep["model"]["fp32"]["trust"] == "few"
    text = format_report(rep)
    assert f"next steps: none ranked until the figures are settled (--seconds {need:g} settles the model's)" in text
    # a model that keeps the promise (5 steps in 3x --seconds): no such line
    fast = {"step_ms": 1000.0, "trust": "ok", "steps": 9}
    assert slow_model_line(fast, seconds=5, warm=2, elapsed=10, budget=60, device="cpu") == ""
    slow = slow_model_line(fast | {"step_ms": 9000.0}, seconds=5, warm=1, elapsed=20, budget=60, device="cpu")
    assert slow == "the model takes 9.0 s a step on cpu: this run takes about 40 s"  # 20 + 9 warm + 9 timed + 2 bus


@pytest.mark.parametrize("native", [True, False])
def test_amp_auto_advice_agrees_with_training(monkeypatch, native):
    from stoker.model.train import resolve_amp, runtime

    monkeypatch.setattr(runtime, "cpu_bf16", lambda: native)
    train_amp = resolve_amp("auto", torch.device("cpu"))  # what `stoker train --amp auto` does
    assert train_amp.name == ("bf16" if native else "off")

    def amp_steps(rep):
        return [c for c in rep["next_steps"] + rep["not_helping"] if c["id"].startswith("amp")]

    rep = _run(SlowLoader(batches=50), light_model(), seconds=0.1, amp="auto", channels_last="off")
    assert rep["settings"]["amp_measured"] == (train_amp.name if train_amp.enabled else None)
    if native:
        (step,) = amp_steps(rep)
        assert "stoker train --amp bf16 (the default, --amp auto, picks bf16 on this device)" in step["action"]
    else:
        assert amp_steps(rep) == [] and "Train with AMP" not in format_report(rep)
        assert "--amp bf16 measures it" in rep["model"]["amp"]["why"]
        # Asked for explicitly, bf16 is measured and advised as --amp bf16, never as what auto does.
        rep = _run(SlowLoader(batches=50), light_model(), seconds=0.1, amp="bf16", channels_last="off")
        (step,) = amp_steps(rep)
        assert "stoker train --amp bf16 (the default, --amp auto, leaves it off on this device)" in step["action"]
        assert "picks bf16" not in format_report(rep)


def test_synthetic_targets_have_each_tasks_kind():
    from stoker.model.train.tasks import Task
    from stoker.tools.diagnose.measure import synthetic_targets

    gen = torch.Generator().manual_seed(0)
    seg = synthetic_targets(Task("segment", 5, "miou", ignore_index=255), 3, 8, gen)
    assert seg.shape == (3, 8, 8) and seg.dtype == torch.uint8 and int(seg.max()) < 5
    reg = synthetic_targets(Task("regress", 2, "r2"), 3, 8, gen)
    assert reg.shape == (3, 2) and reg.dtype == torch.float32
    ml = synthetic_targets(Task("multilabel", 6, "map"), 3, 8, gen)
    assert ml.shape == (3, 6) and set(ml.unique().tolist()) <= {0.0, 1.0}
    assert synthetic_targets(None, 3, 8, gen).dtype == torch.int64


def test_fit_batch_keeps_a_batch_that_fits():
    from stoker.tools.diagnose.sizing import fit_batch

    fit = fit_batch(light_model(), 8, crop=16, device="cpu", memory=8_000_000_000, step_limit_s=10)
    assert fit.batch == 8 and fit.why is None and fit.per_sample > 0


def test_fit_batch_never_measures_a_batch_of_one():
    # a ResNet at crop 32 ends in 1x1 maps, where BatchNorm refuses a training batch of 1: a step
    # budget too short for even one sample still measures at the probes' batch of 2
    from torchvision.models import resnet18

    from stoker.tools.diagnose.sizing import fit_batch

    fit = fit_batch(resnet18(num_classes=10), 8, crop=32, device="cpu", memory=8_000_000_000, step_limit_s=1e-6)
    assert fit.batch == 2 and "measuring at batch 2" in fit.why
