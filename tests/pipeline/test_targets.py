"""Beyond one class per image: float and vector targets, multi-label, masks and grayscale, packed
by `stoker pack` and read by the Loader on every backend."""

import json
import random

import numpy as np
import pytest
import torch
from PIL import Image

from stoker.errors import ManifestError, TargetError
from stoker.pipeline import Loader
from stoker.pipeline.backends import runner_class
from stoker.pipeline.deps import HAS_DALI
from stoker.pipeline.shards.manifest import Manifest
from stoker.tools.common.synth import make_regression_csv, make_segmentation_tree
from stoker.tools.pack import Images, Masks, Reading, pack

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")
BACKENDS = ["pil"] + (["dali"] if HAS_DALI else [])
#: class -> colour of the geometry check's pictures (far apart: a pixel's class is its nearest colour)
COLOURS = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255]], np.uint8)


def _loader(path, **kw):
    kw.setdefault("threads", 1)
    kw.setdefault("seed", 3)
    return Loader(path, **kw)


def _epoch(loader, epoch=1):
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


# ---- float targets ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def regression(tmp_path_factory):
    root = tmp_path_factory.mktemp("reg")
    csv = make_regression_csv(root / "src", n=40, seed=1)
    result = pack(csv, root / "out", val_fraction=0.25, workers=1)
    return root, csv, result


def test_a_float_csv_packs_float_targets_and_says_so(regression):
    root, csv, result = regression
    m = Manifest.load(root / "out" / "train")
    stats = m.target.stats  # what the packer saw, in the summary
    assert result.targets == (
        f"float, 1 column (temperature: mean {stats.mean[0]:.3g}, std {stats.std[0]:.3g}, "
        f"{stats.min[0]:.3g}..{stats.max[0]:.3g})"
    )
    assert f"targets: {result.targets}" in result.summary()
    assert m.format == 2 and m.target.kind == "float" and m.target.columns == ("temperature",) and m.classes == []
    written = {r.split(",")[0]: float(r.split(",")[1]) for r in csv.read_text().splitlines()[1:]}
    from stoker.pipeline.shards.samples import open_split

    idx = open_split(root / "out" / "train", with_json=True)
    with _loader(root / "out" / "train", batch_size=5, train=False, crop=32, backend="pil") as loader:
        assert len(loader.dataset) == 30
        values = [float(v) for _, ys in _epoch(loader) for v in ys]
        order = loader.indices()
    for i, value in zip(order.tolist(), values, strict=True):  # val: stored order
        path = json.loads(idx.meta(i))["path"]
        assert value == pytest.approx(written[path], abs=1e-6)  # float32 of what the CSV says


@pytest.mark.parametrize("backend", BACKENDS)
def test_float_targets_are_float32_on_the_device_with_the_same_order_as_classes(regression, backend):
    root, _, _ = regression
    with _loader(root / "out" / "train", batch_size=6, crop=32, backend=backend) as loader:
        batches = _epoch(loader)
    assert len(batches) == 30 // 6
    for x, y in batches:
        assert x.dtype == torch.uint8 and x.shape == (6, 3, 32, 32)
        assert y.dtype == torch.float32 and y.shape == (6,)
        assert ((y >= 0) & (y <= 1)).all()


def test_float_targets_resume_mid_epoch_exactly(regression):
    root, _, _ = regression
    split = root / "out" / "train"
    whole = _epoch(_loader(split, batch_size=6, crop=32, backend="pil"))
    first = _loader(split, batch_size=6, crop=32, backend="pil")
    first.set_epoch(1)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    first.close()
    second = _loader(split, batch_size=6, crop=32, backend="pil")
    second.load_state_dict(state)
    rest = [(x, y) for x, y in second]
    assert len(rest) == len(whole) - 2
    for (a, ya), (b, yb) in zip(rest, whole[2:], strict=True):
        assert torch.equal(a, b) and torch.equal(ya, yb)


def test_float_targets_split_exactly_over_ranks(regression):
    root, _, _ = regression
    split = root / "out" / "val"
    values = []
    for rank in range(3):
        with _loader(split, batch_size=2, crop=16, backend="pil", train=False, rank=rank, world_size=3) as ld:
            values += [float(v) for _, y in ld for v in y]
    with _loader(split, batch_size=4, crop=16, backend="pil", train=False) as ld:
        whole = [float(v) for _, y in ld for v in y]
    assert sorted(values) == sorted(whole) and len(whole) == 10


def _images(folder, n, size=(40, 30)):
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(n):
        Image.new("RGB", size, (k * 20 % 255, 90, 160)).save(folder / f"{k}.jpg")
    return [f"{folder.name}/{k}.jpg" for k in range(n)]


def test_vector_targets_nan_and_empty_cells_are_listed_rejects(tmp_path):
    paths = _images(tmp_path / "im", 6)
    rows = ["file,x,y,z"] + [f"{p},{k},{k / 2},{-k}" for k, p in enumerate(paths[:4])]
    rows += [f"{paths[4]},1,nan,2", f"{paths[5]},1,,2"]
    (tmp_path / "v.csv").write_text("\n".join(rows) + "\n")
    result = pack(tmp_path / "v.csv", tmp_path / "out", workers=1)
    assert result.targets == (
        "float, 3 columns (x: mean 1.5, std 1.12, 0..3; y: mean 0.75, std 0.559, 0..1.5; z: mean -1.5, std 1.12, -3..0)"
    )
    assert result.rejected == 2
    rejects = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["reason"] for r in rejects) == ["target 'y' is empty", "target 'y' is not finite: nan"]
    with _loader(tmp_path / "out" / "train", batch_size=4, crop=16, train=False, backend="pil") as ld:
        ((_, y),) = list(ld)
    assert y.dtype == torch.float32 and y.shape == (4, 3)
    assert (
        sorted(y[:, 0].tolist()) == [0, 1, 2, 3]
        and torch.equal(y[:, 1], y[:, 0] / 2)
        and torch.equal(y[:, 2], -y[:, 0])
    )


def test_a_path_listed_twice_is_packed_once_or_not_at_all_when_its_targets_differ(tmp_path):
    paths = _images(tmp_path / "im", 4)
    rows = [f"{paths[0]},1.5", f"{paths[1]},2.5", f"{paths[0]},1.5", f"{paths[2]},3.25", f"{paths[3]},0.5"]
    rows += [f"{paths[2]},9.75"]  # the same image, another target: neither can be trusted
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    result = pack(tmp_path / "d.csv", tmp_path / "out", workers=1)
    assert result.packed == 3 and result.rejected == 2
    rejects = {r["reason"] for r in map(json.loads, (tmp_path / "out" / "rejects.jsonl").read_text().splitlines())}
    assert rejects == {
        "listed again on line 3 (first on line 1)",
        "listed on lines 4 (3.25) and 6 (9.75) with different targets",
    }
    with _loader(tmp_path / "out" / "train", batch_size=3, crop=16, train=False, backend="pil") as ld:
        ((_, y),) = list(ld)
    assert sorted(y.tolist()) == [0.5, 1.5, 2.5]


def test_targets_flag_forces_floats_and_refuses_classes_of_fractions(tmp_path, capsys):
    from stoker.tools.cli import main as cli

    paths = _images(tmp_path / "im", 4)
    (tmp_path / "ages.csv").write_text("".join(f"{p},{20 + k}\n" for k, p in enumerate(paths)))
    assert pack(tmp_path / "ages.csv", tmp_path / "cls", workers=1).targets == "class, 24 classes"
    forced = pack(tmp_path / "ages.csv", tmp_path / "flt", workers=1, reading=Reading(targets="float"))
    assert forced.targets == "float, 1 column (y: mean 21.5, std 1.12, 20..23)" and Manifest.load(
        tmp_path / "flt" / "train"
    ).target.columns == ("y",)
    (tmp_path / "f.csv").write_text("".join(f"{p},{k + 0.5}\n" for k, p in enumerate(paths)))
    capsys.readouterr()
    assert cli(["pack", str(tmp_path / "f.csv"), str(tmp_path / "bad"), "--targets", "class", "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--targets class but labels are non-integer numbers (e.g. '0.5')" in err


def test_the_case_report_csv_of_fractions_is_never_a_class_per_value(tmp_path):
    paths = _images(tmp_path / "im", 8)
    values = ["0.25", "1.5", "10.75", "2.0"] * 2
    (tmp_path / "t.csv").write_text("path,target\n" + "".join(f"{p},{v}\n" for p, v in zip(paths, values, strict=True)))
    result = pack(tmp_path / "t.csv", tmp_path / "out", workers=1)
    m = Manifest.load(tmp_path / "out" / "train")
    assert (
        m.classes == []
        and m.target.kind == "float"
        and result.targets == "float, 1 column (target: mean 3.62, std 4.16, 0.25..10.8)"
    )


def test_multilabel_cells_give_multi_hot_targets(tmp_path):
    paths = _images(tmp_path / "im", 4)
    labels = ["cat|dog", "dog", "bird|cat|dog", "bird"]
    (tmp_path / "m.csv").write_text("".join(f"{p},{lab}\n" for p, lab in zip(paths, labels, strict=True)))
    result = pack(tmp_path / "m.csv", tmp_path / "out", workers=1)
    assert result.targets == "multilabel, 3 classes"
    with _loader(tmp_path / "out" / "train", batch_size=4, crop=16, train=False, backend="pil") as ld:
        assert ld.dataset.classes == ["bird", "cat", "dog"]
        ((_, y),) = list(ld)
    assert y.dtype == torch.float32 and y.shape == (4, 3)
    assert sorted(map(tuple, y.tolist())) == sorted([(0, 1, 1), (0, 0, 1), (1, 1, 1), (1, 0, 0)])


def test_a_newer_format_is_one_line_and_old_class_splits_stay_format_1(tiny_shards, tmp_path):
    root = tiny_shards(n=8, per_shard=8)
    d = json.loads((root / "train" / "stoker.json").read_text())
    assert d["format"] == 1 and "target" not in d
    d["format"] = 4
    (root / "train" / "stoker.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match=r"format 4, written by a newer stoker.*upgrade stoker"):
        Manifest.load(root / "train")


def test_a_float_target_of_the_wrong_width_names_the_sample(regression, tmp_path):
    import shutil

    root, _, _ = regression
    split = tmp_path / "train"
    shutil.copytree(root / "out" / "train", split)
    d = json.loads((split / "stoker.json").read_text())
    d["target"]["columns"] = ["a", "b"]
    (split / "stoker.json").write_text(json.dumps(d))
    with _loader(split, batch_size=4, crop=16, train=False, backend="pil") as ld:
        with pytest.raises(TargetError, match=r"key \d+: target has 1 value\(s\), the split's targets have 2"):
            next(iter(ld))


# ---- masks --------------------------------------------------------------------------------------
def _colour_regions(rng, w, h):
    """A picture whose colour regions are its own mask (blocks of 4 classes) and that mask."""
    mask = np.zeros((h, w), np.uint8)
    for _ in range(6):
        x0, y0 = rng.randrange(w), rng.randrange(h)
        mask[y0 : y0 + rng.randint(h // 4, h // 2), x0 : x0 + rng.randint(w // 4, w // 2)] = rng.randint(1, 3)
    return COLOURS[mask], mask


@pytest.fixture(scope="module")
def segmentation(tmp_path_factory):
    """A mask pack whose images are coloured by their own masks (lossless images: PNG inputs are
    re-encoded at quality 100 to keep the colours apart)."""
    root = tmp_path_factory.mktemp("seg")
    rng = random.Random(7)
    for k in range(24):
        w, h = rng.randint(60, 140), rng.randint(60, 140)
        picture, mask = _colour_regions(rng, w, h)
        (root / "images").mkdir(exist_ok=True)
        (root / "masks").mkdir(exist_ok=True)
        Image.fromarray(picture).save(root / "images" / f"{k}.png")
        Image.fromarray(mask, "L").save(root / "masks" / f"{k}.png")
    result = pack(
        root / "images", root / "out", masks=Masks(root / "masks", num_classes=4), images=Images(quality=100), workers=1
    )
    assert result.rejected == 0 and result.targets == "mask, 4 classes, 255 ignored"
    return root / "out" / "train"


def _agreement(images, masks):
    """Share of pixels whose colour's nearest class is the mask's class."""
    x = images.permute(0, 2, 3, 1).reshape(-1, 1, 3).int()
    nearest = (x - torch.from_numpy(COLOURS).int()[None]).abs().sum(-1).argmin(-1)
    return float((nearest == masks.reshape(-1).long()).float().mean())


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("backend", BACKENDS + ["nvjpeg"])
def test_each_mask_gets_exactly_its_images_crop_and_flip_on_every_backend(segmentation, backend, train):
    # nvjpeg decodes on the GPU in a Loader; its runner runs here with torchvision's CPU decode
    loader = _loader(
        segmentation, batch_size=8, crop=(48, 40), train=train, backend="pil" if backend == "nvjpeg" else backend
    )
    runner = runner_class(backend)(loader.decode_settings())
    batches = [loader.indices(1)[k : k + 8] for k in range(0, 24, 8)]
    out = list(runner.iterate(batches, 1, loader.seed))
    runner.close()
    loader.close()
    for b in out:
        assert b.images.shape == (8, 3, 48, 40) and b.targets.shape == (8, 48, 40) and b.targets.dtype == torch.uint8
        assert set(b.targets.unique().tolist()) <= {0, 1, 2, 3}
        # colours blur only across region borders: a wrong box or flip would agree on ~1/2 at best
        assert _agreement(b.images, b.targets) > 0.93


def test_masks_are_identical_across_backends(segmentation):
    got = {}
    for backend in BACKENDS + ["nvjpeg"]:
        loader = _loader(segmentation, batch_size=8, crop=32, train=True, backend="pil")
        runner = runner_class(backend)(loader.decode_settings())
        got[backend] = torch.cat([b.targets for b in runner.iterate([loader.indices(2)[:8]], 2, loader.seed)])
        runner.close()
        loader.close()
    first = next(iter(got.values()))
    assert all(torch.equal(first, m) for m in got.values())


def test_a_mask_crop_is_pillows_nearest_resize_of_the_box():
    from stoker.pipeline.augment import crop_mask

    rng = np.random.default_rng(0)
    mask = rng.integers(0, 5, (37, 53), dtype=np.uint8)
    for box, size in [((3, 5, 20, 17), (9, 11)), ((0, 0, 53, 37), (64, 80)), ((10, 2, 7, 30), (30, 7))]:
        out = np.empty(size, np.uint8)
        crop_mask(mask, box, False, out)
        x, y, w, h = box
        ref = np.asarray(Image.fromarray(mask).resize(size[::-1], Image.NEAREST, box=(x, y, x + w, y + h)))
        assert np.array_equal(out, ref)
        flipped = np.empty(size, np.uint8)
        crop_mask(mask, box, True, flipped)
        assert np.array_equal(flipped, out[:, ::-1])


def test_mask_loader_resumes_and_keeps_len(segmentation):
    whole = _epoch(_loader(segmentation, batch_size=8, crop=32, backend="pil"))
    first = _loader(segmentation, batch_size=8, crop=32, backend="pil")
    first.set_epoch(1)
    next(iter(first))
    state = first.state_dict()
    first.close()
    second = _loader(segmentation, batch_size=8, crop=32, backend="pil")
    second.load_state_dict(state)
    rest = list(second)
    assert len(second.dataset) == 24 and len(rest) == 2
    for (a, ma), (b, mb) in zip(rest, whole[1:], strict=True):
        assert torch.equal(a, b) and torch.equal(ma, mb)


# ---- grayscale -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gray_split(tmp_path_factory):
    root = tmp_path_factory.mktemp("gray")
    images, masks = make_segmentation_tree(root / "src", n=12, seed=2)
    pack(images, root / "out", masks=Masks(masks, num_classes=4), workers=1)
    return root / "out" / "train"


@pytest.mark.parametrize("backend", BACKENDS + ["nvjpeg"])
def test_channels_1_gives_one_channel_on_every_backend(gray_split, backend):
    got = {}
    for channels in (1, 3):
        loader = _loader(gray_split, batch_size=6, crop=32, train=False, channels=channels, backend="pil")
        runner = runner_class(backend)(loader.decode_settings())
        (got[channels],) = list(runner.iterate([loader.indices()[:6]], 0, loader.seed))
        runner.close()
        loader.close()
    one, three = got[1].images, got[3].images
    assert one.shape == (6, 1, 32, 32) and one.dtype == torch.uint8 and three.shape == (6, 3, 32, 32)
    # a grayscale image read as RGB is its one channel three times, on the same backend
    assert torch.equal(three[:, 0], three[:, 1]) and torch.equal(three[:, 1], three[:, 2])
    assert (three[:, 0].int() - one[:, 0].int()).abs().max() <= 1
    assert torch.equal(got[1].targets, got[3].targets)


def test_grayscale_inputs_are_stored_as_one_channel_jpegs(gray_split):
    from stoker.pipeline.shards.samples import open_split

    idx = open_split(gray_split)
    enc, _ = idx.images(idx.valid[:3])
    import io

    assert {Image.open(io.BytesIO(e.tobytes())).mode for e in enc} == {"L"}


def test_a_stand_in_passes_the_mask_header_guard_like_a_planned_sample(tmp_path):
    # samples whose mask is not their image's size are dropped when planned; a train batch that
    # lost every sample must not get them back as stand-ins (their masks would be misaligned)
    import io as _io

    from stoker.pipeline.backends.base import loadable
    from stoker.pipeline.shards.targets import Target
    from stoker.pipeline.shards.writer import ShardWriter
    from stoker.pipeline.stages import stand_ins

    def encoded(a, fmt):
        buf = _io.BytesIO()
        Image.fromarray(a).save(buf, fmt)
        return buf.getvalue()

    split = tmp_path / "train"
    split.mkdir()
    bad = {0, 1, 2, 3, 5}  # masks 8 pixels too wide
    with ShardWriter(split / "shard-000000.tar") as w:
        for i in range(8):
            picture = np.full((24, 32, 3), 30 * i, np.uint8)
            mask = np.zeros((24, 40 if i in bad else 32), np.uint8)
            w.write(f"{i:09d}", {"jpg": encoded(picture, "JPEG"), "mask.png": encoded(mask, "PNG")})
    Manifest(num_samples=8, classes=["0", "1"], shards=[w.info], target=Target.of("mask", num_classes=2)).save(split)
    with _loader(split, batch_size=4, crop=16, train=True, backend="pil") as ld:
        assert loadable(ld.index, np.arange(8)).tolist() == [i not in bad for i in range(8)]
        seq = ld.indices().tolist()  # this rank's order: stand-ins are the next loadable ones after the batch
        picked = stand_ins(ld, np.array(seq[:4])).tolist()
        assert picked == [i for i in seq[4:] + seq[:4] if i not in bad] and set(picked) == {4, 6, 7}


def test_target_statistics_merge_exactly_and_survive_the_manifest(tmp_path):
    from stoker.pipeline.shards.targets import StatsAccumulator, Target

    rng = np.random.default_rng(0)
    values = rng.normal([40.0, -3.0], [12.0, 0.5], size=(101, 2))
    parts = [StatsAccumulator("float", 2) for _ in range(3)]
    for k, v in enumerate(values):  # three packers, one resumed from its journal's JSON state
        parts[k % 3].add(v)
    parts[2] = StatsAccumulator.from_state(json.loads(json.dumps(parts[2].state())))
    total = parts[0].merge(parts[1]).merge(parts[2])
    stats = total.result()
    assert stats.count == 101
    np.testing.assert_allclose(stats.mean, values.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.std, values.std(0), rtol=1e-12)
    assert stats.min == tuple(values.min(0)) and stats.max == tuple(values.max(0))
    target = Target.of("float", columns=("age", "x"), stats=stats)
    assert Target.from_json(json.loads(json.dumps(target.to_json()))).stats == stats


def test_mask_statistics_name_the_classes_found_without_the_ignored_value():
    from stoker.pipeline.shards.targets import StatsAccumulator

    acc = StatsAccumulator("mask")
    acc.add(np.array([[0, 0, 2, 255]], np.uint8))
    acc.add(np.array([[2, 2, 255, 255]], np.uint8))
    stats = acc.result(ignore_index=255)
    assert stats.count == 2 and stats.class_share == (2 / 5, 0.0, 3 / 5)


def test_standardize_and_restore_are_inverse_per_column_for_torch_and_numpy():
    import torch

    from stoker.pipeline.shards.targets import TargetStats

    stats = TargetStats(10, mean=(50.0, 2.0), std=(10.0, 0.0), min=(0, 2), max=(90, 2))
    y = torch.tensor([[60.0, 2.0], [30.0, 2.0]])
    z = stats.standardize(y)
    assert torch.allclose(z, torch.tensor([[1.0, 0.0], [-2.0, 0.0]]))  # a constant column: std 1
    assert torch.allclose(stats.restore(z), y)
    one = TargetStats(3, mean=(18.0,), std=(4.0,), min=(10.0,), max=(30.0,))
    np.testing.assert_allclose(one.restore(one.standardize(np.array([22.0, 10.0], np.float32))), [22.0, 10.0])
