"""The box target kind: boxes follow every crop, flip and letterbox on every CPU backend (a box
drawn as a solid rectangle keeps covering exactly that colour), are the same on every backend for
one seed, are dropped when cropped away, and nothing outside the kind module names the kind."""

import io
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from stoker.pipeline import Loader
from stoker.pipeline.augment import CropSpec
from stoker.pipeline.deps import HAS_DALI
from stoker.pipeline.shards.boxes import BoxBatch, encode_boxes, follow_crop
from stoker.pipeline.shards.kinds import Target
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.writer import ShardWriter
from stoker.tools.common.synth import encode

COLOURS = np.array([[250, 20, 20], [20, 250, 20], [20, 20, 250], [250, 250, 20]], np.uint8)
MARGIN = 2.0  # output pixels at a box's edge that a resize blends with the background
BACKENDS = [("pil", {}), ("pixels", {"pixel_cache": True})] + ([("dali", {})] if HAS_DALI else [])


def _scene(rng: random.Random) -> tuple[np.ndarray, list]:
    """A noisy picture with 1 or 2 solid rectangles (one colour each, apart) and their boxes."""
    w, h = rng.randint(80, 128), rng.randint(64, 112)
    image = np.random.default_rng(rng.getrandbits(32)).integers(90, 160, (h, w, 3)).astype(np.uint8)
    rows = []
    for half in range(rng.randint(1, 2)):  # left half, right half: never overlapping
        bw, bh = rng.randint(16, w // 2 - 4), rng.randint(16, h - 8)
        x0, y0 = half * (w // 2) + rng.randint(0, w // 2 - bw), rng.randint(0, h - bh)
        c = rng.randrange(len(COLOURS))
        image[y0 : y0 + bh, x0 : x0 + bw] = COLOURS[c]
        rows.append((x0, y0, x0 + bw, y0 + bh, c, 0))
    return image, rows


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> Path:
    """A box split written directly: lossless PNG pictures of solid rectangles and their boxes."""
    root = tmp_path_factory.mktemp("boxes") / "train"
    root.mkdir()
    rng = random.Random(3)
    with ShardWriter(root / "train-000000.tar") as w:
        for i in range(24):
            image, rows = _scene(rng)
            meta = {"width": image.shape[1], "height": image.shape[0]}
            png = encode(__import__("PIL.Image").Image.fromarray(image), "PNG")
            w.write(f"{i:09d}", {"png": png, "boxes.npy": encode_boxes(rows), "json": json.dumps(meta).encode()})
    target = Target.of("boxes")
    Manifest(num_samples=24, classes=[f"c{k}" for k in range(len(COLOURS))], shards=[w.info], target=target).save(root)
    return root


def _loader(split: Path, backend: str, extra: dict, tmp_path: Path, **kw) -> Loader:
    if "pixel_cache" in extra:
        kw["pixel_cache"] = tmp_path / "px"
    backend = "pil" if backend == "pixels" else backend
    return Loader(split, batch_size=8, device="cpu", backend=backend, threads=0 if backend == "pil" else 1, **kw)


def _batches(loader: Loader) -> list:
    return [(images.clone(), targets) for images, targets in loader]


def _check_rectangles(batches: list) -> int:
    """Every box's inside (less the blended margin) is its rectangle's colour; returns boxes checked."""
    checked = 0
    for images, t in batches:
        assert isinstance(t, BoxBatch) and t.boxes.dtype == torch.float32 and t.labels.dtype == torch.int64
        h, w = images.shape[-2:]
        for k in range(len(t)):
            n = int(t.counts[k])
            for (x0, y0, x1, y1), c in zip(t.boxes[k, :n].tolist(), t.labels[k, :n].tolist(), strict=True):
                assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h
                a, b = int(np.ceil(x0 + MARGIN)), int(np.floor(x1 - MARGIN))
                top, bottom = int(np.ceil(y0 + MARGIN)), int(np.floor(y1 - MARGIN))
                if b <= a or bottom <= top:
                    continue  # a sliver: no pixel free of the blended edge
                inside = images[k, :, top:bottom, a:b].int()
                want = torch.from_numpy(COLOURS[c]).int().view(3, 1, 1)
                assert (inside - want).abs().max() <= 3, f"box {c} at {(x0, y0, x1, y1)} is not on its rectangle"
                checked += 1
            pad = t.labels[k, t.counts[k] :]
            assert (pad == -1).all() and (t.boxes[k, t.counts[k] :] == 0).all()
    return checked


@pytest.mark.parametrize("backend, extra", BACKENDS, ids=[b for b, _ in BACKENDS])
def test_a_solid_rectangle_stays_under_its_box(split, tmp_path, backend, extra):
    """Train (RandomResizedCrop + flip; scale jitter), val center crop and val letterbox: every box
    covers its colour on every backend; the boxes are the same on each backend (and run) for one seed."""
    train = _batches(_loader(split, backend, extra, tmp_path, crop=48, train=True, seed=5))
    assert _check_rectangles(train) >= 10
    letterbox = CropSpec.of(56, val_fit="letterbox")
    val = _batches(_loader(split, backend, extra, tmp_path / "v", crop=letterbox, train=False))
    assert _check_rectangles(val) >= 20  # nothing is cropped away: every box of the split
    assert sum(int(t.counts.sum()) for _, t in val) == sum(len(r) for r in _rows(split))
    center = _batches(
        _loader(split, backend, extra, tmp_path / "c", crop=CropSpec.of(48, val_fit="center"), train=False)
    )
    _check_rectangles(center)
    jitter = CropSpec.of(48, train_fit="scale-jitter", jitter=(0.3, 1.6))  # crops and pads
    jittered = _batches(_loader(split, backend, extra, tmp_path / "j", crop=jitter, train=True, seed=5))
    assert _check_rectangles(jittered) >= 10
    again = _batches(_loader(split, "pil", {}, tmp_path / "ja", crop=jitter, train=True, seed=5))
    for (_, a), (_, b) in zip(jittered, again, strict=True):
        assert torch.equal(a.boxes, b.boxes)
    reference = _batches(_loader(split, "pil", {}, tmp_path / "r", crop=48, train=True, seed=5))
    for (_, a), (_, b) in zip(train, reference, strict=True):
        assert torch.equal(a.boxes, b.boxes) and torch.equal(a.labels, b.labels)


def _rows(split: Path) -> list:
    import tarfile

    with tarfile.open(next(split.glob("*.tar"))) as tar:
        return [
            np.load(io.BytesIO(tar.extractfile(m).read()))
            for m in sorted(tar.getmembers(), key=lambda m: m.name)
            if m.name.endswith("npy")
        ]


def test_letterbox_keeps_the_aspect_ratio_and_pads(split, tmp_path):
    """A letterboxed batch: each picture resized by one factor into the top-left corner, zeros
    beyond it; the boxes scaled by that factor alone."""
    loader = _loader(split, "pil", {}, tmp_path, crop=CropSpec.of(64, val_fit="letterbox"), train=False)
    images, t = next(iter(loader))
    rows = _rows(split)[:8]
    for k in range(len(images)):
        _, wh = loader.index.images(np.array([k]))
        s = min(64 / wh[0, 0], 64 / wh[0, 1])
        w, h = round(wh[0, 0] * s), round(wh[0, 1] * s)
        assert (images[k, :, h:, :] == 0).all() and (images[k, :, :, w:] == 0).all()
        assert images[k, :, : h - 1, : w - 1].float().mean() > 50
        expect = rows[k][:, :4] * np.array([w / wh[0, 0], h / wh[0, 1]] * 2)
        np.testing.assert_allclose(t.boxes[k, : t.counts[k]].numpy(), expect, rtol=1e-5)


def test_boxes_cropped_away_are_dropped_with_their_labels():
    """A box outside the crop is gone; one cut to below the kept share is gone; a flip mirrors."""
    rows = [np.array([[0, 0, 10, 10, 1, 0], [50, 50, 60, 60, 2, 1], [15, 0, 30, 10, 3, 0]], np.float32)]
    crops, places = np.array([[20, 0, 40, 40]]), np.array([[0, 0, 80, 80]])
    (moved,) = follow_crop(rows, crops, np.array([False]), places)
    assert moved[:, 4].tolist() == [3.0] and moved[0, :4].tolist() == [0, 0, 20, 20]  # clipped, x2
    (flipped,) = follow_crop(rows, crops, np.array([True]), places)
    assert flipped[0, :4].tolist() == [60, 0, 80, 20]
    (strict,) = follow_crop(rows, crops, np.array([False]), places, min_visible=0.7)
    assert len(strict) == 0  # a third of box 3 is inside the crop
    batch = BoxBatch.from_rows([moved, np.zeros((0, 6), np.float32)])
    assert batch.counts.tolist() == [1, 0] and batch.labels[1].tolist() == [-1]
    listed = batch.to_list()
    assert listed[1]["boxes"].shape == (0, 4) and listed[0]["labels"].tolist() == [3]


def test_mixing_is_refused_for_boxes(split):
    from stoker.errors import ArgumentError
    from stoker.pipeline.augment import build_mixing

    with pytest.raises(ArgumentError, match="mix"):
        Loader(split, batch_size=4, crop=32, backend="pil", threads=0, mixing=build_mixing(num_classes=4, mixup=0.8))


def test_no_file_outside_the_kind_names_it():
    """The box kind is one kind in the registry: no module of stoker but its own (and the pack
    sources of box formats, the detection task's model and results file) names it."""
    root = Path(__file__).resolve().parents[2]
    own = {
        "pipeline/shards/boxes.py",
        "tools/pack/sources/detection.py",
        "model/detection.py",
        "model/train/coco_results.py",  # the detection task's results file: torchvision's dict keys
        "tools/common/synth.py",
    }
    pattern = re.compile(r"""["']boxes(\.npy)?["']|BoxKind|BoxBatch""")
    naming = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("tests/", ".", "build/", "benchmarks/")) or rel in own:
            continue
        naming += [f"{rel}: {line.strip()}" for line in path.read_text().splitlines() if pattern.search(line)]
    assert not naming, "\n".join(naming)


def test_photometric_augment_is_taken_geometric_refused(split):
    from stoker.errors import ArgumentError
    from stoker.pipeline.augment import ColorJitter

    loader = Loader(split, batch_size=4, crop=32, backend="pil", threads=0, augment=ColorJitter(0.4, 0.4, 0.4))
    images, targets = next(iter(loader))
    assert len(images) == len(targets) == 4
    with pytest.raises(ArgumentError, match="moves pixels"):
        Loader(split, batch_size=4, crop=32, backend="pil", threads=0, augment="rand-m9-n2")


def test_box_members_parse_fast_or_slow_and_bad_ones_are_named():
    from stoker.pipeline.shards.boxes import encode_npy, read_boxes

    rows = np.array([[1, 2, 3, 4, 0, 0], [5, 6, 9, 9, 1, 1]], np.float32)
    assert np.array_equal(read_boxes(encode_boxes(rows)), rows)
    assert np.array_equal(read_boxes(encode_boxes(rows)), rows)  # the header is known now: frombuffer
    assert np.array_equal(read_boxes(encode_npy(rows.astype(np.float64))), rows)
    assert "do not parse" in read_boxes(b"\x93NUMPY garbage")
    assert "not float32 (k, 6)" in read_boxes(encode_npy(np.zeros((2, 5), np.float32)))
    kind = Target.of("boxes")
    assert "outside its 8x8 image" in kind.check(encode_boxes(rows), num_classes=2, image_wh=(8, 8))
    assert "not an index below 1" in kind.check(encode_boxes(rows), num_classes=1, image_wh=(10, 10))
    assert kind.check(encode_boxes(np.zeros((0, 6))), num_classes=1, image_wh=(10, 10)) is None


def test_scale_jitter_pads_where_the_image_is_smaller(split, tmp_path):
    """A factor below 1 leaves the picture smaller than the output: it sits at the top-left, zeros
    beyond it, and its boxes scale by the same factor."""
    from stoker.pipeline.augment import scale_jitter

    crops = CropSpec.of(64, train_fit="scale-jitter", jitter=(0.4, 0.6))
    loader = _loader(split, "pil", {}, tmp_path, crop=crops, train=True, seed=1)
    batch = next(iter(loader.decoding.runner_for(loader.crops).iterate([loader.epoch_batches()[0]], 0, 1)))
    ids = np.asarray(batch.ids)
    _, wh = loader.index.images(ids)
    _, _, places = scale_jitter(wh, ids, 64, seed=1, epoch=0, jitter=(0.4, 0.6))
    for k, (_, _, w, h) in enumerate(places.tolist()):
        assert w < 64 and h < 64
        assert (batch.images[k, :, h:, :] == 0).all() and (batch.images[k, :, :, w:] == 0).all()
        assert batch.images[k, :, : h - 1, : w - 1].float().mean() > 50
        assert (batch.targets.boxes[k, : batch.targets.counts[k], 2] <= w + 1e-4).all()


def test_verify_and_index_hold_every_box_to_its_image(tmp_path):
    """``stoker verify`` finds a box outside its image; ``stoker index --targets boxes`` marks it
    to skip and indexes the rest (a negative included)."""
    import shutil

    from helpers import run_cli

    split = tmp_path / "train"
    split.mkdir()
    image = encode(__import__("PIL.Image").Image.new("RGB", (40, 30), (9, 9, 9)), "PNG")
    rows = [[[1, 1, 10, 10, 0, 0]], [[1, 1, 50, 10, 0, 0]], []]  # the second is wider than its image
    with ShardWriter(split / "train-000000.tar") as w:
        for i, r in enumerate(rows):
            w.write(f"{i:09d}", {"png": image, "boxes.npy": encode_boxes(r)})
    Manifest(num_samples=3, classes=["a"], shards=[w.info], target=Target.of("boxes")).save(split)
    rc, out, err = run_cli("verify", split)
    assert rc != 0 and "outside its 40x30 image" in out + err
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    shutil.copy(split / "train-000000.tar", foreign)
    rc, out, err = run_cli("index", foreign, "--targets", "boxes")
    assert rc == 0, err
    assert "1 sample(s) marked to skip" in out + err
    loader = Loader(foreign, batch_size=2, crop=16, train=False, backend="pil", threads=0)
    counts = [int(c) for _, t in loader for c in t.counts]
    assert sorted(counts) == [0, 1]
