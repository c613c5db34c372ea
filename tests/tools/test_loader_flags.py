"""The Loader's flags, declared once (tools/common/loader_flags.py): the same crop recipe, decode
choices and storage flags in every command, and a rectangular crop wherever a Loader is built."""

import argparse
import json

import pytest

from stoker.tools.cli import main as cli
from stoker.tools.common import loader_flags


def test_crop_takes_a_side_or_height_width():
    assert loader_flags.crop("224") == 224
    assert loader_flags.crop("192,256") == loader_flags.crop("192x256") == (192, 256)
    for bad in ("a", "1,2,3", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="not a side or height,width"):
            loader_flags.crop(bad)


def test_the_recipe_is_carried_whole():
    p = argparse.ArgumentParser()
    loader_flags.add_crop_flags(p)
    loader_flags.add_decode_flags(p)
    args = p.parse_args(["--crop", "96,128", "--scale", "0.25,1", "--crop-pct", "0.9", "--backend", "pil"])
    spec = loader_flags.crop_spec(args)
    assert (spec.size, spec.scale, spec.crop_pct, spec.val_resize) == ((96, 128), (0.25, 1.0), 0.9, None)
    assert loader_flags.loader_options(args) == {"backend": "pil", "decoder": "auto", "decode": "auto", "threads": None}


def test_the_fits_are_the_crop_specs():
    from stoker.pipeline.augment import crops

    p = argparse.ArgumentParser()
    loader_flags.add_crop_flags(p)
    spec = loader_flags.crop_spec(
        p.parse_args(["--train-fit", "scale-jitter", "--jitter", "0.5:1.5", "--val-fit", "center"])
    )
    assert (spec.train_fit, spec.jitter, spec.val_fit) == ("scale-jitter", (0.5, 1.5), "center")
    assert loader_flags.crop_spec(p.parse_args([])) == crops.CropSpec.of(224)  # the flags' defaults are the Loader's
    assert (loader_flags.TRAIN_FITS, loader_flags.VAL_FITS) == (crops.TRAIN_FITS, crops.VAL_FITS)
    with pytest.raises(argparse.ArgumentTypeError, match="LO,HI"):
        loader_flags.pair("0.5")


def test_the_commands_share_the_flags():
    from stoker.tools.cli import get_args_parser

    sub = next(a for a in get_args_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()}
    assert {"--crop", "--scale", "--ratio", "--crop-pct", "--val-resize", "--backend", "--decoder"} <= flags["train"]
    assert {"--crop", "--scale", "--backend", "--decoder", "--decode", "--threads"} <= flags["diagnose"]
    choices = {
        name: next(a.choices for a in p._actions if "--backend" in a.option_strings)
        for name, p in sub.choices.items()
        if "--backend" in flags[name]
    }
    assert len(set(map(tuple, choices.values()))) == 1  # one list: the registry's


def test_a_rectangular_crop_in_bench_and_diagnose(tiny_shards, capsys, fast_python):
    root = tiny_shards(n=32, per_shard=16)
    bench = ["bench", str(root), "--only", "stoker-pil", "--crop", "24,32", "--batch-size", "8", "--warmup", "1"]
    assert cli([*bench, "--json", "--seconds", "1", "--epochs", "1"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["bytes_per_batch"] == 8 * 3 * 24 * 32, row
    rc = cli(["diagnose", str(root / "train"), "--crop", "24,32", "--batch-size", "4", "--seconds", "0.1", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == 0 and rep["loader"]["batch_shape"] == [4, 3, 24, 32] and rep["settings"]["crop"] == "24x32"
