"""What the packer records and says about a pack as a whole: the targets' statistics (float
columns, a mask split's classes), a pack that packed nothing or rejected most inputs for one
reason, and a pack that is not finished (the Loader and `stoker index` say so)."""

import json
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from helpers import run_cli as run
from stoker.errors import InputsRejectedError, ManifestError
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import make_regression_csv, make_segmentation_tree
from stoker.tools.pack import Masks, Reading, Shards, merge_parts, pack


@pytest.fixture(scope="module")
def ages(tmp_path_factory):
    root = tmp_path_factory.mktemp("ages")
    return make_regression_csv(root, n=30, seed=2, low=18, high=80, column="age", min_side=32, max_side=48)


def _csv_values(csv):
    return {r.split(",")[0]: float(r.split(",")[1]) for r in csv.read_text().splitlines()[1:]}


def test_float_statistics_per_split_match_the_packed_values(ages, tmp_path):
    rc, out, _ = run("pack", ages, tmp_path / "out", "--val-fraction", "0.2", "--samples-per-shard", "4", "-q")
    assert rc == 0
    values = _csv_values(ages)
    for split in ("train", "val"):
        m = Manifest.load(tmp_path / "out" / split)
        stats = m.target.stats
        import webdataset as wds

        got = [
            json.loads(s["json"])["path"]
            for s in wds.WebDataset([str(tmp_path / "out" / split / x.name) for x in m.shards], shardshuffle=False)
        ]
        v = np.array([values[p] for p in got], np.float32).astype(np.float64)
        assert stats.count == len(v) == m.num_samples
        assert stats.mean[0] == pytest.approx(v.mean(), abs=1e-6) and stats.std[0] == pytest.approx(v.std(), abs=1e-6)
        assert (stats.min[0], stats.max[0]) == (v.min(), v.max())
    train = Manifest.load(tmp_path / "out" / "train").target.stats
    assert f"targets: float, 1 column (age: mean {train.mean[0]:.3g}, std {train.std[0]:.3g}, " in out


def test_statistics_merge_across_parts_engines_and_a_resumed_pack(ages, tmp_path):
    pack(ages, tmp_path / "one", shards=Shards(samples=4), workers=1)
    whole = Manifest.load(tmp_path / "one" / "train").target.stats
    for p in range(3):
        pack(ages, tmp_path / "parts", shards=Shards(samples=4), part=(p, 3), workers=2)
    merge_parts(tmp_path / "parts")
    parts = Manifest.load(tmp_path / "parts" / "train").target.stats
    assert parts.count == whole.count and parts.min == whole.min and parts.max == whole.max
    assert parts.mean == pytest.approx(whole.mean, abs=1e-9) and parts.std == pytest.approx(whole.std, abs=1e-9)
    # resumed: the journal keeps each finished shard's sums; drop the end and the manifest, rerun
    journal = tmp_path / "one" / ".stoker-pack" / "train-p0of1.jsonl"
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[:3]) + "\n")
    (tmp_path / "one" / "train" / "stoker.json").unlink()
    pack(ages, tmp_path / "one", shards=Shards(samples=4), workers=1)
    assert Manifest.load(tmp_path / "one" / "train").target.stats == whole


def test_a_mask_split_records_the_classes_found_and_keeps_the_declared_count(tmp_path):
    images, masks = make_segmentation_tree(tmp_path / "seg", n=8, seed=0, min_side=32, max_side=48)
    Image.new("L", (40, 30)).save(images / "ignored.png")
    Image.fromarray(np.full((30, 40), 255, np.uint8), "L").save(masks / "ignored.png")
    rc, out, _ = run("pack", images, tmp_path / "out", "--masks", masks, "-q", "--workers", "2")
    assert rc == 0 and "targets: mask, classes not declared, 255 ignored\nmasks: classes 0..3 found\n" in out
    m = Manifest.load(tmp_path / "out" / "train")
    assert m.target.num_classes is None  # what the user declared (nothing), never what was found
    pixels = np.zeros(256)
    for p in sorted(masks.glob("*.png")):
        pixels += np.bincount(np.asarray(Image.open(p)).reshape(-1), minlength=256)
    pixels[255] = 0
    assert m.target.stats.count == 9
    assert m.target.stats.class_share == pytest.approx(tuple(pixels[:4] / pixels.sum()))
    pack(images, tmp_path / "declared", masks=Masks(masks, num_classes=6), workers=1)
    declared = Manifest.load(tmp_path / "declared" / "train").target
    assert declared.num_classes == 6 and len(declared.stats.class_share) == 4


def test_a_pack_that_packs_nothing_or_rejects_most_inputs_for_one_reason_fails(ages, tmp_path):
    wrong = tmp_path / "elsewhere" / "scores.csv"  # every path resolves from the CSV's folder: none exists
    wrong.parent.mkdir()
    wrong.write_text(ages.read_text())
    rc, out, err = run("pack", wrong, tmp_path / "out", "-q")
    assert rc == 1 and "train          0        30" in out
    assert re.fullmatch(
        re.escape(
            "stoker pack: nothing was packed: 30 of 30 inputs were rejected for one reason: unreadable: errno 2 "
            "(No such file or directory) (e.g. images/000XX.jpg); paths in a CSV are relative to the CSV's folder "
            f"({wrong.parent}); see {tmp_path / 'out'}/rejects.jsonl"
        ).replace("XX", "[0-9]{2}"),
        err.strip(),
    ), err
    assert run("pack", wrong, tmp_path / "out", "-q")[0] == 1  # the rerun says it again
    # most (not all) rejected for one reason
    rows = ages.read_text().splitlines()
    rows = rows[:1] + [r if k < 10 else r.replace("images/", "nope/") for k, r in enumerate(rows[1:])]
    most = ages.parent / "most.csv"
    most.write_text("\n".join(rows) + "\n")
    with pytest.raises(InputsRejectedError, match="^20 of 30 inputs were rejected for one reason: unreadable"):
        pack(most, tmp_path / "most", workers=1)
    # many rejects for many reasons, fewer than half for any one: the pack succeeds
    rows = ages.read_text().splitlines()
    rows = rows[:1] + [
        r if k >= 12 else f"images/{k:05d}.jpg,{'nan' if k % 2 else 'abc'}" for k, r in enumerate(rows[1:])
    ]
    mixed = ages.parent / "mixed.csv"
    mixed.write_text("\n".join(rows) + "\n")
    assert pack(mixed, tmp_path / "mixed", workers=1, reading=Reading(targets="float")).packed == 18


def test_an_unfinished_pack_is_named_by_the_loader_and_refused_by_index(ages, tmp_path):
    out = tmp_path / "out"
    pack(ages, out, shards=Shards(samples=4), workers=1, val_fraction=0.2)
    journal = out / ".stoker-pack" / "train-p0of1.jsonl"
    done = journal.read_text()
    journal.write_text("".join(done.splitlines(keepends=True)[:2]))  # killed after two shards
    shutil.rmtree(out / "val")
    (out / "train" / "stoker.json").unlink()
    expect = (
        f"a stoker pack into {out} is in progress or was stopped: rerun the same `stoker pack` command to finish it"
    )
    for split in ("train", "val"):
        with pytest.raises(ManifestError) as e:
            Manifest.load(out / split)
        assert str(e.value) == expect
    from stoker.pipeline import Loader

    with pytest.raises(ManifestError, match="is in progress or was stopped"):
        Loader(out / "train", batch_size=2, crop=16)
    rc, _, err = run("index", out / "train", "-q")
    assert rc == 2 and err.strip() == f"stoker index: error: {expect}"  # the line of every command
    assert not (out / "train" / "stoker.json").exists()
    assert pack(ages, out, shards=Shards(samples=4), workers=1, val_fraction=0.2).packed == 30  # the rerun finishes it
    assert Manifest.load(out / "train").num_samples == 24
    # parts: each unfinished, then all finished but not merged
    parts = tmp_path / "parts"
    pack(ages, parts, workers=1, part=(0, 2))
    with pytest.raises(ManifestError, match=r"--part I/2 into .* is in progress or was stopped: rerun the same"):
        Manifest.load(parts / "train")
    pack(ages, parts, workers=1, part=(1, 2))
    with pytest.raises(ManifestError, match=r"is finished: run `stoker pack --merge .*parts` to finish it"):
        Manifest.load(parts / "train")
