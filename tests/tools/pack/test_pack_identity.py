"""One input, packed once: every pack source tells two references of one image apart by the same
rule (``sources.base.input_identity``: ``st_dev, st_ino`` for a local file, the normalized URL
for a remote one). A second reference (a relative and an absolute path, a symlink, a hard link) is
a reject ``same file as <first>``, listed in rejects.jsonl and counted in the summary. Data is
generated in tmp_path."""

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import run_cli as run
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import draw, encode
from stoker.tools.pack import Reading, pack
from stoker.tools.pack.sources import base


def samples(split_dir: Path) -> dict[str, dict]:
    """path -> the sample's json, read with webdataset; every input at most once."""
    import webdataset as wds

    m = Manifest.load(split_dir)
    got = {}
    for s in wds.WebDataset([str(split_dir / x.name) for x in m.shards], shardshuffle=False, empty_check=False):
        meta = json.loads(s["json"])
        assert meta["path"] not in got, meta["path"]
        got[meta["path"]] = meta
    return got


def rejects(out: Path) -> dict[str, str]:
    rows = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    got = {r["path"]: r["reason"] for r in rows}
    assert len(got) == len(rows), rows  # every reject listed once
    return got


def jpeg(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(draw("circles", (40, 30), random.Random(seed))))
    return path


def test_the_identity_rule_is_the_file_for_paths_and_the_normalized_url_for_urls(tmp_path):
    a = jpeg(tmp_path / "d" / "a.jpg", 0)
    os.symlink("a.jpg", tmp_path / "d" / "link.jpg")
    os.link(a, tmp_path / "d" / "hard.jpg")
    key = base.input_identity(a)
    for other in ("d/link.jpg", "d/hard.jpg", "d/../d/a.jpg"):
        assert base.input_identity(tmp_path / other) == key, other
    assert base.input_identity(jpeg(tmp_path / "d" / "b.jpg", 0)) != key  # the same bytes, another file
    assert base.input_identity(tmp_path / "missing.jpg") == base.input_identity(tmp_path / "d" / ".." / "missing.jpg")
    assert base.input_identity("HTTP://Host:8000/ds/./x/../a.jpg") == base.input_identity("http://host:8000/ds/a.jpg")
    assert base.input_identity("s3://b/ds/a//b.jpg") != base.input_identity("s3://b/ds/a/b.jpg")  # another key


def test_a_csv_reaching_one_image_by_two_paths_packs_it_once_and_lists_the_other(tmp_path):
    img = tmp_path / "data" / "img"
    for name, seed in (("a", 0), ("b", 1), ("c", 2), ("d", 3)):
        jpeg(img / f"{name}.jpg", seed)
    os.link(img / "b.jpg", img / "b_hard.jpg")
    os.symlink("c.jpg", img / "c_link.jpg")
    absolute = str(img / "a.jpg")
    (tmp_path / "data" / "list.csv").write_text(
        "\n".join(
            [
                "img/a.jpg,cat",
                f"{absolute},dog",  # the same file, absolute, another target: which is right?
                "img/b.jpg,cat",
                "img/b_hard.jpg,cat",  # a hard link, the same target
                "img/c.jpg,dog",
                "img/c_link.jpg,dog",  # a symlink
                "img/d.jpg,cat",
            ]
        )
        + "\n"
    )
    rc, out, err = run("pack", tmp_path / "data" / "list.csv", tmp_path / "out", "-q", "--workers", "1")
    assert rc == 0, err
    got = samples(tmp_path / "out" / "train")
    assert {p: m["class"] for p, m in got.items()} == {"img/b.jpg": "cat", "img/c.jpg": "dog", "img/d.jpg": "cat"}
    differ = "listed on lines 1 (cat) and 2 (dog) with different targets"
    assert rejects(tmp_path / "out") == {
        "img/a.jpg": f"same file as {absolute}, {differ}",
        absolute: f"same file as img/a.jpg, {differ}",
        "img/b_hard.jpg": "same file as img/b.jpg (line 3)",
        "img/c_link.jpg": "same file as img/c.jpg (line 5)",
    }
    assert "train          3         4" in out and "4 rejected inputs listed in" in out  # the summary counts them


def test_a_pairs_csv_reaching_one_image_by_two_paths_packs_it_once(tmp_path):
    root = tmp_path / "seg"
    (root / "img").mkdir(parents=True)
    (root / "gt").mkdir()
    for k in range(3):
        Image.new("L", (40, 30), 40 * k).save(root / "img" / f"{k}.png")
        Image.fromarray(np.full((30, 40), k, np.uint8), "L").save(root / "gt" / f"{k}.png")
    os.symlink("0.png", root / "img" / "zero.png")
    os.link(root / "img" / "1.png", root / "img" / "one.png")
    os.symlink("2.png", root / "gt" / "two.png")  # another path to the same mask: the same pair
    rows = ["image,mask", "img/0.png,gt/0.png", "img/1.png,gt/1.png", "img/2.png,gt/2.png"]
    rows += ["img/zero.png,gt/0.png", "img/one.png,gt/2.png", f"{root / 'img' / '2.png'},gt/two.png"]
    (root / "pairs.csv").write_text("\n".join(rows) + "\n")
    result = pack(root / "pairs.csv", tmp_path / "out", workers=1)
    assert sorted(samples(tmp_path / "out" / "train")) == ["img/0.png", "img/2.png"]
    differ = "listed on lines 3 (gt/1.png) and 6 (gt/2.png) with different masks"
    assert rejects(tmp_path / "out") == {
        "img/zero.png": "same file as img/0.png (line 2)",
        "img/one.png": f"same file as img/1.png, {differ}",
        "img/1.png": f"same file as img/one.png, {differ}",
        str(root / "img" / "2.png"): "same file as img/2.png (line 4)",
    }
    assert result.rejected == 4 and result.packed == 2


def test_a_file_reached_from_train_and_val_is_packed_once_in_train(tmp_path):
    tree = tmp_path / "tree"
    for split in ("train", "val"):
        for c in ("circles", "rings"):
            jpeg(tree / split / c / f"{split}_{c}.jpg", hash((split, c)) % 1000)
    os.link(tree / "train" / "rings" / "train_rings.jpg", tree / "val" / "rings" / "leak.jpg")
    result = pack(tree, tmp_path / "out", workers=1)
    assert sorted(samples(tmp_path / "out" / "val")) == ["val/circles/val_circles.jpg", "val/rings/val_rings.jpg"]
    assert rejects(tmp_path / "out") == {"val/rings/leak.jpg": "same file as train/rings/train_rings.jpg"}
    assert result.splits["val"]["rejected"] == 1


def test_a_mask_tree_lists_a_second_path_to_an_image_and_a_split_list_keeps_that_reason(tmp_path):
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    for k in range(4):
        Image.new("RGB", (40, 30), (60 * k, 0, 0)).save(images / f"{k}.png")
        Image.fromarray(np.full((30, 40), k, np.uint8), "L").save(masks / f"{k}.png")
    os.link(images / "0.png", images / "4.png")  # one image under two names
    Image.fromarray(np.full((30, 40), 0, np.uint8), "L").save(masks / "4.png")
    Image.new("RGB", (40, 30), (0, 200, 0)).save(images / "5.png")
    os.symlink("1.png", masks / "5.png")  # one mask may serve two images
    (tmp_path / "val.txt").write_text("3\n4\n")
    pack(images, tmp_path / "out", masks=masks, reading=Reading(val_list=tmp_path / "val.txt"), workers=1)
    assert sorted(samples(tmp_path / "out" / "train")) == ["0.png", "1.png", "2.png", "5.png"]
    assert sorted(samples(tmp_path / "out" / "val")) == ["3.png"]
    got = rejects(tmp_path / "out")
    assert got["4.png"] == "same file as 0.png"  # not "listed in val.txt line 2 but not in SRC"


def test_parquet_rows_naming_one_file_pack_it_once(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    repo = tmp_path / "repo"
    a, b = jpeg(repo / "photos" / "a.jpg", 0), jpeg(repo / "photos" / "b.jpg", 1)
    os.symlink("a.jpg", repo / "photos" / "a_link.jpg")

    def table(cells):
        return pa.table({"image": pa.array(cells, image), "label": pa.array([k % 2 for k in range(len(cells))])})

    inline = [{"bytes": a.read_bytes(), "path": "a.jpg"}] * 2  # bytes in the row: no file, never "the same"
    train = inline + [
        {"bytes": None, "path": "photos/a.jpg"},
        {"bytes": None, "path": "photos/b.jpg"},
        {"bytes": None, "path": str(a)},  # absolute
        {"bytes": None, "path": "photos/a_link.jpg"},  # a symlink
    ]
    pq.write_table(table(train), repo / "train.parquet", row_group_size=2)  # group 0 has no null bytes
    pq.write_table(table([{"bytes": None, "path": "photos/b.jpg"}]), repo / "validation.parquet")
    result = pack(repo, tmp_path / "out", workers=1)
    assert sorted(samples(tmp_path / "out" / "train")) == [f"train.parquet#{k}" for k in range(4)]
    assert rejects(tmp_path / "out") == {
        "train.parquet#4": "same file as photos/a.jpg (train.parquet#2)",
        "train.parquet#5": "same file as photos/a.jpg (train.parquet#2)",
        "validation.parquet#0": "same file as photos/b.jpg (train.parquet#3)",
    }
    assert result.rejected == 3 and b.exists()
