"""`stoker index` on foreign tars whose targets are not class indices: class names, float
members (.npy, .json), masks beside the image; and never exit 0 when most samples are dropped."""

import io
import json

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from stoker.errors import MostSkippedError, UsageError
from stoker.pipeline import Loader
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.cli import main as cli
from stoker.tools.verify import index, verify


def _jpeg(k, size=(32, 24)):
    buf = io.BytesIO()
    Image.new("RGB", size, (k * 30 % 255, 100, 50)).save(buf, "JPEG")
    return buf.getvalue()


def _write(path, samples):
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as w:
        for s in samples:
            w.write(s)
    return path


def test_text_labels_are_mapped_by_the_names_classes_gives(tmp_path):
    tar = _write(
        tmp_path / "s" / "a.tar", [{"__key__": f"{k}", "jpg": _jpeg(k), "cls": ["cat", "dog"][k % 2]} for k in range(6)]
    )
    result = index(tar, classes=["cat", "dog"], workers=1)
    assert result.skip == [] and result.classes == ["cat", "dog"]
    with Loader(tmp_path / "s", batch_size=6, train=False, crop=16, backend="pil", threads=0) as ld:
        ((_, y),) = list(ld)
    assert y.tolist() == [0, 1, 0, 1, 0, 1]
    # verify holds the split to what the Loader reads: the names --classes gave are labels
    report = verify(tmp_path / "s", workers=1)
    assert report.ok and sum(r.decoded for r in report.shards) == 6, report.problems


def test_most_samples_dropped_is_exit_1_with_the_manifest_written(tmp_path, capsys):
    samples = [{"__key__": f"{k}", "jpg": _jpeg(k), "cls": "cat" if k == 0 else "bird"} for k in range(4)]
    _write(tmp_path / "t" / "a.tar", samples)
    with pytest.raises(MostSkippedError) as e:
        index(tmp_path / "t", classes=["cat", "dog"], workers=1)
    assert e.value.result.skip == [["a.tar", k, "cls 'bird' is not one of the class names"] for k in (1, 2, 3)]
    capsys.readouterr()
    assert cli(["index", str(tmp_path / "t"), "--classes", "cat,dog", "-q"]) == 1
    out, err = capsys.readouterr()
    assert "3 of 4 samples" in err and "are marked to skip" in err and "stoker.json is written" in err
    assert err.strip().count("\n") == 0
    assert Manifest.load(tmp_path / "t").num_samples == 4 and "targets: class" in out


def test_float_npy_and_json_members_index_as_float_targets(tmp_path):
    samples = [{"__key__": f"{k}", "jpg": _jpeg(k), "npy": np.array([k, -k / 2], np.float64)} for k in range(5)]
    tar = _write(tmp_path / "f" / "a.tar", samples)
    result = index(tar, targets="float", target_member="npy", workers=1)
    assert result.target == "float, 2 columns (y0, y1)" and result.skip == []
    with Loader(tmp_path / "f", batch_size=5, train=False, crop=16, backend="pil", threads=0) as ld:
        ((_, y),) = list(ld)
    assert y.dtype.is_floating_point and y.shape == (5, 2) and y[:, 0].tolist() == [0, 1, 2, 3, 4]
    js = [{"__key__": f"{k}", "jpg": _jpeg(k), "json": json.dumps(float(k) if k != 3 else "x")} for k in range(4)]
    tar = _write(tmp_path / "j" / "a.tar", js)
    result = index(tar, targets="float", target_member="json", workers=1)
    assert result.target == "float, 1 column" and [s[1] for s in result.skip] == [3]


def test_a_target_member_no_sample_has_names_what_they_hold(tmp_path):
    tar = _write(tmp_path / "f" / "a.tar", [{"__key__": "0", "jpg": _jpeg(0), "txt": "1.5"}])
    with pytest.raises(UsageError, match=r"no sample .* has a 'target.npy' member \(they hold jpg, txt\): name"):
        index(tar, targets="float", workers=1)


def test_masks_beside_the_image_index_as_a_mask_split(tmp_path):
    def png(a):
        buf = io.BytesIO()
        Image.fromarray(a.astype(np.uint8), "L").save(buf, "PNG")
        return buf.getvalue()

    good = np.zeros((24, 32), np.uint8)
    good[:, 16:] = 2
    samples = [{"__key__": f"{k}", "jpg": _jpeg(k), "seg.png": png(good)} for k in range(3)]
    samples.append({"__key__": "3", "jpg": _jpeg(3), "seg.png": png(np.zeros((10, 10)))})  # wrong size
    samples.append({"__key__": "4", "jpg": _jpeg(4), "seg.png": png(np.full((24, 32), 9))})  # past the classes
    tar = _write(tmp_path / "m" / "a.tar", samples)
    result = index(tar, targets="mask", target_member="seg.png", num_classes=3, workers=1)
    assert result.target == "mask, 3 classes, 255 ignored"
    assert {i: why for _, i, why in result.skip} == {
        3: "mask is 10x10, its image 32x24",
        4: "mask value 9 is not below the split's 3 classes",
    }
    with Loader(tmp_path / "m", batch_size=3, train=False, crop=(24, 32), backend="pil", threads=0) as ld:
        ((_, masks),) = list(ld)
    assert masks.shape == (3, 24, 32) and set(masks.unique().tolist()) == {0, 2}
    assert verify(tmp_path / "m", workers=1).ok
