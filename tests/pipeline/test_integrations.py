"""The training code people already run, on stoker Loaders: Accelerate and timm, each on CPU
on generated data (the pytorch/examples ImageNet recipe is in docs/integrations.md)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import write_split
from stoker.model import Normalize, with_normalize
from stoker.pipeline.loader import Loader
from stoker.tools.common.synth import make_image_folder

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"stoker_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def root(tmp_path):
    """data/train (30 samples) and data/val (13), 6 classes, written directly as shards."""
    data = tmp_path / "data"
    write_split(data / "train", num_samples=30, samples_per_shard=16)
    write_split(data / "val", num_samples=13, samples_per_shard=16, seed=1)
    return data


# ---- Accelerate ------------------------------------------------------------------------------
def test_accelerate_prepare_hands_the_loader_back_unchanged(root):
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    loader = Loader(root / "train", batch_size=8, crop=24, backend="pil", threads=0)
    model = with_normalize(nn.Sequential(nn.Flatten(), nn.Linear(3 * 24 * 24, 6)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model2, optimizer2, loader2 = accelerator.prepare(model, optimizer, loader)
    assert loader2 is loader  # not a torch DataLoader: no re-sharding, no wrapper
    assert optimizer2 is not optimizer  # the optimizer is wrapped (AcceleratedOptimizer)
    steps = [len(y) for _, y in loader2]
    assert steps == [8, 8, 8] == [8] * len(loader)


def test_accelerate_save_state_keeps_the_loader_position(root, tmp_path):
    accelerate = pytest.importorskip("accelerate")
    accelerator = accelerate.Accelerator(cpu=True)
    loader = Loader(root / "train", batch_size=8, crop=24, backend="pil", threads=0, seed=4)
    accelerator.register_for_checkpointing(loader)
    full = [y.tolist() for _, y in loader]  # epoch 0
    it = iter(loader)  # epoch 1: two batches, then a checkpoint
    first = [next(it)[1].tolist() for _ in range(2)]
    accelerator.save_state(str(tmp_path / "ckpt"))
    rest = [y.tolist() for y in (b[1] for b in it)]

    resumed = Loader(root / "train", batch_size=8, crop=24, backend="pil", threads=0, seed=4)
    accelerator2 = accelerate.Accelerator(cpu=True)
    accelerator2.register_for_checkpointing(resumed)
    accelerator2.load_state(str(tmp_path / "ckpt"))
    assert resumed.state_dict()["epoch"] == 1 and resumed.state_dict()["position"] == 16
    assert [y.tolist() for _, y in resumed] == rest and first + rest != full


def test_accelerate_recipe_trains_exact_epochs(root):
    pytest.importorskip("accelerate")
    summary = load_example("accelerate_recipe").main(
        [str(root), "--cpu", "--epochs", "2", "--crop", "32", "--batch-size", "8", "--arch", "resnet18"]
    )
    assert summary["len_train"] == 3
    assert [h["steps"] for h in summary["history"]] == [3, 3]
    assert [h["val_seen"] for h in summary["history"]] == [13, 13]


# ---- timm ------------------------------------------------------------------------------------
def test_timm_recipe_uses_the_models_own_mean_std(root):
    pytest.importorskip("timm")
    recipe = load_example("timm_recipe")
    vit, cfg = recipe.timm_model("vit_tiny_patch16_224", num_classes=6, img_size=32)
    norm = vit.normalize
    assert isinstance(norm, Normalize) and cfg["mean"] == (0.5, 0.5, 0.5)
    assert norm.mean.flatten().tolist() == [127.5] * 3 and norm.std.flatten().tolist() == [127.5] * 3
    resnet, cfg = recipe.timm_model("resnet18", num_classes=6)
    assert resnet.normalize.mean.flatten().tolist() == pytest.approx([0.485 * 255, 0.456 * 255, 0.406 * 255])
    x = torch.full((2, 3, 32, 32), 255, dtype=torch.uint8)
    assert vit.normalize(x).flatten().unique().tolist() == [1.0]  # (255 - 127.5) / 127.5

    summary = recipe.main([str(root), "--model", "resnet18", "--crop", "32", "--batch-size", "8", "--device", "cpu"])
    assert summary["steps"] == 3 and summary["val_seen"] == 13 and summary["crop"] == 32
    assert summary["mean"] == [0.485, 0.456, 0.406]


# ---- tools/bench_frameworks ---------------------------------------------------------------------
def test_bench_frameworks_rejects_unknown_framework():
    from stoker.benchmarks.frameworks import main
    from stoker.errors import UsageError

    with pytest.raises(UsageError, match="unknown keras"):
        main(["--images", "x", "--data", "y", "--frameworks", "plain,keras"])


@pytest.mark.slow
def test_bench_frameworks_measures_both_loaders(tmp_path, fast_python):
    from stoker.benchmarks.frameworks import main

    make_image_folder(tmp_path / "images", per_class=4, min_side=40, max_side=100)
    pack = subprocess.run(
        [
            sys.executable,
            "-m",
            "stoker.tools.cli",
            "pack",
            str(tmp_path / "images"),
            str(tmp_path / "data"),
            "--val-fraction",
            "0",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert pack.returncode == 0, pack.stderr
    out = tmp_path / "bench.json"
    assert (
        main(
            [
                "--images",
                str(tmp_path / "images"),
                "--data",
                str(tmp_path / "data" / "train"),
                "--frameworks",
                "plain",
                "--seconds",
                "0.5",
                "--batch-size",
                "4",
                "--crop",
                "32",
                "--workers",
                "1",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())
    assert [(r["framework"], r["loader"]) for r in rows] == [("plain", "stoker"), ("plain", "torchvision")]
    for r in rows:
        assert "error" not in r, r
        assert r["steps"] >= 1 and r["images"] == 4 * r["steps"] and r["images_per_s"] > 0
