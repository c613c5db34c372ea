"""The training code people already run, on stoker Loaders: Accelerate, timm, pytorch/examples
imagenet/main.py (patched), each on CPU on generated data."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from stoker.model import Normalize, with_normalize
from stoker.pipeline.loader import Loader
from stoker.tools.synth import make_image_folder

from conftest import write_split

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
    summary = load_example("accelerate_recipe").main([str(root), "--cpu", "--epochs", "2", "--crop", "32",
                                                      "--batch-size", "8", "--arch", "resnet18"])
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


# ---- pytorch/examples imagenet/main.py ---------------------------------------------------------
IMAGENET_MAIN = EXAMPLES / "imagenet" / "main.py"


@pytest.mark.slow
@pytest.mark.skipif(not IMAGENET_MAIN.exists(), reason="examples/imagenet/main.py not present "
                    "(apply examples/imagenet/stoker.patch to pytorch/examples imagenet/main.py)")
def test_pytorch_examples_imagenet_main_runs_on_packed_data(tmp_path):
    """The patched reference script, two epochs on CPU on an ImageFolder packed by `stoker pack`."""
    make_image_folder(tmp_path / "images", per_class=5, min_side=40, max_side=120)
    pack = subprocess.run([sys.executable, "-m", "stoker.tools.cli", "pack", str(tmp_path / "images"),
                           str(tmp_path / "data"), "--val-fraction", "0.3", "-q"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert pack.returncode == 0, pack.stderr
    train = Loader(tmp_path / "data" / "train", batch_size=8, backend="pil")
    val = Loader(tmp_path / "data" / "val", batch_size=8, train=False, backend="pil")
    n_train, n_val, n_val_samples = len(train), len(val), len(val.dataset)
    assert n_train >= 2 and n_val >= 1

    run = subprocess.run([sys.executable, str(IMAGENET_MAIN), str(tmp_path / "data"), "-a", "resnet18",
                          "--epochs", "2", "-b", "8", "-j", "1", "-p", "1"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for epoch in (0, 1):  # every epoch runs len(train_loader) steps
        steps = re.findall(rf"Epoch: \[{epoch}\]\[\s*(\d+)/(\d+)\]", out)
        assert [int(i) for i, _ in steps] == list(range(1, n_train + 1))
        assert {int(n) for _, n in steps} == {n_train}
    assert len(re.findall(rf"Test: \[\s*{n_val}/{n_val}\]", out)) == 2  # the whole val set, twice
    summaries = re.findall(r"\*\s+Acc@1 ([\d.]+) Acc@5 ([\d.]+)", out)
    assert len(summaries) == 2
    for acc1, acc5 in summaries:  # averages over exactly the val set: k/n_val_samples
        for acc in (float(acc1), float(acc5)):
            assert abs(acc * n_val_samples / 100 - round(acc * n_val_samples / 100)) < 1e-2
    ckpt = torch.load(tmp_path / "checkpoint.pth.tar", weights_only=False)
    assert ckpt["epoch"] == 2 and "normalize.mean" in ckpt["state_dict"]  # with_normalize in front


def test_imagenet_patch_is_the_diff_of_main(tmp_path):
    """stoker.patch, applied backwards to the patched main.py, must apply cleanly: the patch
    describes exactly the file in examples/ (and the line counts in docs/integrations.md)."""
    patch = EXAMPLES / "imagenet" / "stoker.patch"
    if not IMAGENET_MAIN.exists() or not patch.exists():
        pytest.skip("examples/imagenet/main.py or stoker.patch not present")
    text = patch.read_text()
    added = sum(1 for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    removed = sum(1 for ln in text.splitlines() if ln.startswith("-") and not ln.startswith("---"))
    assert (added, removed) == (13, 54)
    work = tmp_path / "main.py"
    work.write_text(IMAGENET_MAIN.read_text())
    res = subprocess.run(["patch", "--dry-run", "-R", "-p2", str(work), "-i", str(patch)],
                         capture_output=True, text=True, timeout=30, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


# ---- tools/bench_frameworks ---------------------------------------------------------------------
def test_bench_frameworks_rejects_unknown_framework():
    from stoker.tools.bench_frameworks import main
    from stoker.tools.errors import UsageError

    with pytest.raises(UsageError, match="unknown keras"):
        main(["--images", "x", "--data", "y", "--frameworks", "plain,keras"])


@pytest.mark.slow
def test_bench_frameworks_measures_both_loaders(tmp_path):
    from stoker.tools.bench_frameworks import main

    make_image_folder(tmp_path / "images", per_class=4, min_side=40, max_side=100)
    pack = subprocess.run([sys.executable, "-m", "stoker.tools.cli", "pack", str(tmp_path / "images"),
                           str(tmp_path / "data"), "--val-fraction", "0", "-q"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert pack.returncode == 0, pack.stderr
    out = tmp_path / "bench.json"
    assert main(["--images", str(tmp_path / "images"), "--data", str(tmp_path / "data" / "train"),
                 "--frameworks", "plain", "--seconds", "0.5", "--batch-size", "4", "--crop", "32",
                 "--workers", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["framework"], r["loader"]) for r in rows] == [("plain", "stoker"), ("plain", "torchvision")]
    for r in rows:
        assert "error" not in r, r
        assert r["steps"] >= 1 and r["images"] == 4 * r["steps"] and r["images_per_s"] > 0
