"""The everyday path, tried as a new user would: every silent pitfall is now a word, every habit
from torchvision or a DataLoader gets a one-line answer (issue 23). Each test failed before."""

import json
import subprocess
import sys
import warnings

import pytest
import torch

from helpers import write_split
from stoker.errors import LoaderError, ManifestError, UsageError
from stoker.pipeline import Loader
from stoker.tools.cli import main as cli


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("everyday") / "data"
    write_split(root / "train", num_samples=24, samples_per_shard=12)
    return root


# ---- silent wrong results --------------------------------------------------------------------
def test_normalize_refuses_a_float_batch_and_a_second_wrap():
    from stoker.model import Normalize, with_normalize

    net = with_normalize(torch.nn.Conv2d(3, 2, 1))
    assert net(torch.zeros(1, 3, 4, 4, dtype=torch.uint8)).dtype == torch.float32
    with pytest.raises(ValueError, match="Normalize takes uint8 batches .* would be normalized twice"):
        net(torch.rand(1, 3, 4, 4))  # a ToTensor() batch in [0, 1]
    with pytest.raises(ValueError, match="already normalizes its input"):
        with_normalize(net)
    with pytest.raises(ValueError, match="got torch.float16"):
        Normalize()(torch.zeros(1, 3, 2, 2, dtype=torch.float16))


def test_a_crop_larger_than_the_pack_stored_is_said_once(tmp_path):
    from stoker.tools.common.synth import make_image_folder
    from stoker.tools.pack import Images, pack

    pack(
        make_image_folder(tmp_path / "src", per_class=2, classes=("circles", "rings")),
        tmp_path / "p",
        images=Images(short_side=40),
    )
    with pytest.warns(UserWarning, match=r"crop=96 needs a shorter side of 110px.*--short-side 40.*--short-side 110"):
        Loader(tmp_path / "p" / "train", batch_size=2, crop=96, train=False, backend="pil", threads=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what the pack stored is enough: no word
        Loader(tmp_path / "p" / "train", batch_size=2, crop=32, train=False, backend="pil", threads=0)


def test_training_without_val_says_so_at_the_start(data, tmp_path, capsys):
    run = ["train", str(data), "--out", str(tmp_path / "r"), "--epochs", "1", "--batch-size", "8", "--crop", "32"]
    assert cli([*run, "--no-progress", "--threads", "0"]) == 0
    err = capsys.readouterr().err
    assert "no val split in" in err and "training without validation, so no best.pt" in err
    assert "--val-fraction" in err and not (tmp_path / "r" / "best.pt").exists()


def test_reruns_refuse_to_overwrite_and_a_finished_run_says_it_is_complete(data, tmp_path, capsys):
    run = ["train", str(data), "--out", str(tmp_path / "r"), "--epochs", "1", "--batch-size", "8", "--crop", "32"]
    run += ["--no-progress", "--threads", "0"]
    assert cli(run) == 0
    metrics = (tmp_path / "r" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert cli(run) == 2  # the same --out again without --resume
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already holds a run" in err and "--overwrite" in err
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == metrics  # nothing appended
    assert cli([*run, "--resume"]) == 0
    out, err = capsys.readouterr()
    assert "is complete (3/3 steps): nothing to resume" in err and "the run is complete" in out
    assert "nan" not in out and (tmp_path / "r" / "metrics.jsonl").read_text() == metrics
    assert cli([*run, "--overwrite"]) == 0
    assert (tmp_path / "r" / "metrics.jsonl").read_text().count('"kind": "train"') == metrics.count('"kind": "train"')


def test_resume_is_a_flag_that_never_swallows_data(data, tmp_path):
    import argparse

    from stoker.tools import train as train_cli

    p = argparse.ArgumentParser()
    train_cli.add_arguments(p)
    args = p.parse_args(["--out", "runs/a", "--resume", str(data)])
    assert args.data == str(data) and args.resume == "last" and args.resume_from is None
    args = p.parse_args(["--out", "runs/a", "--resume", "auto", str(data)])  # a job script's
    assert args.data == str(data) and args.resume == "auto"


# ---- crashes where one line belongs ----------------------------------------------------------
def test_a_missing_path_and_an_image_folder_are_named(tmp_path):
    with pytest.raises(ManifestError, match=r"/no/such/path does not exist$"):
        Loader("/no/such/path", batch_size=4)
    (tmp_path / "photos" / "cats").mkdir(parents=True)
    (tmp_path / "photos" / "cats" / "a.jpg").write_bytes(b"x")
    with pytest.raises(ManifestError, match=r"is an image folder, not packed shards: run `stoker pack .*photos OUT`"):
        Loader(tmp_path / "photos", batch_size=4)


def test_dataset_habits_get_the_dataloader_kind_of_message(data):
    with pytest.raises(ValueError, match="transform= is a torch DataLoader argument: stoker's Loader takes augment="):
        Loader(data / "train", batch_size=4, transform=lambda x: x)
    with pytest.raises(ValueError, match="target_transform= is a torch DataLoader argument"):
        Loader(data / "train", batch_size=4, target_transform=None)


def test_skip_first_batches_says_the_loader_resumes_with_its_own_state(data):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    loader = Loader(data / "train", batch_size=4, crop=16, backend="pil", threads=0)
    with pytest.raises(LoaderError, match=r"resumes mid-epoch with its own state, loader.load_state_dict"):
        Accelerator(cpu=True).skip_first_batches(loader, 2)


def test_the_datamodule_without_val_is_one_line(data):
    pytest.importorskip("pytorch_lightning")
    from stoker.pipeline.lightning import StokerDataModule

    with pytest.raises(UsageError, match="has no val/ split .*: pass val_split=None .* --val-fraction 0.1"):
        StokerDataModule(data, batch_size=4)
    assert StokerDataModule(data, batch_size=4, val_split=None).val_dataloader() == []


# ---- habits that should just work ----------------------------------------------------------
def test_python_m_stoker_dash_v_and_bare_stoker(capsys):
    out = subprocess.run([sys.executable, "-m", "stoker", "-V"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("stoker ")
    assert cli([]) == 0 and "pack" in capsys.readouterr().out  # bare stoker lists the commands


def test_help_shows_defaults():
    from stoker.tools.cli import get_args_parser

    parser = get_args_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    text = sub["train"].format_help()
    assert "--optimizer {sgd,adamw}" in text and "(default: sgd)" in text and "(default: 0.9)" in text


def test_json_on_pack_verify_and_index(tmp_path, capsys):
    from stoker.tools.common.synth import make_image_folder

    src = make_image_folder(tmp_path / "src", per_class=2, classes=("circles", "rings"))
    assert cli(["pack", str(src), str(tmp_path / "out"), "-q", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["splits"]["train"]["samples"] == 4
    assert cli(["verify", str(tmp_path / "out"), "-q", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    assert cli(["index", str(tmp_path / "out" / "train"), "-q", "--json", "--no-check"]) == 0
    assert json.loads(capsys.readouterr().out)["num_samples"] == 4


def test_no_progress_bar_into_a_log_file(data, tmp_path, fast_python):
    run = [sys.executable, "-m", "stoker", "train", str(data), "--out", str(tmp_path / "r"), "--epochs", "1"]
    run += ["--batch-size", "8", "--crop", "32", "--threads", "0"]
    p = subprocess.run(run, capture_output=True, text=True, timeout=300)  # stderr is a pipe, not a terminal
    assert p.returncode == 0, p.stderr[-2000:]
    assert "\r" not in p.stderr and "it/s" not in p.stderr and "step/s" not in p.stderr


def test_dataset_targets_samples_num_workers_and_the_seed_warning(data):
    loader = Loader(data / "train", batch_size=4, crop=16, backend="pil", threads=0, seed=1)
    assert loader.num_workers == 0 and len(loader.dataset.targets) == 24
    assert loader.dataset.targets[:6] == [0, 1, 2, 3, 4, 5]  # label = position % 6 in the fixture
    assert loader.dataset.samples[7] == ("000000007", 1)
    other = Loader(data / "train", batch_size=4, crop=16, backend="pil", threads=0, seed=2)
    with pytest.warns(UserWarning, match="load_state_dict replaces seed=2 with the state's seed=1"):
        other.load_state_dict(loader.state_dict())


def test_checkpoints_hold_the_bare_state_dict_and_predict_like_validation(tmp_path):
    import torchvision

    from stoker.model import Predictor
    from stoker.tools.common.synth import make_image_folder
    from stoker.tools.pack import pack

    src = make_image_folder(tmp_path / "src", per_class=4, classes=("circles", "rings"))
    pack(src, tmp_path / "p", val_fraction=0.25)
    run = ["train", str(tmp_path / "p"), "--out", str(tmp_path / "r"), "--epochs", "1", "--batch-size", "2"]
    assert cli([*run, "--crop", "32", "--arch", "resnet18", "--no-progress", "--threads", "0"]) == 0
    bare = torch.load(tmp_path / "r" / "best.pt", weights_only=True)["net"]
    torchvision.models.resnet18(num_classes=2).load_state_dict(bare)  # a stock model takes it
    predict = Predictor.from_checkpoint(tmp_path / "r" / "best.pt")
    val = Loader(tmp_path / "p" / "val", batch_size=8, crop=32, train=False, backend="pil", threads=0)
    images, _ = next(iter(val))
    from stoker.pipeline.shards.samples import open_split

    idx = open_split(tmp_path / "p" / "val")
    raw = [bytes(e) for e in idx.images(val.indices())[0]]
    assert torch.equal(predict.preprocess(raw), images)  # the val transform, pixel for pixel
    assert predict(raw).shape == (len(raw), 2)


def test_a_bad_argument_is_a_value_error_to_python_and_one_line_to_the_command(tmp_path, capsys):
    from helpers import write_split
    from stoker.errors import ArgumentError, UsageError
    from stoker.pipeline import Loader
    from stoker.tools.cli import main as cli

    write_split(tmp_path / "train", num_samples=8, samples_per_shard=8)
    with pytest.raises(ArgumentError, match="batch_size=0") as e:
        Loader(tmp_path / "train", batch_size=0)
    assert isinstance(e.value, ValueError) and isinstance(e.value, UsageError) and e.value.exit_code == 2
    # the command prints the library's own check, no re-wrapping in between
    assert cli(["train", str(tmp_path), "--out", str(tmp_path / "r"), "--crop", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "crop=0 must be a positive" in err
