"""The training config without torch, and the one AMP policy (train, bench-model, diagnose)."""

import subprocess
import sys

import pytest
import torch

from stoker.model.train import AMP_CHOICES, TrainConfig, resolve_amp, runtime

NO_TORCH = """
import sys
sys.modules["torch"] = None  # any `import torch` now fails
from stoker.model.train.config import AMP_CHOICES, TrainConfig
from stoker.tools import train as train_cli  # the `stoker train` parser: no torch either
cfg = TrainConfig.from_any({"data": "d", "out": "o", "amp": "bf16", "epochs": 2, "unknown": 1})
cfg.validate()
try:
    TrainConfig(data="d", out="o", amp="fp8").validate()
except ValueError as e:
    print(e)
print(cfg.amp, cfg.epochs, AMP_CHOICES == train_cli.AMP_CHOICES, "torch" in sys.modules and sys.modules["torch"])
"""


def test_config_imports_and_validates_without_torch():
    p = subprocess.run([sys.executable, "-c", NO_TORCH], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines() == ["amp='fp8' is not one of auto, bf16, fp16, off", "bf16 2 True None"]


def test_choices_written_once():
    assert AMP_CHOICES == ("auto", "bf16", "fp16", "off")
    with pytest.raises(ValueError, match="amp='fp8' is not one of auto, bf16, fp16, off"):
        resolve_amp("fp8", "cpu")
    with pytest.raises(ValueError, match="amp='fp8' is not one of auto, bf16, fp16, off"):
        TrainConfig(data="d", out="o", amp="fp8").validate()


def test_default_lr_and_weight_decay_follow_the_optimizer():
    sgd, adamw = TrainConfig(data="d", out="o"), TrainConfig(data="d", out="o", optimizer="adamw")
    assert (sgd.peak_lr(512), sgd.resolved_weight_decay()) == (0.2, 5e-5)
    assert (adamw.peak_lr(512), adamw.resolved_weight_decay()) == (1e-3, 0.05)
    assert TrainConfig(data="d", out="o", lr=0.3, weight_decay=0.0).peak_lr(512) == 0.3


@pytest.mark.parametrize(
    "native, name, why",
    [
        (True, "bf16", "auto: the CPU has native bf16 (AMX/AVX512-BF16)"),
        (False, "off", "auto: off on a CPU without native bf16 (AVX512-BF16/AMX), where bf16 runs many times slower"),
    ],
)
def test_auto_amp_on_cpu_train_vs_diagnose_policy(monkeypatch, native, name, why):
    # One rule: `stoker train --amp auto` does on this CPU what `stoker diagnose` measures and advises.
    from stoker.tools.diagnose.engine import resolve_amp as diagnose_amp

    monkeypatch.setattr(runtime, "cpu_bf16", lambda: native)
    train_spec = resolve_amp("auto", torch.device("cpu"))
    assert (train_spec.name, train_spec.enabled, train_spec.why) == (name, name != "off", why)
    assert train_spec.dtype == (torch.bfloat16 if native else torch.float32)
    measured, _ = diagnose_amp("auto", torch.device("cpu"))
    assert measured == (name if native else None)
    # The opt-out keeps auto off on any CPU.
    assert resolve_amp("auto", "cpu", native_cpu_bf16=False).name == "off"


def test_explicit_amp_is_taken_as_asked():
    for amp, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("off", torch.float32)):
        spec = resolve_amp(amp, "cpu", native_cpu_bf16=True)
        assert (spec.name, spec.dtype, spec.enabled, spec.why) == (amp, dtype, amp != "off", f"--amp {amp}")


@pytest.mark.parametrize("package", ["stoker.model", "stoker.model.train"])
def test_every_public_name_resolves_and_nothing_else(package):
    import importlib

    mod = importlib.import_module(package)
    assert sorted(mod.__all__) == sorted(mod._EXPORTS)
    assert all(getattr(mod, name) is not None for name in mod.__all__)
    for internal in ("run_training", "ReportNet", "weights_digest", "_Run"):
        assert not hasattr(mod, internal), internal


@pytest.mark.parametrize(
    "major, minor, expected",
    [(7, 5, "fp16"), (7, 0, "fp16"), (8, 0, "bf16"), (8, 6, "bf16"), (9, 0, "bf16")],
)
def test_auto_amp_is_bf16_only_where_the_gpu_computes_it_natively(monkeypatch, major, minor, expected):
    # torch.cuda.is_bf16_supported() says True on a Turing card (emulation): auto must not trust it
    from types import SimpleNamespace

    card = SimpleNamespace(name="NVIDIA GeForce RTX 2070" if major < 8 else "NVIDIA A100", major=major, minor=minor)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: card)
    spec = resolve_amp("auto", torch.device("cuda", 0))
    assert spec.name == expected and spec.device_type == "cuda"
    assert f"compute capability {major}.{minor}" in spec.why
    assert ("GradScaler" in spec.why) == (expected == "fp16")  # make_scaler enables it for fp16
