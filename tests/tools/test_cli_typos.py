"""A typo on the command line is one line that names what was most likely meant: flags spelt whole
(no abbreviations), unknown flags, commands and choices with a suggestion, help without noise."""

import argparse
import contextlib
import io

import pytest

from stoker.errors import close_names, unknown_choice
from stoker.tools.cli import get_args_parser, main


def run(*argv) -> tuple[int, str]:
    """``stoker ARGV`` in this process, argparse's exits included: ``(exit status, stderr)``."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
    return rc, err.getvalue()


def one_line(rc_err, rc=2) -> str:
    code, err = rc_err
    assert code == rc and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_a_mistyped_flag_names_the_flag_it_meant(tmp_path):
    line = one_line(run("train", tmp_path, "--out", tmp_path / "r", "--batchsize", "16"))
    assert line.startswith("stoker train: error: unrecognized arguments: --batchsize 16")
    assert "did you mean --batch-size?" in line and line.endswith("see stoker train --help")
    assert "did you mean --val-fraction?" in one_line(run("pack", tmp_path, tmp_path / "o", "--val_fraction=0.1"))
    assert "did you mean" not in one_line(run("verify", tmp_path, "--zzzzzz"))  # nothing close: no guess
    # a required flag mistyped: argparse stops at the missing flag, and the line still names the typo
    line = one_line(run("train", tmp_path, "--ouput", tmp_path / "r"))
    assert "the following arguments are required: --out (--ouput is not a flag: did you mean --out?)" in line


def test_the_flags_other_tools_users_type_are_taken_or_named(tmp_path):
    from stoker.tools.cli import FAMILIAR

    # the same meaning: taken as they are (timm's and pytorch/examples' names)
    train = subparsers(get_args_parser())["train"]
    args = train.parse_args([str(tmp_path), "--out", "r", "-b", "16", "-j", "3"])
    assert (args.batch_size, args.threads) == (16, 3)
    assert train.parse_args([str(tmp_path), "--out", "r", "--workers", "2"]).threads == 2
    assert subparsers(get_args_parser())["eval"].parse_args(["c.pt", "s", "-b", "4", "-j", "2"]).threads == 2
    # another tool's name: stoker's flag, with why where the meaning differs
    for flag, meant in (
        ("--lr-rate", "did you mean --lr?"),
        ("--learning-rate", "did you mean --lr? (the peak rate: a linear warm-up, then cosine decay to 0)"),
        ("--bs", "did you mean --batch-size?"),
        ("--num-workers", "did you mean --threads? (the Loader's decode threads or processes; -j/--workers"),
        ("--pretrained", "did you mean --init-from? (nothing is downloaded: give a checkpoint or a state_dict"),
    ):
        line = one_line(run("train", tmp_path, "--out", tmp_path / "r", flag, "1"))
        assert f"unrecognized arguments: {flag} 1: {meant}" in line, line
    assert all(mine.startswith("--") for mine, _ in FAMILIAR.values())
    # a command without the flag it would name: no suggestion from the table
    assert "did you mean" not in one_line(run("verify", tmp_path, "--lr-rate", "1"))
    # diagnose's own --workers is its torchvision DataLoader's: -j is not taken there
    assert "unrecognized arguments: -j 2" in one_line(run("diagnose", tmp_path, "-j", "2"))


def test_abbreviations_are_refused_in_every_command(tmp_path):
    line = one_line(run("train", tmp_path, "--out", tmp_path / "r", "--epoch", "2"))
    assert "unrecognized arguments: --epoch 2: did you mean --epochs" in line
    parser = get_args_parser()
    assert not parser.allow_abbrev and all(not p.allow_abbrev for p in subparsers(parser).values())


def test_an_unknown_command_or_choice_names_the_close_ones(tmp_path):
    line = one_line(run("trian", tmp_path))
    assert "unknown command 'trian': did you mean train?" in line
    line = one_line(run("train", tmp_path, "--out", tmp_path / "r", "--mixup-mode", "bach"))
    assert "argument --mixup-mode: unknown value 'bach': did you mean batch? (choose from batch, pair, elem)" in line


def test_an_unknown_arch_suggests_instead_of_listing_every_name():
    from stoker.model.nets import STOKER_ARCHS, build_model, torchvision_archs

    names = STOKER_ARCHS + tuple(torchvision_archs())
    assert len(names) > 40
    with pytest.raises(ValueError) as e:
        build_model("resnet-18", 10)
    assert str(e.value) == "unknown arch 'resnet-18': did you mean resnet18?"
    with pytest.raises(ValueError) as e:
        build_model("zzzzzz", 10)
    assert str(e.value).startswith(f"unknown arch 'zzzzzz': none of the {len(names)} names is close (e.g. ")
    assert len(str(e.value)) < 200


def test_close_names_ignore_case_dashes_and_underscores():
    flags = ["--batch-size", "--epochs", "--val-fraction", "--warmup-epochs"]
    assert close_names("--batchsize", flags) == ["--batch-size"]
    assert close_names("--VAL_FRACTION", flags) == ["--val-fraction"]
    assert close_names("--epoch", flags)[0] == "--epochs"
    assert close_names("--colour", flags) == []
    assert unknown_choice("value", "x", ["a", "b"]) == "unknown value 'x' (choose from a, b)"


def test_help_has_examples_and_no_default_on_a_switch():
    parser = get_args_parser()
    top = parser.format_help()
    assert "examples:" in top and "stoker pack " in top and "stoker train " in top
    for name, sub in subparsers(parser).items():
        text = sub.format_help()
        assert "(default: True)" not in text and "(default: False)" not in text, name
    train = " ".join(subparsers(parser)["train"].format_help().split())
    assert "--no-progress no progress bar --json" in train
