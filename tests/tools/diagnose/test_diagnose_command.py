"""``stoker diagnose`` as a command and as ``diagnose()``: bad models, data and flags are one line,
the report on shards, an image folder (a packed sample beside it), a train/val tree, float and
mask splits, a batch lowered to fit the memory. The measurements themselves: test_diagnose.py."""

import json
import math
import time

import pytest
import torch
from torch import nn

from stoker.errors import UsageError
from stoker.tools import cli


@pytest.fixture
def shards(tiny_shards):
    return tiny_shards(n=24, per_shard=8)


def _cli(capsys, *argv):
    rc = cli.main(["diagnose", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("no_such_module_xyz:build", "cannot import no_such_module_xyz"),
        ("nocolon", "must look like"),
        ("json:no_such_factory", "has no attribute"),
        ("math:pi", "not a callable"),
        ("collections:OrderedDict", "not a torch.nn.Module"),
    ],
)
def test_bad_model_is_one_line_exit_2(capsys, shards, spec, needle):
    rc, out, err = _cli(capsys, shards, "--model", spec, "--batch-size", 4)
    assert rc == 2
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_model_file_factory_errors(capsys, shards, tmp_path):
    f = tmp_path / "net.py"
    f.write_text("import torch\nraise ImportError('needs timm')\n")
    rc, _, err = _cli(capsys, shards, "--model", f"{f}:build", "--batch-size", 4)
    assert rc == 2 and "needs timm" in err and err.count("\n") == 1
    f.write_text("def build(num_classes):\n    raise RuntimeError('bad width')\n")
    rc, _, err = _cli(capsys, shards, "--model", f"{f}:build", "--batch-size", 4)
    assert rc == 2 and "factory raised RuntimeError: bad width" in err


def test_model_file_factory_loads(tmp_path):
    from stoker.model.user import build_user_model

    f = tmp_path / "mynet.py"
    f.write_text("from torch import nn\ndef build(num_classes):\n    return nn.Linear(4, num_classes)\n")
    net = build_user_model(f"{f}:build", 7)
    assert isinstance(net, nn.Linear) and net.out_features == 7


def test_bad_data_and_flags(capsys, tmp_path, shards):
    rc, _, err = _cli(capsys, tmp_path / "nope")
    assert rc == 2 and err.strip() == f"stoker diagnose: error: {tmp_path / 'nope'} does not exist"
    (tmp_path / "empty").mkdir()
    rc, _, err = _cli(capsys, tmp_path / "empty")
    assert rc == 2 and "neither stoker shards" in err
    rc, _, err = _cli(capsys, shards, "--batch-size", "1000")
    assert rc == 2 and "larger than the 24 samples" in err
    rc, _, err = _cli(capsys, shards, "--arch", "no_such_net", "--batch-size", 4)
    assert rc == 2 and "unknown arch" in err and err.count("\n") == 1
    rc, _, err = _cli(capsys, shards, "--seconds", 0)
    assert rc == 2 and "--seconds" in err
    if not torch.cuda.is_available():
        rc, _, err = _cli(capsys, shards, "--device", "cuda", "--batch-size", 4)
        assert rc == 2 and "no CUDA device" in err


def test_backend_choice_says_what_and_why(capsys, shards, monkeypatch):
    from stoker.pipeline import deps
    from stoker.tools.diagnose.inputs import backend_choice

    monkeypatch.setattr(deps, "HAS_DALI", False)
    monkeypatch.setattr(deps, "has_cuda", lambda: False)
    assert backend_choice("auto", "cpu") == {
        "name": "pil",
        "why": "nvidia-dali is not installed; the device is the CPU",
    }
    assert backend_choice("pil", "cpu") == {"name": "pil", "why": "--backend pil"}
    monkeypatch.setattr(deps, "has_cuda", lambda: True)
    from stoker.pipeline.backends import decoders

    monkeypatch.setattr(
        decoders, "gpu_jpeg_decode", lambda device="cuda": (True, "torchvision 0.x decodes JPEGs on the GPU (nvJPEG)")
    )
    chosen = backend_choice("auto", "cuda")  # the Loader's own choice: its decoder="auto" probes each decoder
    assert chosen["name"] == "nvjpeg"
    assert chosen["why"].startswith("nvidia-dali is not installed; torchvision 0.x decodes JPEGs on the GPU (nvJPEG)")
    rc, out, err = _cli(capsys, shards, "--backend", "nvjpeg", "--device", "cpu", "--batch-size", 4)
    assert rc == 2 and not out and err.count("\n") == 1
    assert "--backend: backend='nvjpeg' decodes on the GPU but the device is the CPU: use device='cuda'" in err


def _loader_available():
    try:
        from stoker.pipeline import Loader  # noqa: F401
    except ImportError:
        return False
    return True


needs_loader = pytest.mark.skipif(not _loader_available(), reason="stoker.pipeline.Loader not built yet")


@needs_loader
@pytest.mark.slow
def test_cli_end_to_end_on_shards_json(capsys, shards, tmp_path):
    f = tmp_path / "tiny.py"
    # the seed report's flatten, x.view(x.size(0), -1): it fails on a channels_last tensor
    f.write_text(
        "from torch import nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, num_classes):\n"
        "        super().__init__()\n"
        "        self.body = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(2))\n"
        "        self.fc = nn.Linear(16, num_classes)\n"
        "    def forward(self, x):\n"
        "        x = self.body(x)\n"
        "        return self.fc(x.view(x.size(0), -1))\n"
        "def build(num_classes):\n"
        "    return Net(num_classes)\n"
    )
    rc, out, err = _cli(
        capsys,
        shards,
        "--model",
        f"{f}:build",
        "--batch-size",
        4,
        "--crop",
        32,
        "--seconds",
        0.2,
        "--device",
        "cpu",
        "--json",
    )
    assert rc == 0, err
    d = json.loads(out)
    assert d["data"]["kind"] == "stoker shards" and d["data"]["samples"] == 24
    assert d["loader"]["batch_shape"] == [4, 3, 32, 32] and d["loader"]["dtype"] == "uint8"
    assert d["verdict"]["label"] in ("loader-bound", "model-bound")
    for fig in (
        d["loader"]["images_per_s"],
        d["model"]["fp32"]["images_per_s"],
        d["end_to_end"]["images_per_s"],
        d["verdict"]["ratio"],
    ):
        assert math.isfinite(fig) and fig > 0
    assert d["audit"]["total_params"] == 3 * 4 * 9 + 4 + 16 * 6 + 6
    from stoker.pipeline.deps import HAS_DALI

    assert d["data"]["backend"]["name"] == d["data"]["loader"]["backend"] == ("dali" if HAS_DALI else "pil")
    assert d["data"]["backend"]["why"].startswith("nvidia-dali is")
    assert "loader alone" in err  # progress goes to stderr, JSON alone to stdout
    # the .view network is measured as it is: channels_last not measured, and why
    why = d["model"]["channels_last"]["why"]
    assert d["model"]["channels_last"].get("images_per_s") is None and "forward calls .view()" in why


@needs_loader
@pytest.mark.slow
def test_cli_human_report_on_shards(capsys, shards):
    rc, out, err = _cli(
        capsys,
        shards / "train",
        "--arch",
        "inception",
        "--batch-size",
        4,
        "--crop",
        32,
        "--seconds",
        0.2,
        "--channels-last",
        "off",
    )
    assert rc == 0, err
    assert "verdict:" in out and "environment" in out and "largest layers" in out
    assert "  stoker backend: " in out and "(nvidia-dali is " in out  # which backend, and why


@needs_loader
@pytest.mark.slow
def test_cli_image_folder_measures_torchvision_and_a_packed_sample(capsys, tmp_path, monkeypatch):
    import tempfile

    from stoker.tools.common.synth import make_image_folder

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))

    make_image_folder(tmp_path / "imgs", per_class=3, min_side=40, max_side=80, seed=0)
    rc, out, err = _cli(
        capsys,
        tmp_path / "imgs",
        "--arch",
        "resnet18",
        "--batch-size",
        4,
        "--crop",
        32,
        "--seconds",
        0.2,
        "--workers",
        0,
        "--pack-sample",
        8,
        "--channels-last",
        "off",
        "--json",
    )
    assert rc == 0, err
    d = json.loads(out)  # stdout holds the JSON alone (the pack summary goes to stderr)
    assert d["data"]["kind"] == "ImageFolder" and d["data"]["samples"] == 18
    assert d["loader"]["dtype"] == "float32"  # the torchvision pipeline as users run it
    (alt,) = d["loader_alternatives"]
    assert alt["id"] == "pack" and alt["result"]["dtype"] == "uint8" and alt["result"]["images_per_s"] > 0
    assert any(s["id"] == "pack" for s in d["next_steps"] + d["not_helping"])
    # the packed sample is removed (multiprocessing's and torch's own folders stay for the process)
    assert not [p for p in (tmp_path / "tmp").iterdir() if not p.name.startswith(("pymp-", "torchinductor_"))]


@needs_loader
@pytest.mark.slow
def test_diagnose_python_api_takes_a_module(shards):
    from stoker.tools.diagnose.command import Diagnosis, diagnose

    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3))
    lines = []
    started = time.perf_counter()
    result = diagnose(
        shards, model=net, batch_size=4, crop=32, seconds=0.1, device="cpu", channels_last="off", progress=lines.append
    )
    took = time.perf_counter() - started
    # said before anything is measured
    assert lines[0] == (
        "this takes about 1 s (12 x 0.1 s of measurements; longer for a model slower than 0.06 s a step, said once "
        "it is timed)"
    )
    assert took < 12 * 0.1 + 10, took  # the budget, and the start-up (model, loader) on a busy machine
    stages = result.verdict["stages"]
    assert isinstance(result, Diagnosis) and result.bound == min(stages, key=stages.get)  # the slowest stage
    assert result.to_dict()["settings"]["model"] == "Sequential" and result.verdict["label"] == f"{result.bound}-bound"
    assert result.to_dict()["audit"]["total_params"] == 3 * 4 * 9 + 4 + 4 * 3 + 3
    assert "verdict:" in result.format() and any(line.startswith("loader alone") for line in lines)
    with pytest.raises(UsageError, match="--batch-size 0 must be >= 1"):
        diagnose(shards, batch_size=0)


def test_loader_hints_from_pack_settings():
    from types import SimpleNamespace

    from stoker.tools.diagnose.inputs import loader_hints

    (hint,) = loader_hints(SimpleNamespace(pack={"short_side": 512, "source": "/src"}), crop=224)
    assert hint["id"] == "pack_smaller" and hint["action"] == "stoker pack /src OUT --short-side 256"
    assert hint["est_loader_speedup"] == pytest.approx(4.0**0.65)
    assert loader_hints(SimpleNamespace(pack={"short_side": 256}), crop=224) == []
    assert loader_hints(SimpleNamespace(pack={"fixture": True}), crop=224) == []


def test_help_says_how_long_the_defaults_take(capsys):
    with pytest.raises(SystemExit):
        cli.main(["diagnose", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "about a minute" in out and "5 steps" in out
    assert "A model slower than 3 s a step (resnet50 at batch 64 on a CPU) takes longer" in out


def test_train_val_tree_suggests_packing_the_tree(tmp_path, monkeypatch):
    import tempfile

    from stoker.tools.common.synth import make_image_folder
    from stoker.tools.diagnose import command

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        make_image_folder(tree / split, classes=("circles", "squares"), per_class=3, min_side=20, max_side=40)
    seen = []

    def fake_run(loader, net, *, alternatives, **kw):
        seen.append(alternatives)
        return {"settings": {}}

    monkeypatch.setattr(command, "run_diagnosis", fake_run)
    kw = dict(batch_size=2, crop=16, device="cpu", workers=0, pack_sample_size=4, backend="pil", arch="report")
    command.diagnose(tree, **kw)
    command.diagnose(tree / "train", **kw)
    (pack_tree,), (pack_folder,) = seen
    # The tree itself (pack splits it into train and val), not its train/ alone.
    assert pack_tree["action"].startswith(f"stoker pack {tree} OUT;")
    assert f"stoker pack {tree}/train" not in pack_tree["action"]
    # Given an ImageFolder (here the tree's train/), that folder is what to pack.
    assert pack_folder["action"].startswith(f"stoker pack {tree / 'train'} OUT;")


@needs_loader
@pytest.mark.parametrize("kind", ["float", "mask"])
def test_float_and_mask_splits_train_their_own_task(capsys, tmp_path, kind):
    # the task stoker train would pick: its head (per pixel for masks), its loss, its targets
    from stoker.tools.common.synth import make_regression_csv, make_segmentation_tree
    from stoker.tools.pack import Masks, pack

    if kind == "float":
        pack(make_regression_csv(tmp_path / "src", n=24, seed=1), tmp_path / "data", workers=1)
        task, outputs = "regress", 1
    else:
        images, masks = make_segmentation_tree(tmp_path / "src", n=12, seed=2, min_side=40, max_side=64)
        pack(images, tmp_path / "data", masks=Masks(masks, num_classes=4), workers=1)
        task, outputs = "segment", 4
    args = ("--batch-size", 4, "--crop", 32, "--seconds", 0.2, "--device", "cpu", "--amp", "off", "--json")
    rc, out, err = _cli(capsys, tmp_path / "data", *args)
    assert rc == 0, err
    d = json.loads(out)
    assert d["data"]["task"] == task and d["data"]["classes"] == outputs
    assert math.isfinite(d["end_to_end"]["images_per_s"]) and d["model"]["fp32"]["images_per_s"] > 0


def test_a_mask_split_without_a_class_count_is_one_line(capsys, tmp_path):
    from stoker.tools.common.synth import make_segmentation_tree
    from stoker.tools.pack import pack

    images, masks = make_segmentation_tree(tmp_path / "src", n=8, seed=2, min_side=40, max_side=64)
    pack(images, tmp_path / "data", masks=masks, workers=1)
    # the packer counted the values the masks hold: the class count comes from them
    from stoker.tools.diagnose.inputs import count_data

    outputs, samples, task = count_data("shards", tmp_path / "data" / "train")
    assert task.name == "segment" and outputs == 4 and samples == 8  # values 0..3 in the masks
    # a manifest without them (an older pack, or one written by hand) cannot say: one line
    manifest = tmp_path / "data" / "train" / "stoker.json"
    d = json.loads(manifest.read_text())
    del d["target"]["stats"]
    manifest.write_text(json.dumps(d))
    rc, _, err = _cli(capsys, tmp_path / "data", "--batch-size", 4)
    assert rc == 2 and err.count("\n") == 1 and "repack with --num-classes N" in err


def test_a_batch_that_would_not_fit_the_memory_is_lowered_and_said(capsys, shards, monkeypatch):
    # The report's net needs ~hundreds of MB a sample at full size: at the default batch it was
    # OOM-killed. Here the host "has" 120 MB: the probe steps size the batch to what fits.
    from stoker.tools.diagnose import sizing

    monkeypatch.setattr(sizing, "host_available", lambda: 120_000_000)
    # the memory rule alone (the time rule would bind first on a busy machine at --seconds 0.2)
    fit_batch = sizing.fit_batch
    monkeypatch.setattr(sizing, "fit_batch", lambda *a, **k: fit_batch(*a, **{**k, "step_limit_s": None}))
    rc, out, err = _cli(
        capsys, shards, "--arch", "report", "--crop", 32, "--batch-size", 16, "--seconds", 0.2, "--json"
    )
    assert rc == 0, err
    rep = json.loads(out)
    fit = rep["settings"]["batch_fit"]
    assert fit["requested"] == 16 and 1 <= fit["batch_size"] < 16 == fit["requested"]
    assert rep["settings"]["batch_size"] == fit["batch_size"] == rep["loader"]["batch_shape"][0]
    assert fit["bytes_fixed"] + fit["bytes_per_sample"] * fit["batch_size"] <= 0.5 * 120_000_000
    assert fit["bytes_fixed"] + fit["bytes_per_sample"] * 16 > 0.5 * 120_000_000
    assert "batch 16 would need ~" in err and f"measuring at batch {fit['batch_size']}" in err
    assert "fp32_batch_x2" not in rep["model"] or not rep["model"]["fp32_batch_x2"].get("images_per_s")


def test_a_csv_or_a_folder_of_photos_is_told_to_pack_first(capsys, tmp_path):
    from stoker.tools.common.synth import make_regression_csv

    csv = make_regression_csv(tmp_path / "ages", n=6, low=18, high=80, column="age")
    rc, _, err = _cli(capsys, csv)
    assert rc == 2 and f"`stoker pack {csv} OUT`, then `stoker diagnose OUT`" in err and err.count("\n") == 1
    rc, _, err = _cli(capsys, csv.parent)  # the folder holding the CSV and images/
    assert rc == 2 and f"`stoker pack {csv} OUT`" in err
    rc, _, err = _cli(capsys, csv.parent / "images")  # photos without class folders or targets
    assert rc == 2 and "pack them first with their targets" in err
