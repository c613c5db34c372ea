import io
import json
import random
import tarfile

import numpy as np
import pytest

from stoker.pipeline import augment
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.samples import BYTES_PER_SAMPLE, SampleIndex, image_size, open_split
from stoker.pipeline.shards.writer import ShardWriter
from stoker.tools.common.synth import draw


def _jpeg(size=(50, 40), seed=0, **kw):
    buf = io.BytesIO()
    draw("circles", size, random.Random(seed)).save(buf, "JPEG", quality=90, **kw)
    return buf.getvalue()


def _png(size=(30, 20)):
    buf = io.BytesIO()
    draw("squares", size, random.Random(1)).save(buf, "PNG")
    return buf.getvalue()


def test_index_reads_bytes_labels_keys_like_tarfile(tiny_shards):
    root = tiny_shards(n=20, per_shard=8)
    idx = SampleIndex(root / "train", with_json=True)
    assert len(idx) == 20 and idx.num_skipped == 0 and list(idx.valid) == list(range(20))
    for i in (0, 7, 8, 19):
        with tarfile.open(idx.shard_path(i)) as tar:
            jpg = tar.extractfile(f"{i:09d}.jpg").read()
            meta = tar.extractfile(f"{i:09d}.json").read()
        assert idx.image(i).tobytes() == jpg
        assert idx.key(i) == f"{i:09d}"
        assert idx.label(i) == i % 6
        assert idx.meta(i) == meta
    assert list(idx.labels(np.array([3, 12, 19]))) == [3, 0, 1]
    enc, wh = idx.images(np.array([5, 17]))
    assert json.loads(idx.meta(5))["width"] == wh[0][0]


def test_bookkeeping_held_is_per_shard_the_samples_are_mapped(tiny_shards):
    root = tiny_shards(n=40, per_shard=16)
    for with_json in (False, True):
        idx = SampleIndex(root / "train", with_json=with_json)
        assert idx.nbytes == 8 * (3 + 1)  # the shard starts; per-sample records stay in the mapped table
        table = (root / "train" / "stoker.index").stat().st_size
        assert table == 128 + 8 * (4 + 3) + 40 * BYTES_PER_SAMPLE  # header, starts, .idx sizes, records
        assert len(idx.valid) == 40 and idx.nbytes == 8 * 4 + 8 * 40  # valid, built when asked for


def test_image_size_guard():
    jpg = _jpeg((50, 40))
    assert image_size(jpg) == (50, 40)
    assert image_size(_jpeg((33, 17), progressive=True)) == (33, 17)
    assert image_size(_png((30, 20))) == (30, 20)
    assert image_size(jpg[: len(jpg) // 2]) is None  # truncated: no EOI
    assert image_size(_png()[:-20]) is None
    assert image_size(b"not an image at all, really not") is None
    assert image_size(b"") is None
    # a window into a larger buffer
    blob = b"x" * 100 + jpg + b"y" * 10
    assert image_size(blob, 100, len(jpg)) == (50, 40)
    # lossless JPEG (SOF3) is not something the decoders handle: rejected
    sof = jpg.find(b"\xff\xc0")
    assert image_size(jpg[:sof] + b"\xff\xc3" + jpg[sof + 2 :]) is None


def test_skips_from_manifest_and_missing_components(tmp_path):
    split = tmp_path / "s"
    split.mkdir()
    with ShardWriter(split / "a.tar") as w:
        for i in range(6):
            comps = {"jpg": _jpeg(seed=i), "cls": str(i).encode()}
            if i == 2:
                del comps["cls"]
            if i == 4:
                comps = {"png": _png(), "cls": b"4"}
            w.write(f"k{i}", comps)
    Manifest(
        num_samples=6, classes=[str(i) for i in range(6)], shards=[w.info], pack={"skip": [["a.tar", 1], "k5"]}
    ).save(split)
    idx = open_split(split)
    assert idx.num_skipped == 3
    assert list(idx.valid) == [0, 3, 4]
    assert image_size(idx.image(4).tobytes()) == (30, 20)


def test_repeated_component_is_never_loaded_even_without_a_manifest_skip(tmp_path):
    """a.jpg a.cls a.jpg a.cls (one key twice in a row): an older manifest may not skip it."""
    split = tmp_path / "s"
    split.mkdir()
    with tarfile.open(split / "a.tar", "w") as tar:
        for name, data in (
            ("a.jpg", _jpeg(seed=1)),
            ("a.cls", b"1"),
            ("a.jpg", _jpeg(seed=2)),
            ("a.cls", b"2"),
            ("b.jpg", _jpeg(seed=3)),
            ("b.cls", b"0"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    from stoker.pipeline.fsutil import sha256_file
    from stoker.pipeline.shards.idx import index_tar, write_idx
    from stoker.pipeline.shards.manifest import ShardInfo

    write_idx(split / "a.idx", index_tar(split / "a.tar"))
    info = ShardInfo("a.tar", 2, (split / "a.tar").stat().st_size, sha256_file(split / "a.tar"))
    Manifest(num_samples=2, classes=["0", "1", "2"], shards=[info]).save(split)
    idx = open_split(split)
    assert list(idx.valid) == [1] and idx.num_skipped == 1 and idx.label(1) == 0


def test_idx_pointing_outside_the_tar_is_one_line(tmp_path):
    from stoker.errors import IdxFormatError

    split = tmp_path / "s"
    split.mkdir()
    with ShardWriter(split / "a.tar") as w:
        for i in range(3):
            w.write(f"k{i}", {"jpg": _jpeg(seed=i), "cls": b"0"})
    Manifest(num_samples=3, classes=["0"], shards=[w.info]).save(split)
    text = (split / "a.idx").read_text().splitlines()
    fields = text[3].split()
    fields[5] = str(10**9)
    (split / "a.idx").write_text("\n".join(text[:3] + [" ".join(fields)]) + "\n")
    with pytest.raises(IdxFormatError, match=r"a\.idx: sample 2 points outside its tar .*\(rerun `stoker index "):
        open_split(split)


@pytest.mark.parametrize("wh", [(500, 375), (64, 64), (1000, 10), (10, 1000)])
def test_random_resized_crop_semantics(wh):
    n = 2000
    boxes, flip = augment.random_resized_crop(np.tile(wh, (n, 1)), np.arange(n), seed=3, epoch=1)
    x, y, w, h = boxes.T
    W, H = wh
    assert (x >= 0).all() and (y >= 0).all() and (x + w <= W).all() and (y + h <= H).all()
    assert (w > 0).all() and (h > 0).all()
    if wh[0] == 1000:  # every attempt fails: torchvision's fallback, ratio clamped to 4/3
        assert set(map(tuple, boxes)) == {(493, 0, 13, 10)}
    elif wh[1] == 1000:
        assert set(map(tuple, boxes)) == {(0, 493, 10, 13)}
    else:
        frac = w * h / (W * H)
        assert frac.min() >= 0.07 and frac.max() <= 1.0
        assert 0.4 < frac.mean() < 0.7  # E[scale] of U(0.08, 1) is 0.54 (less the rejections)
        assert 0.4 < flip.mean() < 0.6
        ar = w / h
        assert ar.min() > 0.7 and ar.max() < 1.45


def test_crop_parameters_are_per_sample_not_per_batch():
    wh = np.array([[300, 200]] * 10)
    ids = np.arange(100, 110)
    all_at_once = augment.random_resized_crop(wh, ids, seed=0, epoch=2)
    one_by_one = [augment.random_resized_crop(wh[k : k + 1], ids[k : k + 1], seed=0, epoch=2) for k in range(10)]
    assert np.array_equal(all_at_once[0], np.concatenate([b for b, _ in one_by_one]))
    other_epoch = augment.random_resized_crop(wh, ids, seed=0, epoch=3)[0]
    assert not np.array_equal(all_at_once[0], other_epoch)


def test_center_crop_box():
    boxes = augment.center_crop(np.array([[400, 300], [300, 400], [64, 64]]), 224)
    assert boxes.tolist() == [[69, 19, 262, 262], [19, 69, 262, 262], [4, 4, 56, 56]]
