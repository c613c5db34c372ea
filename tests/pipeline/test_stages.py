"""The Loader's stages on their own (stoker.pipeline.stages) and the epoch/resume state
(stoker.pipeline.state): the crop stage, the order stage, one iteration at a time, the repr."""

import gc
import json
import warnings
from pathlib import Path

import pytest

from helpers import write_split
from stoker.errors import ArgumentError, LoaderError, NoBatchError
from stoker.pipeline import Loader
from stoker.pipeline.augment import CropSpec
from stoker.pipeline.options import Order, Storage
from stoker.pipeline.stages import ActiveIteration, CropStage, LoaderIterator, SplitSource, describe, sample_order
from stoker.pipeline.state import EpochState


@pytest.fixture
def split(tmp_path):
    path = tmp_path / "train"
    write_split(path, num_samples=20, samples_per_shard=8)
    return path


def stage(crop, *, short_side=0):
    manifest = type("M", (), {"pack": {"short_side": short_side}})()
    crops = crop if isinstance(crop, CropSpec) else CropSpec.of(crop)
    return CropStage(crops, crop, manifest=manifest, train=True, path="split")


def test_crop_stage_schedule_state_and_restore():
    crops = stage(16)
    crops.set(lambda epoch: 16 + 8 * epoch, epoch=0)
    assert crops.crop == 16 and crops.state(position=8) == {}  # still the size it was made with
    crops.start_epoch(2)
    assert crops.crop == 32 and crops.crops.size == (32, 32)
    assert crops.state(position=0) == {} and crops.state(position=8) == {"crop": [32, 32]}
    crops.set((24, 40), epoch=2)  # a size ends the schedule
    crops.start_epoch(3)
    assert crops.schedule is None and crops.crop == (24, 40)
    crops.restore({"crop": [20, 20]})
    assert crops.crop == 20
    crops.restore({})  # a state without a crop: the one the Loader was made with
    assert crops.crop == 16 and crops.crops == crops.initial


def test_crop_stage_keeps_scale_and_checks_a_new_size():
    crops = stage(CropSpec.of(16, scale=(0.3, 0.9)), short_side=20)
    assert crops.crop == (16, 16)  # a whole recipe given: its size
    crops.set(18, epoch=0)
    assert crops.crops.scale == (0.3, 0.9) and crops.crop == 18
    with pytest.warns(UserWarning, match="crop=48 needs a shorter side of 48px"):
        crops.set(48, epoch=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        crops.set(48, epoch=0)  # unchanged: not checked again


def test_a_crop_warning_from_the_loader_points_at_its_caller(split):
    meta = json.loads((split / "stoker.json").read_text())
    meta["pack"]["short_side"] = 24
    (split / "stoker.json").write_text(json.dumps(meta))
    with Loader(split, batch_size=4, crop=16, backend="pil", threads=0) as loader:
        with pytest.warns(UserWarning, match="crop=64 needs") as caught:
            loader.set_crop(64)
    assert Path(caught[0].filename).name == Path(__file__).name


@pytest.mark.parametrize("train", [True, False])
def test_sample_order_drops_the_last_batch_for_train_only(split, train):
    source = SplitSource(split, Storage())
    try:
        made = sample_order(Order(), source, rank=0, world_size=1, train=train, batch_size=8)
        assert made.drop_last is train and made.num_batches() == (2 if train else 3)
        kept = sample_order(Order(drop_last=False), source, rank=0, world_size=1, train=True, batch_size=8)
        assert kept.num_batches() == 3
        with pytest.raises(NoBatchError, match="leaves rank 2 no batch"):
            sample_order(Order(), source, rank=0, world_size=3, train=True, batch_size=8)
        with pytest.raises(ArgumentError, match="world_size=21 is larger than the 20"):
            sample_order(Order(), source, rank=0, world_size=21, train=True, batch_size=1)
    finally:
        source.close()


def test_one_iteration_at_a_time(split):
    with Loader(split, batch_size=4, crop=16, backend="pil", threads=0) as loader:
        first = iter(loader)
        next(first)
        second = iter(loader)  # supersedes the first
        with pytest.raises(LoaderError, match="replaced by a newer iter"):
            next(first)
        assert len(list(second)) == len(loader)
    active = ActiveIteration()
    it = active.start(LoaderIterator(type("L", (), {"path": "p", "_iterate": lambda self: iter([1, 2])})()))
    assert active._ref() is it
    del it
    gc.collect()
    assert active._ref() is None  # a dropped iterator is not kept alive
    active.supersede()


def test_the_repr_and_the_state_base(split):
    with Loader(split, batch_size=4, crop=16, backend="pil", threads=0) as loader:
        assert repr(loader) == describe(loader)
        assert repr(loader).startswith(f"Loader({str(split)!r}, batch_size=4, train=True, crop=16,")
        assert isinstance(loader, EpochState) and loader.state_dict()["position"] == 0
