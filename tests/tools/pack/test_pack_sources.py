"""The pack sources beyond folders and class CSVs: parquet tables as Hugging Face `datasets` writes
them (local and s3://), image,mask pairs CSVs, official split lists, ;-delimited CSVs, and a
source reader registered from outside the package, run through pack, the Loader and train."""

import io
import json
import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import run_cli as run
from stoker.errors import UsageError
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import draw, encode
from stoker.tools.pack import Reading, pack
from stoker.tools.pack.sources import FileReader, Item, Scan, reader_names, register_reader, registry

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
CLASSES = ("circles", "rings", "squares")
IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def samples(split_dir: Path) -> dict[str, dict]:
    """path -> the sample's members, read with webdataset."""
    import webdataset as wds

    m = Manifest.load(split_dir)
    return {
        json.loads(s["json"])["path"]: s
        for s in wds.WebDataset([str(split_dir / x.name) for x in m.shards], shardshuffle=False, empty_check=False)
    }


def rejects(out: Path) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}


def hf_table(n: int, *, seed: int = 0, label: str = "classlabel", mask: bool = False):
    """A table as `datasets` writes it: an `image` struct of bytes/path and a target column."""
    rng = random.Random(seed)
    images, labels, masks = [], [], []
    for k in range(n):
        c = k % 3
        images.append({"bytes": encode(draw(CLASSES[c], (40, 30), rng)), "path": f"img_{k}.jpg"})
        labels.append(c)
        m = Image.fromarray(np.full((30, 40), c, np.uint8), "L")
        buf = io.BytesIO()
        m.save(buf, "PNG")
        masks.append({"bytes": buf.getvalue(), "path": None})
    columns = {"image": pa.array(images, IMAGE)}
    features = {"image": {"_type": "Image"}}
    if label == "classlabel":
        columns["label"] = pa.array(labels, pa.int64())
        features["label"] = {"_type": "ClassLabel", "names": list(CLASSES)}
    elif label == "float":
        columns["age"] = pa.array([18.0 + 2 * k for k in range(n)], pa.float64())
    elif label == "multilabel":
        columns["tags"] = pa.array([sorted({c, (c + 1) % 3}) for c in labels], pa.list_(pa.int64()))
        features["tags"] = {"_type": "Sequence", "feature": {"_type": "ClassLabel", "names": list(CLASSES)}}
    if mask:
        columns["annotation"] = pa.array(masks, IMAGE)
    table = pa.table(columns)
    return table.replace_schema_metadata({b"huggingface": json.dumps({"info": {"features": features}}).encode()})


def test_a_hugging_face_parquet_repository_packs_its_splits_with_class_names(tmp_path):
    data = tmp_path / "repo" / "data"
    data.mkdir(parents=True)
    train = hf_table(20)
    rows = train.to_pylist()
    rows[3]["image"] = {"bytes": None, "path": None}  # hostile: no bytes, no path
    (tmp_path / "repo" / "data" / "on_disk.jpg").write_bytes(rows[4]["image"]["bytes"])
    rows[4]["image"] = {"bytes": None, "path": "on_disk.jpg"}  # bytes null, path relative to the parquet's folder
    rows[5]["image"] = {"bytes": None, "path": "missing.jpg"}
    pq.write_table(
        pa.Table.from_pylist(rows, schema=train.schema), data / "train-00000-of-00001.parquet", row_group_size=6
    )
    pq.write_table(hf_table(6, seed=1), data / "validation-00000-of-00001.parquet")
    pq.write_table(hf_table(4, seed=2), data / "test-00000-of-00001.parquet")
    rc, out, err = run("pack", tmp_path / "repo", tmp_path / "out", "-q", "--workers", "2")
    assert rc == 0, err
    assert "train         18         2        4" in out and "val            6         0        0" in out
    assert "targets: class, 3 classes" in out
    assert rejects(tmp_path / "out") == {
        "data/train-00000-of-00001.parquet#3": "image is empty (no bytes, no path)",
        "data/train-00000-of-00001.parquet#5": "unreadable: errno 2 (No such file or directory)",
    }
    got = samples(tmp_path / "out" / "train")
    assert Manifest.load(tmp_path / "out" / "train").classes == list(CLASSES)
    for k in (0, 4, 7, 19):
        s = got[f"data/train-00000-of-00001.parquet#{k}"]
        assert int(s["cls"]) == k % 3
        assert s["jpg"] == (rows[k]["image"]["bytes"] or (data / "on_disk.jpg").read_bytes())  # copied as it was
    assert len(samples(tmp_path / "out" / "val")) == 6


def test_parquet_targets_float_multilabel_and_masks(tmp_path):
    pq.write_table(hf_table(12, label="float"), tmp_path / "ages.parquet")
    rc, out, _ = run("pack", tmp_path / "ages.parquet", tmp_path / "f", "-q", "--workers", "1")
    assert rc == 0 and "targets: float, 1 column (age: mean 29, std 6.9" in out
    m = Manifest.load(tmp_path / "f" / "train")
    assert m.target.columns == ("age",) and m.target.stats.min == (18.0,) and m.target.stats.max == (40.0,)
    pq.write_table(hf_table(9, label="multilabel"), tmp_path / "tags.parquet")
    pack(tmp_path / "tags.parquet", tmp_path / "ml", workers=1)
    got = samples(tmp_path / "ml" / "train")
    assert np.load(io.BytesIO(got["tags.parquet#4"]["labels.npy"])).tolist() == [1, 2]
    assert Manifest.load(tmp_path / "ml" / "train").classes == list(CLASSES)
    pq.write_table(hf_table(9, label="none", mask=True), tmp_path / "seg.parquet")
    rc, out, _ = run("pack", tmp_path / "seg.parquet", tmp_path / "seg", "-q", "--num-classes", "3", "--workers", "1")
    assert rc == 0 and "targets: mask, 3 classes, 255 ignored\nmasks: classes 0..2 found" in out
    mask = np.asarray(Image.open(io.BytesIO(samples(tmp_path / "seg" / "train")["seg.parquet#5"]["mask.png"])))
    assert mask.shape == (30, 40) and set(mask.reshape(-1).tolist()) == {2}


def test_parquet_columns_chosen_by_flag_or_a_one_line_error(tmp_path):
    t = hf_table(6)
    t = t.append_column("age", pa.array([1.5] * 6)).append_column("score", pa.array([2.5] * 6))
    pq.write_table(t.drop_columns(["label"]), tmp_path / "two.parquet")
    rc, _, err = run("pack", tmp_path / "two.parquet", tmp_path / "o1", "-q")
    assert rc == 2 and err.strip() == (
        f"stoker pack: error: {tmp_path / 'two.parquet'}: which column is the target? choose with --target-column "
        "NAME (columns: image, age, score; the image is 'image')"
    )
    rc, out, _ = run("pack", tmp_path / "two.parquet", tmp_path / "o2", "-q", "--target-column", "age,score")
    assert rc == 0 and "targets: float, 2 columns (age: mean 1.5" in out
    rc, _, err = run("pack", tmp_path / "two.parquet", tmp_path / "o3", "-q", "--image-column", "nope")
    assert rc == 2 and "--image-column 'nope' is not a column of" in err and len(err.splitlines()) == 1
    with pytest.raises(UsageError, match="^Reading.image_column 'nope' is not a column of"):  # from Python: the field
        pack(tmp_path / "two.parquet", tmp_path / "o4", reading=Reading(image_column="nope"))


def test_a_missing_pyarrow_names_the_extra(tmp_path, monkeypatch):
    import builtins

    pq.write_table(hf_table(3), tmp_path / "t.parquet")
    real = builtins.__import__

    def no_pyarrow(name, *a, **kw):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    rc, _, err = run("pack", tmp_path / "t.parquet", tmp_path / "out", "-q")
    assert rc == 2 and err.strip() == (
        "stoker pack: error: reading a parquet SRC needs pyarrow, which is not installed: pip install stoker[parquet]"
    )


def test_a_parquet_on_s3_packs_like_the_local_file(tmp_path, s3):
    pq.write_table(hf_table(10), tmp_path / "train.parquet")
    bucket = s3.bucket()
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.put(str(tmp_path / "train.parquet"), f"{bucket}/ds/data/train-00000.parquet")
    pack(tmp_path / "train.parquet", tmp_path / "local", workers=1)
    assert pack(f"s3://{bucket}/ds", tmp_path / "remote", workers=2).packed == 10
    local, remote = samples(tmp_path / "local" / "train"), samples(tmp_path / "remote" / "train")
    assert sorted(s["jpg"] for s in local.values()) == sorted(s["jpg"] for s in remote.values())
    assert {k.split("#")[1]: int(s["cls"]) for k, s in local.items()} == {
        k.split("#")[1]: int(s["cls"]) for k, s in remote.items()
    }


def test_a_parquet_folder_over_plain_http_packs_like_the_local_folder(tmp_path):
    from storage_servers import http_server

    data = tmp_path / "www" / "ds" / "data"
    data.mkdir(parents=True)
    pq.write_table(hf_table(10), data / "train-00000-of-00002.parquet", row_group_size=4)
    pq.write_table(hf_table(5, seed=1), data / "train-00001-of-00002.parquet")
    pq.write_table(hf_table(4, seed=2), data / "validation-00000-of-00001.parquet")
    (tmp_path / "www" / "ds" / "README.md").write_text("a dataset card, not a table\n")
    local = pack(tmp_path / "www" / "ds", tmp_path / "local", workers=1)
    with http_server(tmp_path / "www") as base:  # the folder URL answers with an HTML index page
        remote = pack(f"{base}/ds", tmp_path / "remote", workers=2)
        single = pack(f"{base}/ds/data/validation-00000-of-00001.parquet", tmp_path / "one", workers=1)
    assert (local.packed, remote.packed, single.packed) == (19, 19, 4)
    for split in ("train", "val"):
        shards = sorted(p.name for p in (tmp_path / "local" / split).glob("*.tar"))
        assert shards and shards == sorted(p.name for p in (tmp_path / "remote" / split).glob("*.tar"))
        for name in shards:  # the same rows, names and order: the same bytes
            assert (tmp_path / "local" / split / name).read_bytes() == (tmp_path / "remote" / split / name).read_bytes()


def test_a_file_that_is_not_parquet_is_one_line_naming_it(tmp_path):
    (tmp_path / "ds").mkdir()
    pq.write_table(hf_table(3), tmp_path / "ds" / "train-0.parquet")
    (tmp_path / "ds" / "train-1.parquet").write_text("<html><body>Index of /ds</body></html>\n")
    rc, _, err = run("pack", tmp_path / "ds", tmp_path / "out", "-q", "--workers", "1")
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"stoker pack: error: {tmp_path / 'ds' / 'train-1.parquet'} is not a readable parquet file: ")
    assert "magic bytes" in err


def test_a_bug_while_reading_a_row_raises_instead_of_rejecting_every_row(tmp_path, monkeypatch):
    from stoker.tools.pack.sources import parquet

    pq.write_table(hf_table(6), tmp_path / "t.parquet")

    def broken(*a, **k):  # an API change or a typo: not a damaged input
        raise TypeError("unexpected keyword argument 'columns'")

    monkeypatch.setattr(parquet, "_column", broken)
    with pytest.raises(TypeError, match="unexpected keyword"):
        pack(tmp_path / "t.parquet", tmp_path / "out", workers=1)

    def damaged(*a, **k):  # what pyarrow raises for a damaged row group: that row's reject
        raise pa.ArrowInvalid("Couldn't deserialize thrift: TProtocolException: Invalid data")

    monkeypatch.setattr(parquet, "_column", damaged)
    pq.write_table(hf_table(6), tmp_path / "t2.parquet")
    rc, _, err = run("pack", tmp_path / "t2.parquet", tmp_path / "out2", "-q", "--workers", "1")
    assert rc == 1 and "6 of 6 inputs were rejected for one reason: unreadable: Couldn't deserialize thrift" in err


def _seg_pairs(root: Path, n: int) -> Path:
    """Cityscapes-like names: x_leftImg8bit.png with x_gtFine_labelIds.png."""
    (root / "img").mkdir(parents=True)
    (root / "gt").mkdir()
    rows = ["image,mask"]
    for k in range(n):
        Image.new("L", (40, 30), 20 * k).save(root / "img" / f"c{k}_leftImg8bit.png")
        Image.fromarray(np.full((30, 40), k % 4, np.uint8), "L").save(root / "gt" / f"c{k}_gtFine_labelIds.png")
        rows.append(f"img/c{k}_leftImg8bit.png,gt/c{k}_gtFine_labelIds.png")
    (root / "pairs.csv").write_text("\n".join(rows) + "\n")
    return root / "pairs.csv"


def test_a_pairs_csv_packs_masks_never_classes(tmp_path):
    csv = _seg_pairs(tmp_path / "city", 8)
    (tmp_path / "city" / "gt" / "c5_gtFine_labelIds.png").unlink()  # hostile: a missing mask
    rc, out, err = run("pack", csv, tmp_path / "out", "-q", "--workers", "2")
    assert rc == 0, err
    assert "targets: mask, classes not declared, 255 ignored\nmasks: classes 0..3 found" in out
    assert rejects(tmp_path / "out") == {
        "img/c5_leftImg8bit.png": "mask unreadable: errno 2 (No such file or directory)"
    }
    got = samples(tmp_path / "out" / "train")
    assert len(got) == 7 and json.loads(got["img/c6_leftImg8bit.png"]["json"])["mask"] == "gt/c6_gtFine_labelIds.png"
    assert set(np.asarray(Image.open(io.BytesIO(got["img/c6_leftImg8bit.png"]["mask.png"]))).reshape(-1)) == {2}
    # without a header too: the second cells name image files, so they are masks, not class names
    csv.write_text("\n".join(csv.read_text().splitlines()[1:]) + "\n")
    assert pack(csv, tmp_path / "noheader", workers=1).targets.startswith("mask")


def test_official_split_lists_choose_the_splits(tmp_path):
    from stoker.tools.common.synth import make_segmentation_tree

    images, masks = make_segmentation_tree(tmp_path / "voc", n=10, seed=0, min_side=32, max_side=40)
    (tmp_path / "train.txt").write_text("00000\n00001\n00002\n00003\n00004\n00005\n")
    (tmp_path / "val.txt").write_text("# VOC style: stems\n00006\n00007\n00042\n")
    rc, out, err = run(
        "pack", images, tmp_path / "out", "--masks", masks, "-q", "--workers", "1",
        "--train-list", tmp_path / "train.txt", "--val-list", tmp_path / "val.txt",
    )  # fmt: skip
    assert rc == 0, err
    assert "train          6         0        2" in out and "val            2         1        0" in out
    assert sorted(samples(tmp_path / "out" / "val")) == ["00006.png", "00007.png"]
    assert rejects(tmp_path / "out") == {"00042": "listed in val.txt line 4 but not in SRC"}
    # val list alone: the rest is train; with --val-fraction it is one line
    pack(images, tmp_path / "v", masks=masks, reading=Reading(val_list=tmp_path / "val.txt"), workers=1)
    assert len(samples(tmp_path / "v" / "train")) == 8
    rc, _, err = run("pack", images, tmp_path / "x", "--masks", masks, "--val-list", tmp_path / "val.txt",
                     "--val-fraction", "0.2", "-q")  # fmt: skip
    assert rc == 2 and "--val-list and --val-fraction both choose the val split: give one" in err


def test_images_in_no_list_are_skipped_even_without_a_mask(tmp_path):
    # VOC: JPEGImages holds every photo, SegmentationClass and the lists only the segmented ones
    from stoker.tools.common.synth import make_segmentation_tree

    images, masks = make_segmentation_tree(tmp_path / "voc", n=8, seed=0, min_side=32, max_side=40)
    for stem in ("00006", "00007"):
        (masks / f"{stem}.png").unlink()
    (tmp_path / "train.txt").write_text("00000\n00001\n00002\n00007\n")
    (tmp_path / "val.txt").write_text("00003\n")
    rc, out, err = run(
        "pack", images, tmp_path / "out", "--masks", masks, "-q", "--workers", "1",
        "--train-list", tmp_path / "train.txt", "--val-list", tmp_path / "val.txt",
    )  # fmt: skip
    assert rc == 0, err
    assert "train          3         1        3" in out and "val            1         0        0" in out
    assert rejects(tmp_path / "out") == {"00007.png": f"no mask: expected 00007.png in {masks}"}


def test_a_semicolon_csv_with_decimal_commas_reads_right(tmp_path):
    (tmp_path / "im").mkdir()
    rows = ["path;age"]
    for k in range(6):
        (tmp_path / "im" / f"{k}.jpg").write_bytes(encode(draw("circles", (40, 30), random.Random(k))))
        rows.append(f"im/{k}.jpg;{40 + k},5")
    (tmp_path / "eu.csv").write_text("\n".join(rows) + "\n")
    rc, out, _ = run("pack", tmp_path / "eu.csv", tmp_path / "out", "-q", "--workers", "1")
    assert rc == 0 and "targets: float, 1 column (age: mean 43, std 1.71, 40.5..45.5)" in out
    # a ; that only appears after the first line cannot be told from a path: one line naming it
    (tmp_path / "late.csv").write_text("im/0.jpg,1\nim/1.jpg;2\n")
    rc, _, err = run("pack", tmp_path / "late.csv", tmp_path / "o2", "-q")
    assert rc == 2 and "has no ',' but a ';'" in err and len(err.splitlines()) == 1


class ZipReader(FileReader):
    """A source from outside the package: a zip of ``<class>/<name>.jpg`` members."""

    name, priority = "test-zip", 5
    summary = "a zip of class folders"

    @classmethod
    def recognizes(cls, src, options):
        return isinstance(src, Path) and src.suffix == ".zip"

    def scan(self):
        with zipfile.ZipFile(self.src) as z:
            names = sorted(n for n in z.namelist() if n.endswith(".jpg"))
        classes = sorted({n.split("/")[0] for n in names})
        items = [Item(n, classes.index(n.split("/")[0])) for n in names]
        return Scan(classes, {"train": items})

    def read(self, rel, max_bytes):
        with zipfile.ZipFile(self.src) as z:
            return z.read(rel), None


@pytest.fixture
def zip_source(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", registry._REGISTRY.copy())  # undone after the test
    register_reader(ZipReader)
    return ZipReader


def test_a_source_from_outside_runs_through_pack_the_loader_and_train(zip_source, tmp_path):
    rng = random.Random(0)
    with zipfile.ZipFile(tmp_path / "photos.zip", "w") as z:
        for c in CLASSES:
            for k in range(8):
                z.writestr(f"{c}/{k}.jpg", encode(draw(c, (48, 40), rng)))
    assert "test-zip" in reader_names()
    rc, out, err = run("pack", tmp_path / "photos.zip", tmp_path / "out", "--val-fraction", "0.25", "-q")
    assert rc == 0, err
    assert "train         18" in out and "val            6" in out
    from stoker.pipeline import Loader

    with Loader(tmp_path / "out" / "train", batch_size=6, crop=32, backend="pil", threads=1) as loader:
        labels = sorted(int(v) for _, y in loader for v in y)
    assert labels == sorted([0] * 6 + [1] * 6 + [2] * 6)
    rc, out, err = run(
        "train", tmp_path / "out", "--out", tmp_path / "run", "--epochs", "1", "--batch-size", "6",
        "--crop", "32", "--no-progress", "--json", "--threads", "1", "--backend", "pil",
    )  # fmt: skip
    assert rc == 0, err
    assert json.loads(out)["steps"] == 3


def test_a_folder_of_images_beside_its_csv_is_told_to_pack_the_csv_and_one_class_is_said(tmp_path):
    from stoker.tools.common.synth import make_regression_csv

    csv = make_regression_csv(tmp_path / "ages", n=12, low=18, high=80, column="age", min_side=32, max_side=48)
    rc, _, err = run("pack", tmp_path / "ages", tmp_path / "out", "-q", "--workers", "1")
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "holds targets.csv beside a single folder of images (images/): pack the CSV" in err
    assert f"stoker pack {csv} OUT" in err and not (tmp_path / "out" / "train").exists()
    csv.unlink()  # one class folder alone packs, and the summary says what it is worth
    rc, out, _ = run("pack", tmp_path / "ages", tmp_path / "out", "-q", "--workers", "1")
    assert rc == 0 and "targets: class, 1 class (one class: nothing for a classifier to learn" in out
