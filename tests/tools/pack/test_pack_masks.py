"""`stoker pack IMAGES OUT --masks MASKS`: pairing, the mask rules, the hostile cases, and that a
mask gets exactly its image's geometry (EXIF orientation, pack-time resize)."""

import io
import json

import numpy as np
import pytest
from PIL import Image

from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.samples import open_split
from stoker.tools.cli import main as cli
from stoker.tools.pack import Images, Masks, Shards, pack


def _pair(images, masks, name, size=(40, 30), mask=None, image=None, mask_ext="png"):
    images.mkdir(parents=True, exist_ok=True)
    masks.mkdir(parents=True, exist_ok=True)
    (image or Image.new("RGB", size, (90, 120, 200))).save(images / f"{name}.jpg")
    if mask is not False:
        m = mask if mask is not None else Image.fromarray(np.full(size[::-1], 1, np.uint8), "L")
        m.save(masks / f"{name}.{mask_ext}")


def _rejects(out):
    return {r["path"]: r["reason"] for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}


def _stored(split):
    idx = open_split(split, with_json=True)
    out = {}
    for i in idx.valid.tolist():
        enc, _ = idx.images(np.array([i]))
        (mask,), _ = idx.masks(np.array([i]))
        meta = json.loads(idx.meta(i))
        out[meta["path"]] = (Image.open(io.BytesIO(enc[0].tobytes())), Image.open(io.BytesIO(mask.tobytes())))
    return out


def test_hostile_mask_trees_are_listed_rejects_with_reasons(tmp_path):
    im, mk = tmp_path / "im", tmp_path / "mk"
    _pair(im, mk, "ok")
    _pair(im, mk, "nomask", mask=False)
    Image.new("L", (40, 30)).save(mk / "orphan.png")
    _pair(im, mk, "size", mask=Image.new("L", (41, 30)))
    _pair(im, mk, "rgb", mask=Image.new("RGB", (40, 30), (1, 2, 3)))
    _pair(im, mk, "alpha", mask=Image.new("LA", (40, 30)))
    _pair(im, mk, "lossy", mask=Image.new("L", (40, 30)), mask_ext="jpg")
    _pair(im, mk, "past", mask=Image.fromarray(np.full((30, 40), 7, np.uint8), "L"))
    _pair(im, mk, "ignored", mask=Image.fromarray(np.full((30, 40), 255, np.uint8), "L"))
    (mk / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    Image.new("RGB", (40, 30)).save(im / "broken.jpg")
    result = pack(im, tmp_path / "out", masks=Masks(mk, num_classes=5), workers=1)
    rejects = _rejects(tmp_path / "out")
    assert rejects == {
        "nomask.jpg": f"no mask: expected nomask.png in {mk}",
        "mk/orphan.png": "mask with no image",
        "size.jpg": "mask is 41x30, its image 40x30",
        "rgb.jpg": "RGB mask: a mask holds one class index per pixel; convert its colours to indices "
        "(a palette PNG, or an L image whose values are the classes)",
        "alpha.jpg": "mask has an alpha channel (LA): save it as a palette or L PNG",
        "lossy.jpg": "JPEG mask: JPEG is lossy, its values are not exact class indices; save masks as PNG",
        "past.jpg": "mask value 7 at (0, 0) is not below --num-classes 5 (255 is ignored)",
        "broken.jpg": rejects["broken.jpg"],
    }
    assert rejects["broken.jpg"].startswith("mask does not decode")
    assert result.packed == 2 and sorted(_stored(tmp_path / "out" / "train")) == ["ignored.jpg", "ok.jpg"]


def test_a_bug_in_the_mask_path_raises_and_a_broken_mask_is_still_a_reject(tmp_path, monkeypatch):
    from stoker.pipeline import imagedecode

    im, mk = tmp_path / "im", tmp_path / "mk"
    noisy = np.random.default_rng(0).integers(0, 5, (30, 40), np.uint8)  # a PNG of some length, to cut
    _pair(im, mk, "ok", mask=Image.fromarray(noisy, "L"))
    (mk / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    Image.new("RGB", (40, 30)).save(im / "broken.jpg")
    ok = (mk / "ok.png").read_bytes()
    (mk / "cut.png").write_bytes(ok[: len(ok) // 2])  # truncated in its pixel data
    Image.new("RGB", (40, 30)).save(im / "cut.jpg")
    opened = imagedecode.open_image

    def bug_for_masks(data, *, max_pixels):
        if data == ok:  # the one mask that decodes: its path goes on past the header
            raise TypeError("a bug in stoker's own code")
        return opened(data, max_pixels=max_pixels)

    monkeypatch.setattr(imagedecode, "open_image", bug_for_masks)
    with pytest.raises(TypeError, match="a bug in stoker's own code"):  # not "mask does not decode"
        pack(im, tmp_path / "out", masks=Masks(mk, num_classes=5), workers=1)
    monkeypatch.undo()
    pack(im, tmp_path / "again", masks=Masks(mk, num_classes=5), workers=1)
    rejects = _rejects(tmp_path / "again")
    assert set(rejects) == {"broken.jpg", "cut.jpg"}
    assert all(why.startswith("mask does not decode") for why in rejects.values()), rejects


def test_palette_and_16_bit_masks_keep_their_indices(tmp_path):
    im, mk = tmp_path / "im", tmp_path / "mk"
    values = np.arange(30 * 40, dtype=np.uint16).reshape(30, 40) % 6
    pal = Image.fromarray(values.astype(np.uint8), "P")
    pal.putpalette([255 - 40 * k for k in range(6) for _ in range(3)] + [0] * (256 - 6) * 3)
    _pair(im, mk, "palette", mask=pal)
    _pair(im, mk, "sixteen", mask=Image.fromarray(values))
    pack(im, tmp_path / "out", masks=mk, workers=1)
    for _, mask in _stored(tmp_path / "out" / "train").values():
        assert mask.mode == "L" and np.array_equal(np.asarray(mask), values.astype(np.uint8))


def test_16_bit_values_past_255_are_a_reject(tmp_path):
    im, mk = tmp_path / "im", tmp_path / "mk"
    _pair(im, mk, "big", mask=Image.fromarray(np.full((30, 40), 300, np.uint16)))
    _pair(im, mk, "ok")
    pack(im, tmp_path / "out", masks=mk, workers=1)
    assert _rejects(tmp_path / "out") == {"big.jpg": "mask values 300..300 do not fit 0..255 (uint8 masks)"}


def test_pack_time_resize_resizes_the_mask_with_nearest_neighbour(tmp_path):
    im, mk = tmp_path / "im", tmp_path / "mk"
    mask = np.zeros((90, 120), np.uint8)
    mask[:, 60:] = 2
    mask[45:, :] = 3
    _pair(im, mk, "big", size=(120, 90), mask=Image.fromarray(mask, "L"))
    pack(im, tmp_path / "out", masks=mk, images=Images(short_side=30), workers=1)
    ((image, stored),) = _stored(tmp_path / "out" / "train").values()
    assert image.size == stored.size == (40, 30)
    a = np.asarray(stored)
    assert set(np.unique(a)) == {0, 2, 3}  # nearest: no value between classes
    assert np.array_equal(a, np.asarray(Image.fromarray(mask).resize((40, 30), Image.NEAREST)))


def test_masks_default_to_no_pack_time_resize(tmp_path):
    im, mk = tmp_path / "im", tmp_path / "mk"
    _pair(im, mk, "big", size=(600, 400))
    m = Manifest.load(pack(im, tmp_path / "out", masks=mk, workers=1).out + "/train")
    assert m.pack["short_side"] == 0
    ((image, mask),) = _stored(tmp_path / "out" / "train").values()
    assert image.size == mask.size == (600, 400)


@pytest.mark.parametrize("drawn_on", ["stored", "upright"])
def test_an_exif_rotated_image_turns_its_mask_with_it(tmp_path, drawn_on):
    im, mk = tmp_path / "im", tmp_path / "mk"
    stored = np.zeros((30, 40), np.uint8)  # what the file holds: 40 wide, 30 tall
    stored[:10, :] = 1  # a band along the stored top edge
    picture = Image.fromarray(np.stack([stored * 200] * 3, -1))
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise
    im.mkdir(parents=True)
    mk.mkdir(parents=True)
    picture.save(im / "r.jpg", exif=exif.tobytes())
    upright = np.rot90(stored, -1)  # the band along the right edge once upright
    Image.fromarray(stored if drawn_on == "stored" else np.ascontiguousarray(upright), "L").save(mk / "r.png")
    pack(im, tmp_path / "out", masks=mk, workers=1)
    ((image, mask),) = _stored(tmp_path / "out" / "train").values()
    assert image.size == mask.size == (30, 40)
    assert np.array_equal(np.asarray(mask), upright)
    bright = np.asarray(image.convert("L")) > 100
    assert (bright == upright.astype(bool)).mean() > 0.97


def test_a_tree_that_is_not_parallel_is_one_line(tmp_path, capsys):
    im, mk = tmp_path / "im", tmp_path / "mk"
    for k in range(3):
        Image.new("RGB", (20, 20)).save((im.mkdir(exist_ok=True) or im) / f"img_{k}.jpg")
        Image.new("L", (20, 20)).save((mk.mkdir(exist_ok=True) or mk) / f"img_{k}_mask.png")
    assert cli(["pack", str(im), str(tmp_path / "out"), "--masks", str(mk), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no image of" in err and "masks must have the image's relative path and stem" in err


def test_train_and_val_trees_pair_split_by_split(tmp_path):
    im, mk = tmp_path / "im", tmp_path / "mk"
    for split in ("train", "val"):
        for k in range(2):
            _pair(im / split, mk / split, f"{split}{k}")
    result = pack(im, tmp_path / "out", masks=mk, workers=1)
    assert {s: t["samples"] for s, t in result.splits.items()} == {"train": 2, "val": 2}
    assert sorted(_stored(tmp_path / "out" / "val")) == ["val/val0.jpg", "val/val1.jpg"]


def test_overlapping_trees_and_mask_flags_without_masks_are_one_line(tmp_path, capsys):
    im = tmp_path / "im"
    _pair(im, im / "masks", "a")
    assert cli(["pack", str(im), str(tmp_path / "o1"), "--masks", str(im / "masks"), "-q"]) == 2
    assert "overlap" in capsys.readouterr().err
    assert cli(["pack", str(im), str(tmp_path / "o2"), "--num-classes", "3", "-q"]) == 2
    assert "--num-classes and --ignore-index are for masks" in capsys.readouterr().err


def test_a_mask_pack_resumes_byte_identical(tmp_path):
    im, mk = tmp_path / "im", tmp_path / "mk"
    for k in range(6):
        _pair(im, mk, f"s{k}", size=(30 + k, 20 + k))
    pack(im, tmp_path / "a", masks=mk, shards=Shards(samples=2), workers=1)
    pack(im, tmp_path / "b", masks=mk, shards=Shards(samples=2), workers=1)
    shard = tmp_path / "b" / "train" / "train-000001.tar"
    shard.unlink()
    assert pack(im, tmp_path / "b", masks=mk, shards=Shards(samples=2), workers=1).restored == 1
    for name in ("train-000000.tar", "train-000001.tar", "train-000002.tar"):
        assert (tmp_path / "a" / "train" / name).read_bytes() == (tmp_path / "b" / "train" / name).read_bytes()
