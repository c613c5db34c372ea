"""pack()'s groups of settings (Reading, Images, Shards, Masks, Ray) are the command's flags under
another spelling: a pack made through either is byte-identical, and the settings identity a pack
records (what a rerun resumes by) is the one of the flat keywords before the groups, field for
field, so a half-done pack resumes with either. Data is generated in tmp_path."""

import contextlib
import io
from pathlib import Path

import pytest

import stoker
from stoker.errors import UsageError
from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder, make_segmentation_tree
from stoker.tools.pack import Images, Masks, Ray, Reading, Shards, merge_parts, pack
from stoker.tools.pack.journal import read_settings, state_dir


def run(*argv) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return cli([str(a) for a in argv])


def files(out: Path) -> dict[str, bytes]:
    """Every file of a pack but its journal (locks, progress): relative path -> bytes."""
    skip = state_dir(out)
    return {
        p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file() and skip not in p.parents
    }


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("opts") / "src", per_class=3, min_side=24, max_side=60)


def test_the_command_and_the_groups_write_the_same_pack_and_the_old_identity(src, tmp_path):
    flags = ["--short-side", "32", "--max-side", "48", "--quality", "80", "--reencode", "--max-pixels", "1000000"]
    flags += ["--max-file-size", "1MiB", "--samples-per-shard", "4", "--seed", "3", "--val-fraction", "0.25"]
    assert run("pack", src, tmp_path / "cli", *flags, "--workers", "1", "-q") == 0
    pack(
        src,
        tmp_path / "api",
        images=Images(short_side=32, max_side=48, quality=80, reencode=True, max_pixels=1_000_000, max_file_size=2**20),
        shards=Shards(samples=4),
        seed=3,
        val_fraction=0.25,
        workers=1,
    )
    cli_files, api_files = files(tmp_path / "cli"), files(tmp_path / "api")
    assert {"train/stoker.json", "val/stoker.json", "train/train-000000.tar", "rejects.jsonl"} <= set(cli_files)
    assert cli_files == api_files
    settings = read_settings(tmp_path / "api")
    assert settings == read_settings(tmp_path / "cli")
    # the identity of the flat keywords before the groups: same names, same values
    assert {k: v for k, v in settings.items() if k not in ("splits", "classes", "stoker_version")} == {
        "source": str(src),
        "journal_format": 1,
        "seed": 3,
        "short_side": 32,
        "max_side": 48,
        "quality": 80,
        "reencode": True,
        "max_pixels": 1_000_000,
        "max_bytes": 1048576,
        "shard_size": 0,
        "samples_per_shard": 4,
        "val_fraction": 0.25,
        "parts": 1,
    }
    assert settings["stoker_version"] == stoker.__version__ and set(settings["splits"]) == {"train", "val"}


def test_the_defaults_are_the_flags_defaults(src, tmp_path):
    assert run("pack", src, tmp_path / "cli", "--workers", "1", "-q") == 0
    pack(src, tmp_path / "api", workers=1)
    pack(src, tmp_path / "groups", reading=Reading(), images=Images(), shards=Shards(), masks=Masks(), workers=1)
    assert files(tmp_path / "cli") == files(tmp_path / "api") == files(tmp_path / "groups")
    settings = read_settings(tmp_path / "api")
    assert settings == read_settings(tmp_path / "cli") == read_settings(tmp_path / "groups")
    assert (settings["short_side"], settings["shard_size"], settings["samples_per_shard"]) == (256, 256 * 1000**2, 0)


def test_a_part_packed_by_the_command_and_one_by_the_api_merge_into_one_pack(src, tmp_path):
    assert (
        run("pack", src, tmp_path / "parts", "--part", "0/2", "--samples-per-shard", "4", "-q", "--workers", "1") == 0
    )
    assert pack(src, tmp_path / "parts", part=(1, 2), shards=Shards(samples=4), workers=1).parts == 2
    merged = merge_parts(tmp_path / "parts")
    whole = pack(src, tmp_path / "whole", shards=Shards(samples=4), workers=1)
    assert merged.packed == whole.packed and read_settings(tmp_path / "parts")["parts"] == 2


def test_masks_by_path_and_by_group_record_the_same_identity(tmp_path):
    images, masks = make_segmentation_tree(tmp_path / "seg", n=6, seed=0, min_side=32, max_side=48)
    assert run("pack", images, tmp_path / "cli", "--masks", masks, "--num-classes", "4", "--workers", "1", "-q") == 0
    pack(images, tmp_path / "api", masks=Masks(masks, num_classes=4), workers=1)
    pack(images, tmp_path / "short", masks=str(masks), workers=1)
    assert files(tmp_path / "cli") == files(tmp_path / "api")
    cli_settings, api_settings = read_settings(tmp_path / "cli"), read_settings(tmp_path / "api")
    assert cli_settings == api_settings and api_settings["mask_classes"] == 4 and api_settings["short_side"] == 0
    assert read_settings(tmp_path / "short")["mask_classes"] == 0  # Masks(path): not checked
    with pytest.raises(UsageError) as e:  # a class count for masks a folder of classes does not have
        pack(images, tmp_path / "none", masks=Masks(num_classes=4), workers=1)
    assert str(e.value) == "Masks.num_classes and Masks.ignore_index are for masks (give masks)"


def test_the_groups_are_frozen_and_on_the_top_package():
    assert (stoker.Images, stoker.Shards, stoker.Reading, stoker.Masks, stoker.Ray) == (
        Images,
        Shards,
        Reading,
        Masks,
        Ray,
    )
    with pytest.raises(AttributeError):
        Images().quality = 50  # type: ignore[misc]
    assert Masks("tree") == Masks(path="tree") and Ray() == Ray(address=None)


def test_a_field_of_a_group_is_named_as_the_group_s_field_and_a_reader_s_message_too(src, tmp_path):
    with pytest.raises(UsageError) as e:
        pack(src, tmp_path / "o", reading=Reading(box_frame="sideways"))
    assert str(e.value) == "Reading(box_frame='sideways') must be one of auto, raw, upright"
    with pytest.raises(UsageError) as e:
        pack(src, tmp_path / "o", reading=Reading(targets="float"))
    assert str(e.value).startswith("Reading(targets='float') needs a CSV of path,values")
    with pytest.raises(UsageError) as e:
        pack(src, tmp_path / "o", masks=Masks(src, num_classes=300))
    assert str(e.value) == "Masks.num_classes must be in 1..256 (masks are uint8), got 300"
    assert not (tmp_path / "o").exists()
