"""The CUDA paths (skipped without a GPU): Normalize, AMP, channels_last, the fused optimizers."""

import math

import pytest
import torch
from fake_loader import factory

from stoker.model import Normalize, build_model, load_checkpoint, measure_model
from stoker.model.train import TrainConfig, train

pytestmark = pytest.mark.gpu


def test_normalize_on_cuda_matches_cpu_and_keeps_channels_last():
    x = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    n = Normalize()
    y = n.cuda()(x.cuda())
    assert y.is_cuda and y.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y.cpu(), Normalize()(x))


@pytest.mark.parametrize("amp", ["bf16", "fp16", "off"])
def test_measure_model_on_cuda(amp):
    r = measure_model(
        build_model("inception", 10),
        batch_size=8,
        image_size=64,
        device="cuda",
        amp=amp,
        channels_last=True,
        compile=False,
        seconds=0.2,
        steps_min=3,
    )
    assert r["images_per_s"] > 0 and r["peak_mem_mb"] > 0 and r["amp"] == amp and math.isfinite(r["loss"])


@pytest.mark.parametrize("amp", ["auto", "fp16"])
def test_train_on_cuda(tmp_path, amp):
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "val").mkdir()
    s = train(
        TrainConfig(
            data=str(tmp_path / "data"),
            out=str(tmp_path / "run"),
            epochs=1,
            batch_size=8,
            crop=32,
            num_classes=6,
            amp=amp,
            channels_last=True,
            device="cuda",
            progress=False,
        ),
        loader_factory=factory(),
    )
    assert s["device"].startswith("cuda") and s["amp"] == ("fp16" if amp == "fp16" else s["amp"])
    assert s["amp"] in ("bf16", "fp16") and math.isfinite(s["train_loss"]) and s["val_samples"] == 48
    ck = load_checkpoint(tmp_path / "run" / "last.pt")
    assert all(not v.is_cuda for v in ck["model"].values())  # saved on the CPU: loads anywhere
