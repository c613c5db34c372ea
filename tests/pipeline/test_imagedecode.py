"""The decode module every decoder path shares (pipeline/imagedecode.py): one JPEG signature rule,
scalar and vectorized; Pillow opened with a per-call pixel limit that never touches Pillow's
process-wide one; and the pillow decoders of the Loader's masks, which drop a damaged input and
raise a bug."""

import io
import random
import types
import warnings

import numpy as np
import pytest
from PIL import Image, ImageFile

from stoker.pipeline import imagedecode
from stoker.pipeline.backends.base import decode_masks
from stoker.pipeline.imagedecode import DAMAGED_INPUT, TooManyPixels, is_jpeg, is_jpeg_each, open_image
from stoker.pipeline.shards.kinds import check_mask
from stoker.tools.common.synth import bomb_png, draw, encode

CASES = {
    "jpeg": b"\xff\xd8\xff\xe0rest",
    "exactly the signature": b"\xff\xd8\xff",
    "SOI then no marker": b"\xff\xd8\x00\x00",
    "empty": b"",
    "1 byte": b"\xff",
    "2 bytes": b"\xff\xd8",
    "png": b"\x89PNG\r\n\x1a\n",
}
IS_JPEG = {"jpeg", "exactly the signature"}


def test_is_jpeg_is_ff_d8_ff_and_the_vectorized_check_agrees():
    assert {name for name, data in CASES.items() if is_jpeg(data)} == IS_JPEG
    assert is_jpeg(bytearray(CASES["jpeg"])) and is_jpeg(np.frombuffer(CASES["jpeg"], np.uint8))
    # every order, so a short buffer sits first, last and between others in the blob
    names = list(CASES)
    for seed in range(8):
        random.Random(seed).shuffle(names)
        datas = [CASES[n] for n in names]
        blob = np.frombuffer(b"".join(datas), np.uint8)
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in datas])]).astype(np.int64)
        assert is_jpeg_each(blob, offsets).tolist() == [is_jpeg(d) for d in datas], names
    for short in ([b""], [b"\xff"], [b"\xff\xd8"], [b"", b"\xff\xd8"], []):
        blob = np.frombuffer(b"".join(short), np.uint8)
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in short])]).astype(np.int64)
        assert is_jpeg_each(blob, offsets).tolist() == [False] * len(short)


@pytest.fixture
def spy_png(monkeypatch):
    """Pillow's process-wide limit as its PNG plugin saw it, each time the plugin opened a file."""
    seen = []
    Image.preinit()  # the PNG plugin registered
    factory, accept = Image.OPEN["PNG"]

    def spy(fp, filename):
        seen.append(Image.MAX_IMAGE_PIXELS)
        return factory(fp, filename)

    monkeypatch.setitem(Image.OPEN, "PNG", (spy, accept))
    return seen


def test_the_pixel_limit_is_per_call_and_pillows_stays_untouched(spy_png):
    default = Image.MAX_IMAGE_PIXELS
    bomb = bomb_png(100_000, 100_000)  # 10^10 pixels: Pillow itself refuses it
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(bomb))
    spy_png.clear()
    filters = list(warnings.filters)
    im = open_image(bomb, max_pixels=2 * 10**10)  # within the caller's limit: opened (header only)
    assert im.size == (100_000, 100_000) and im.format == "PNG"
    with pytest.raises(TooManyPixels, match=r"^too many pixels \(100000x100000\)$") as e:
        open_image(bomb, max_pixels=10**10 - 1)  # past the caller's: a reject, one of DAMAGED_INPUT
    assert e.value.size == (100_000, 100_000) and isinstance(e.value, DAMAGED_INPUT)
    # Pillow refused it first, then its plugin opened it directly: the global was never changed,
    # not during the calls and not after them; the warning filters are as they were
    assert len(spy_png) == 4 and set(spy_png) == {default}
    assert Image.MAX_IMAGE_PIXELS == default and warnings.filters == filters
    # between Pillow's limit and twice it, Pillow only warns: no warning comes out of open_image
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert open_image(bomb_png(10_000, 10_000), max_pixels=10**8).size == (10_000, 10_000)
    assert caught == []
    # a small image decodes as Image.open's would
    data = encode(draw("circles", (40, 30), random.Random(0)), "PNG")
    small = open_image(data, max_pixels=1200)
    small.load()
    assert np.array_equal(np.asarray(small), np.asarray(Image.open(io.BytesIO(data))))
    with pytest.raises(TooManyPixels):
        open_image(data, max_pixels=1199)
    with pytest.raises(Image.UnidentifiedImageError):
        open_image(b"not an image at all", max_pixels=10**6)


def test_a_lowered_pillow_limit_is_not_the_callers(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # someone else's setting, in this process
    data = encode(draw("rings", (64, 48), random.Random(0)))
    with pytest.raises(Image.DecompressionBombError):
        Image.open(io.BytesIO(data))
    im = open_image(data, max_pixels=64 * 48)
    im.load()
    assert im.size == (64, 48) and im.format == "JPEG" and Image.MAX_IMAGE_PIXELS == 100


def _mask_png(size=(8, 6), value=1) -> bytes:
    return encode(Image.fromarray(np.full(size[::-1], value, np.uint8), "L"), "PNG")


def _truncated_png() -> bytes:
    data = encode(Image.fromarray(np.random.default_rng(0).integers(0, 4, (60, 80), np.uint8), "L"), "PNG")
    return data[: len(data) // 2]


def test_the_loaders_mask_decoders_drop_damage_and_raise_a_bug(monkeypatch):
    good, bad = _mask_png(), _truncated_png()
    target = types.SimpleNamespace(num_classes=0, ignore_index=255)
    out = decode_masks(types.SimpleNamespace(masks=[np.frombuffer(good, np.uint8), np.frombuffer(bad, np.uint8)]))
    assert out[0].tolist() == np.ones((6, 8), np.uint8).tolist() and out[1] is None
    assert check_mask(target, good, (8, 6)) is None
    assert check_mask(target, bad, None).startswith("mask does not decode")

    def bug(self):
        raise TypeError("a bug, not a damaged mask")

    monkeypatch.setattr(ImageFile.ImageFile, "load", bug)
    with pytest.raises(TypeError, match="a bug"):
        check_mask(target, good, (8, 6))
    with pytest.raises(TypeError, match="a bug"):
        decode_masks(types.SimpleNamespace(masks=[np.frombuffer(good, np.uint8)]))


def test_native_decoder_bugs_are_told_from_damage():
    assert issubclass(RuntimeError, imagedecode.NATIVE_DECODE_ERRORS)
    assert not imagedecode.native_bug(RuntimeError("Not a JPEG file"))
    assert imagedecode.native_bug(NotImplementedError()) and imagedecode.native_bug(RecursionError())
    assert not any(issubclass(t, imagedecode.DAMAGED_INPUT) for t in (TypeError, NameError, AttributeError, KeyError))


def test_quiet_pillow_silences_pillows_warnings_only():
    im = Image.new("P", (4, 4))
    im.info["transparency"] = b"\x00\x01"  # Pillow warns about it on convert
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        im.convert("RGB")
        assert len(caught) == 1  # shown outside the block
        with imagedecode.quiet_pillow():
            im.convert("RGB")
            warnings.warn("not Pillow's", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught[1:]] == ["not Pillow's"]
