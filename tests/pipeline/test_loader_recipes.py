"""The recipes people train with, through the Loader: crop settings on every backend, per-sample
augmentation and mixing of train batches (deterministic, resumable, masks moved with their images),
and a one-line refusal of every hostile setting."""

import numpy as np
import pytest
import torch

from helpers import write_split
from stoker.pipeline import Loader
from stoker.pipeline.augment import build_augment, build_mixing
from stoker.pipeline.backends import runner_class
from stoker.pipeline.deps import HAS_DALI
from stoker.tools.common.synth import CLASSES

pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")
BACKENDS = ["pil", "nvjpeg"] + (["dali"] if HAS_DALI else [])


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipes") / "train"
    write_split(path, num_samples=32, samples_per_shard=16, classes=list(CLASSES) * 6, min_side=60, max_side=120)
    return path


def _loader(split, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("threads", 0 if kw.get("backend", "pil") == "pil" else 1)
    kw.setdefault("backend", "pil")
    return Loader(split, seed=2, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("train", [True, False])
def test_rectangular_crops_and_the_crop_recipe_on_every_backend(split, backend, train):
    kw = dict(crop=(40, 56), scale=(0.35, 1.0), ratio=(0.5, 2.0), train=train)
    if not train:
        kw = dict(crop=(40, 56), crop_pct=0.95, train=False)
    loader = _loader(split, **kw)
    runner = runner_class(backend)(loader.decode_settings())
    (batch,) = list(runner.iterate([loader.indices(1)[:8]], 1, loader.seed))
    runner.close()
    assert batch.images.shape == (8, 3, 40, 56)
    if train:  # the boxes: each at least 35% of its image's area (the fallback center crop aside)
        from stoker.pipeline.augment import random_resized_crop

        _, wh = loader.index.images(loader.indices(1)[:8])
        boxes, _ = random_resized_crop(wh, loader.indices(1)[:8], seed=2, epoch=1, scale=(0.35, 1.0), ratio=(0.5, 2.0))
        assert ((boxes[:, 2] * boxes[:, 3]) >= 0.34 * wh[:, 0] * wh[:, 1]).all()
    loader.close()


def test_val_resize_and_crop_pct_pick_the_same_box_when_they_agree(split):
    a = _loader(split, crop=64, train=False, crop_pct=0.875)
    b = _loader(split, crop=64, train=False, val_resize=64 / 0.875)
    assert torch.equal(next(iter(a))[0], next(iter(b))[0])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(scale=(0.0, 1.0)), r"scale=\(0.0, 1.0\) must satisfy 0 < low <= high <= 1"),
        (dict(scale=(0.5, 1.5)), r"scale=\(0.5, 1.5\)"),
        (dict(ratio=(-1, 2)), r"ratio=\(-1.0, 2.0\) must satisfy 0 < low"),
        (dict(crop=100_000), r"crop=100000 is larger than any sensible training input"),
        (dict(crop=(0, 5)), r"crop=\(0, 5\) must be a positive integer or \(height, width\)"),
        (dict(crop_pct=0.9, val_resize=256), "give crop_pct= or val_resize=, not both"),
        (dict(augment="rand-mX"), r"section 'mX' is not a key followed by a number"),
        (dict(augment="bogus-m9"), "unknown policy 'bogus'"),
        (dict(train=False, augment="ta_wide"), "augment= and mixing= are for train Loaders"),
        (dict(channels=2), "channels=2 must be 3"),
    ],
)
def test_hostile_recipe_settings_are_one_line(split, kw, message):
    with pytest.raises(ValueError, match=message):
        _loader(split, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_augmentation_is_per_sample_and_identical_across_backends_and_batch_sizes(split, backend):
    aug = build_augment("rand-m9-mstd0.5-inc1", reprob=0.5)
    got = {}
    for batch_size in (8, 4):
        loader = _loader(split, crop=32, batch_size=batch_size, augment=aug, backend="pil")
        runner = runner_class(backend)(loader.decode_settings())
        ids = loader.indices(1)[:8]
        batches = list(runner.iterate([ids[k : k + batch_size] for k in range(0, 8, batch_size)], 1, loader.seed))
        got[batch_size] = torch.cat([loader.recipe(b, seed=loader.seed, epoch=1)[0] for b in batches])
        plain = torch.cat([b.images for b in batches])
        runner.close()
        loader.close()
    assert torch.equal(got[8], got[4])  # a sample's augmentation does not depend on its batch
    assert not torch.equal(got[8], plain)  # and it happened


def test_an_augmented_train_epoch_resumes_exactly(split):
    whole = _loader(split, crop=32, augment="ta_wide")
    whole.set_epoch(3)
    batches = [x.clone() for x, _ in whole]
    cut = _loader(split, crop=32, augment="ta_wide")
    cut.set_epoch(3)
    next(iter(cut))
    state = cut.state_dict()
    again = _loader(split, crop=32, augment="ta_wide")
    again.load_state_dict(state)
    rest = [x for x, _ in again]
    assert all(torch.equal(a, b) for a, b in zip(rest, batches[1:], strict=True))


def test_mixing_gives_soft_targets_and_refuses_other_targets(split, tmp_path):
    mix = build_mixing(0.8, 1.0, label_smoothing=0.1, num_classes=len(CLASSES) * 6)
    loader = _loader(split, crop=32, mixing=mix)
    x, y = next(iter(loader))
    assert y.dtype == torch.float32 and y.shape == (8, 36)
    assert torch.allclose(y.sum(1), torch.ones(8)) and (y > 0).all()  # smoothed: no zero anywhere
    from stoker.tools.common.synth import make_regression_csv
    from stoker.tools.pack import pack

    pack(make_regression_csv(tmp_path / "src", n=8), tmp_path / "reg", workers=1)
    with pytest.raises(ValueError, match="mixing= .MixUp/CutMix. mixes class targets; the targets of .* are float"):
        _loader(tmp_path / "reg" / "train", crop=32, mixing=mix)


def test_an_odd_batch_mixes_its_pairs_and_smooths_the_last(split):
    from stoker.pipeline.augment.apply import mix

    mixing = build_mixing(1.0, 0.0, label_smoothing=0.2, num_classes=4)
    images = torch.randint(0, 255, (5, 3, 8, 8), dtype=torch.uint8)
    out, soft = mix(mixing, images, torch.tensor([0, 1, 2, 3, 1]), np.arange(5), seed=0, epoch=0)
    assert out.shape == images.shape and torch.equal(out[4], images[4])
    assert torch.allclose(soft[4], torch.tensor([0.05, 0.85, 0.05, 0.05]))
