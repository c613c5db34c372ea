"""Errors name the arguments they are about in the caller's spelling: Python callers read the
Python argument (``workers``), the ``stoker`` command its own flag (``--workers``)."""

import contextlib
import io
import pickle
from pathlib import Path

import pytest

from stoker.errors import ArgumentError, UsageError, arg
from stoker.tools.cli import flag_spelling, get_args_parser
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder
from stoker.tools.pack import Reading, Shards, pack
from stoker.tools.verify.command import verify
from stoker.tools.verify.indexing import index


def run(*argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli([str(a) for a in argv])
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path]:
    """``(SRC, OUT)``: 6 images in 3 classes and their pack."""
    root = tmp_path_factory.mktemp("args")
    src = make_image_folder(root / "src", per_class=2, min_side=24, max_side=40)
    pack(src, root / "out", workers=1)
    return src, root / "out"


def test_arg_is_the_python_name_in_the_message_and_only_marked_names_are_spelled():
    e = ArgumentError(f"{arg('workers')} must be >= 1 (the workers pack); {arg('engine', 'ray')} needs Ray")
    assert str(e) == "workers must be >= 1 (the workers pack); engine='ray' needs Ray"
    flags = {"workers": "--workers", "engine": "--engine"}
    spelled = "--workers must be >= 1 (the workers pack); --engine ray needs Ray"  # the prose word stays
    assert e.spelled(flags.get) == spelled and e.args == (str(e),)
    copy = pickle.loads(pickle.dumps(e))  # as it crosses back from a worker process
    assert str(copy) == str(e) and copy.spelled(flags.get) == spelled
    assert e.spelled(lambda name: None) == str(e)  # no flag for it: the Python spelling
    assert UsageError("plain words").spelled(flags.get) == "plain words"


def test_a_field_of_an_options_object_is_its_python_spelling_and_the_flag_of_its_name():
    e = UsageError(
        f"{arg('shard_size', python='Shards.size')} must be positive; "
        f"{arg('source', 'coco', python='Reading.source')} reads it; {arg('workers')}"
    )
    assert str(e) == "Shards.size must be positive; Reading(source='coco') reads it; workers"
    flags = {"shard_size": "--shard-size", "source": "--source", "workers": "--workers"}
    assert e.spelled(flags.get) == "--shard-size must be positive; --source coco reads it; --workers"
    assert pickle.loads(pickle.dumps(e)).spelled(flags.get) == e.spelled(flags.get)


def test_the_command_spells_an_argument_as_its_own_flag():
    spell = flag_spelling(get_args_parser(), "pack")
    assert [spell(n) for n in ("workers", "val_fraction", "src", "out", "storage_options")] == [
        "--workers",
        "--val-fraction",
        "SRC",
        "OUT",
        "--storage-option",
    ]
    assert flag_spelling(get_args_parser(), "train")("label_smoothing") == "--label-smoothing"
    assert flag_spelling(get_args_parser(), "diagnose")("num_classes") == "--num-classes"  # another command's


def test_pack_names_workers_from_python_and_the_flag_from_the_command(packed, tmp_path):
    src, _ = packed
    with pytest.raises(UsageError) as e:
        pack(src, tmp_path / "o", workers=0)
    assert str(e.value) == "workers must be >= 1, got 0"
    assert run("pack", src, tmp_path / "o", "--workers", "0") == (
        2,
        "stoker pack: error: --workers must be >= 1, got 0\n",
    )
    with pytest.raises(UsageError) as e:  # a field of a group: the group's name and the field's
        pack(src, tmp_path / "o", shards=Shards(samples=-1))
    assert str(e.value) == "Shards.samples must be >= 0, got -1"
    assert run("pack", src, tmp_path / "o", "--samples-per-shard", "-1") == (
        2,
        "stoker pack: error: --samples-per-shard must be >= 0, got -1\n",
    )
    rc, err = run("pack", src, tmp_path / "o", "--ray-address", "auto")  # Ray(address=) is engine ray
    assert (rc, err) == (2, "stoker pack: error: --ray-address needs --engine ray\n")
    assert not (tmp_path / "o").exists()


def test_a_source_option_is_named_as_the_python_argument(packed, tmp_path):
    src, _ = packed
    with pytest.raises(UsageError) as e:
        pack(src, tmp_path / "o", reading=Reading(source="nope"))
    assert str(e.value).startswith("Reading.source 'nope' must be one of auto, ")
    rc, err = run("pack", src, tmp_path / "o", "--source", "nope")
    assert rc == 2 and err.startswith("stoker pack: error: --source 'nope' must be one of auto, ")
    with pytest.raises(UsageError) as e:
        pack(src, tmp_path / "o", masks=tmp_path / "none")
    assert str(e.value).startswith(f"masks='{tmp_path / 'none'}' is not a folder")
    rc, err = run("pack", src, tmp_path / "o", "--masks", tmp_path / "none")
    assert rc == 2 and err.startswith(f"stoker pack: error: --masks {tmp_path / 'none'} is not a folder")


def test_index_and_verify_name_python_arguments_and_their_commands_flags(packed):
    _, out = packed
    tars = sorted((out / "train").glob("*.tar"))
    with pytest.raises(UsageError) as e:
        index(tars, workers=0)
    assert str(e.value) == "workers must be >= 1, got 0"
    assert run("index", *tars, "--workers", "0") == (2, "stoker index: error: --workers must be >= 1, got 0\n")
    with pytest.raises(UsageError) as e:
        index(tars, classes=["a", "a"])
    assert str(e.value) == "classes names a class twice"
    with pytest.raises(UsageError) as e:
        verify(out, sample=-1)
    assert str(e.value) == "sample must be >= 0 and workers >= 1"
    rc, err = run("verify", out, "--sample", "-1")
    assert (rc, err) == (2, "stoker verify: error: --sample must be >= 0 and --workers >= 1\n")
    with pytest.raises(UsageError) as e:
        verify(out, storage_options={"anon": True})
    assert str(e.value).startswith("storage_options is for a URL")
    rc, err = run("verify", out, "--storage-option", "anon=true")
    assert rc == 2 and err.startswith("stoker verify: error: --storage-option is for a URL")
