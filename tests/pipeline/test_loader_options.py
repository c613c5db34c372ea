"""The Loader's option objects (stoker.pipeline.options): each checks its own values in one line
naming the bad one, a keyword that moved names its new home, the documented spellings still work
and mean the same batches as the objects they stand for."""

import dataclasses
import typing

import pytest
import torch

from helpers import run_epoch, write_split
from stoker.errors import ArgumentError
from stoker.pipeline import Loader
from stoker.pipeline.backends import DECODES
from stoker.pipeline.backends.decoders import DECODER_NAMES
from stoker.pipeline.options import (
    Augmentation,
    Auto,
    Dali,
    DecodeName,
    DecoderName,
    Nvjpeg,
    Order,
    Pil,
    ShuffleName,
    Storage,
    backend_for,
)
from stoker.pipeline.order import SHUFFLES


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    root = tmp_path_factory.mktemp("opts") / "train"
    write_split(root, num_samples=24, samples_per_shard=8)
    return root


def test_the_literals_are_the_registries_choices():
    assert typing.get_args(DecodeName) == DECODES
    assert typing.get_args(DecoderName) == DECODER_NAMES
    assert typing.get_args(ShuffleName) == SHUFFLES


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: Dali(decode="gpu"), "decode='gpu'"),
        (lambda: Dali(cpu_resize="cv2"), "cpu_resize='cv2'"),
        (lambda: Dali(hw_load=1.5), "hw_load=1.5"),
        (lambda: Nvjpeg(decoder="nvdec"), "decoder='nvdec'"),
        (lambda: Nvjpeg(hw_load="lots"), "hw_load='lots'"),
        (lambda: Auto(decoder="jpegli"), "decoder='jpegli'"),
        (lambda: Pil(threads=-1), "threads=-1"),
        (lambda: Pil(prefetch=0), "prefetch=0"),
        (lambda: Pil(channels=2), "channels=2"),
        (lambda: Order("random"), "shuffle='random'"),
        (lambda: Order(block_shards=0), "block_shards=0"),
        (lambda: Storage(cache_limit=-5), "cache_limit=-5"),
        (lambda: Augmentation(augment=3), "augment=3"),
    ],
)
def test_a_bad_value_is_one_line_naming_it(make, named):
    with pytest.raises(ArgumentError) as e:
        make()
    msg = str(e.value)
    assert named in msg and "\n" not in msg


def test_option_objects_are_frozen():
    d = Dali(cpu_resize="dali")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.cpu_resize = "pillow"


@pytest.mark.parametrize(
    ("kw", "home"),
    [
        ({"hw_decoder_load": 0.5}, "Loader(hw_decoder_load=...) moved: pass backend=Nvjpeg(hw_load=...)"),
        ({"cpu_resize": "dali"}, "Loader(cpu_resize=...) moved: pass backend=Dali(cpu_resize=...)"),
        ({"decoder": "torchvision"}, "Loader(decoder=...) moved: pass backend=Nvjpeg(decoder=...)"),
        ({"decode": "cpu"}, "Loader(decode=...) moved: pass backend=Dali(decode=...)"),
    ],
)
def test_a_moved_keyword_names_its_new_home(split, kw, home):
    with pytest.raises(ArgumentError) as e:
        Loader(split, batch_size=8, **kw)
    assert str(e.value).startswith(home) and "\n" not in str(e.value)


def test_dataloader_habits_and_unknown_keywords_are_still_named(split):
    with pytest.raises(ValueError, match="num_workers= is a torch DataLoader argument"):
        Loader(split, batch_size=8, num_workers=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        Loader(split, batch_size=8, colour="red")


def test_a_keyword_and_its_object_must_agree(split):
    with pytest.raises(ArgumentError, match="threads=2 and backend=Pil"):
        Loader(split, batch_size=8, backend=Pil(threads=0), threads=2)
    with pytest.raises(ArgumentError, match="crop= is a whole CropSpec"):
        from stoker.pipeline.augment import CropSpec

        Loader(split, batch_size=8, crop=CropSpec.of(16), scale=(0.5, 1))
    # the same value twice is no conflict; a keyword fills a field the object left at its default
    ld = Loader(split, batch_size=8, crop=16, backend=Pil(threads=0), threads=0, channels=1)
    assert ld.backend_options == Pil(threads=0, channels=1) and ld.channels == 1
    ld.close()


def test_strings_mean_the_objects_with_defaults(split):
    kw = {"batch_size": 8, "crop": 16, "seed": 3}
    pairs = [
        ({"backend": "pil", "threads": 0}, {"backend": Pil(threads=0)}),
        (
            {"backend": "pil", "threads": 0, "shuffle": "block", "block_shards": 2},
            {"backend": Pil(threads=0), "shuffle": Order("block", 2)},
        ),
        (
            {"backend": "pil", "threads": 0, "sha256": True, "mixing": None},
            {"backend": Pil(threads=0), "storage": Storage(sha256=True)},
        ),
        (
            {"backend": "pil", "threads": 0, "augment": "rand-m9-mstd0.5"},
            {"backend": Pil(threads=0), "augment": Augmentation("rand-m9-mstd0.5")},
        ),
    ]
    for old, new in pairs:
        a, b = Loader(split, **kw, **old), Loader(split, **kw, **new)
        for epoch in (0, 1):
            (xa, ya), (xb, yb) = run_epoch(a, epoch), run_epoch(b, epoch)
            assert all(torch.equal(p, q) for p, q in zip(xa, xb, strict=True))
            assert all(torch.equal(p, q) for p, q in zip(ya, yb, strict=True))
        assert repr(a) == repr(b) and a.state_dict() == b.state_dict()
        a.close(), b.close()


def test_auto_resolves_and_carries_its_knobs(split):
    ld = Loader(split, batch_size=8, crop=16, backend=Auto(decode="cpu", threads=0))
    assert ld.backend in ("dali", "pil") and ld.decode == "cpu" and ld.threads == 0
    assert ld.decode_settings().decoder == "auto"
    ld.close()
    assert backend_for("auto", decode="cpu", decoder="torchvision") == Auto(decode="cpu", decoder="torchvision")
    assert backend_for("pil", decode="cpu", decoder="torchvision") == Pil(decode="cpu")  # pil has no decoder
    with pytest.raises(ArgumentError, match="decode='mixed'"):  # pil decodes on the CPU only
        Loader(split, batch_size=8, backend=Pil(decode="mixed"))


def test_the_documented_calls_still_work(split, tmp_path):
    """The spellings of README.md, docs/ and examples/ (each keyword once)."""
    calls = [
        dict(batch_size=8, train=True, crop=16, device="cpu", seed=0),
        dict(batch_size=8, train=False, crop=16, crop_pct=0.875, device="cpu", threads=0),
        dict(batch_size=8, crop=16, scale=(0.25, 1.0), ratio=(0.5, 2.0), channels=1, device="cpu"),
        dict(batch_size=8, crop=16, val_resize=20, train=False, channels_last=True, backend="pil"),
        dict(batch_size=8, crop=16, shuffle="block", block_shards=2, drop_last=False, rank=1, world_size=2),
        dict(batch_size=8, crop=16, augment="rand-m9-mstd0.5-inc1", prefetch=3),
        dict(batch_size=8, crop=16, pixel_cache=tmp_path / "px", backend="pil", threads=0),
    ]
    for kw in calls:
        with Loader(split, **kw) as ld:
            images, targets = next(iter(ld))
            assert images.dtype == torch.uint8 and len(images) == len(targets) > 0
    with pytest.raises(ArgumentError, match="cache_dir= is for a URL"):
        Loader(split, batch_size=8, cache_dir=tmp_path / "c")


def test_the_loader_lists_every_keyword_it_takes_with_types():
    """No ``**options``: help(Loader), inspect and an IDE see each keyword, typed; each field of an
    option object given alone is one of them."""
    import inspect

    params = inspect.signature(Loader).parameters
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    assert all(p.annotation is not inspect.Parameter.empty for p in params.values())
    fields = {"threads", "prefetch", "channels", "channels_last", "scale", "ratio", "crop_pct", "val_resize"}
    fields |= {f.name for f in dataclasses.fields(Order) if f.name != "shuffle"}
    fields |= {f.name for f in dataclasses.fields(Storage)} | {"mixing", "weights", "epoch_length", "balance"}
    assert fields <= set(params)
    assert "storage_options: 'dict | None' = None" in str(inspect.signature(Loader))
