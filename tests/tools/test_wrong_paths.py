"""One message per wrong path, the same in every command and in the Loader, exit 2: a missing path,
an image folder, an unfinished pack, a pack's root where a split goes and a split where the root goes
(:mod:`stoker.pipeline.shards.paths`)."""

import shutil

import pytest

from helpers import run_cli
from stoker.errors import NotPackedError
from stoker.pipeline import Loader
from stoker.tools.common.synth import make_image_folder

#: every command given a path of packed data, as argv around the path
COMMANDS = {
    "train": lambda p, tmp: ["train", p, "--out", tmp / "run"],
    "verify": lambda p, tmp: ["verify", p],
    "bench": lambda p, tmp: ["bench", p],
    "diagnose": lambda p, tmp: ["diagnose", p],
    "index": lambda p, tmp: ["index", p, "-q"],
}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("wrong-paths")
    photos = make_image_folder(root / "photos", classes=("circles", "rings"), per_class=3, min_side=32, max_side=48)
    out = root / "packed"
    assert run_cli("pack", photos, out, "-q", "--workers", "1", "--val-fraction", "0.34")[0] == 0
    stopped = root / "stopped"  # a pack killed before its manifests: its journal has no "done"
    shutil.copytree(out, stopped)
    for split in ("train", "val"):
        (stopped / split / "stoker.json").unlink()
        journal = stopped / ".stoker-pack" / f"{split}-p0of1.jsonl"
        journal.write_text("".join(journal.read_text().splitlines(keepends=True)[:-1]))
    return {"photos": photos, "packed": out, "stopped": stopped, "missing": root / "nope"}


def loader_line(path) -> str:
    with pytest.raises(NotPackedError) as e:
        Loader(path, batch_size=2, crop=16)
    return str(e.value)


def command_line(name, argv) -> str:
    rc, _, err = run_cli(*argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1, (name, rc, err)
    prefix = f"stoker {name}: error: "
    assert err.startswith(prefix), err
    return err.strip()[len(prefix) :]


def test_a_missing_path_is_one_line_everywhere(paths, tmp_path):
    expect = f"{paths['missing']} does not exist"
    assert loader_line(paths["missing"]) == expect
    for name, argv in COMMANDS.items():
        assert command_line(name, argv(paths["missing"], tmp_path)) == expect, name


def test_an_image_folder_says_pack_it_everywhere(paths, tmp_path):
    photos = paths["photos"]
    expect = f"{photos} is an image folder, not packed shards: run `stoker pack {photos} OUT`"
    expect += " (its splits: OUT/train, OUT/val)"
    assert loader_line(photos) == expect
    for name, argv in COMMANDS.items():
        if name != "diagnose":  # diagnose measures an image folder as it is
            assert command_line(name, argv(photos, tmp_path)) == expect, name


def test_an_unfinished_pack_is_the_same_line_everywhere(paths, tmp_path):
    stopped = paths["stopped"]
    expect = (
        f"a stoker pack into {stopped} is in progress or was stopped: rerun the same `stoker pack` command to finish it"
    )
    assert loader_line(stopped / "train") == expect
    assert loader_line(stopped / "val") == expect
    for name, argv in COMMANDS.items():
        where = stopped / "train" if name == "index" else stopped
        assert command_line(name, argv(where, tmp_path)) == expect, name


def test_a_root_for_a_split_and_a_split_for_a_root(paths, tmp_path):
    out = paths["packed"]
    assert loader_line(out) == f"no stoker.json in {out} (did you mean {out / 'train'}?)"
    line = command_line("train", COMMANDS["train"](out / "train", tmp_path))
    assert line == f"{out / 'train'} is a split; give the folder that holds train/ (and val/): did you mean {out}?"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert command_line("train", COMMANDS["train"](empty, tmp_path)).startswith(f"no train/ split in {empty}")
