import io
import random

import numpy as np
import pytest
from PIL import Image

from stoker.tools.common.synth import bomb_png, draw, encode, make_image_folder, nasty_files
from stoker.tools.pack import Images, Shards, pack
from stoker.tools.pack import sanitize as sanitize_module
from stoker.tools.pack.sanitize import Settings, sanitize, sanitize_bytes, target_size


def decode(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    return im


BAD_REASONS = {
    "bad_truncated.jpg": "truncated",
    "bad_zero.jpg": "empty file",
    "bad_not_an_image.jpg": "not an image",
    "bad_bomb.png": "too many pixels (100000x100000)",
}


@pytest.mark.parametrize("short_side", [0, 64])
def test_nasty_inputs_rejected_with_reason_or_made_baseline_rgb(short_side):
    files = nasty_files(random.Random(0))
    assert set(BAD_REASONS) == {n for n in files if n.startswith("bad_")}
    for name, data in files.items():
        r = sanitize_bytes(data, Settings(short_side=short_side))
        if name.startswith("bad_"):
            assert r.jpg is None and r.reason == BAD_REASONS[name], name
            continue
        assert r.reason is None, (name, r.reason)
        im = decode(r.jpg)
        # one-channel inputs (grayscale, 16-bit) stay one channel; everything else is RGB
        one_channel = name in ("gray.jpg", "gray16.png")
        assert im.format == "JPEG" and im.mode == ("L" if one_channel else "RGB"), name
        assert not im.info.get("progressive") and not im.info.get("progression"), name
        if short_side:
            assert min(im.size) == min(short_side, r.width, r.height), name


def test_baseline_rgb_jpeg_within_limits_is_copied_unless_reencode():
    data = encode(draw("circles", (120, 90), random.Random(1)), quality=80)
    r = sanitize_bytes(data, Settings(short_side=256))
    assert r.copied and r.jpg == data and (r.width, r.height) == (120, 90)
    r2 = sanitize_bytes(data, Settings(short_side=256, reencode=True))
    assert not r2.copied and r2.jpg != data and decode(r2.jpg).size == (120, 90)
    # needs a resize -> re-encoded
    r3 = sanitize_bytes(data, Settings(short_side=45))
    assert not r3.copied and decode(r3.jpg).size == (60, 45)
    # progressive -> re-encoded even when small; a baseline grayscale JPEG is copied as it is
    assert not sanitize_bytes(encode(draw("circles", (80, 60), random.Random(1)), progressive=True), Settings()).copied
    gray = encode(Image.new("L", (80, 60), 7))
    assert sanitize_bytes(gray, Settings()).copied and sanitize_bytes(gray, Settings()).jpg == gray


def test_exif_rotated_comes_out_upright_with_marker_in_place():
    upright = Image.new("RGB", (240, 160), (0, 0, 255))
    upright.paste((255, 0, 0), (0, 0, 60, 60))  # red marker at the top-left of the upright picture
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display": store the picture rotated 90 CCW
    data = encode(upright.transpose(Image.Transpose.ROTATE_90), quality=95, exif=exif.tobytes())
    assert decode(data).size == (160, 240)
    for short_side in (0, 40):  # with and without the draft-mode resize path
        r = sanitize_bytes(data, Settings(short_side=short_side))
        assert (r.width, r.height) == (240, 160)
        im = decode(r.jpg)
        assert im.size == ((240, 160) if not short_side else (60, 40))
        w, h = im.size
        assert np.allclose(im.getpixel((w // 16, h // 16)), (255, 0, 0), atol=40)
        assert np.allclose(im.getpixel((w - 2, h - 2)), (0, 0, 255), atol=40)
        assert np.allclose(im.getpixel((w // 16, h - 2)), (0, 0, 255), atol=40)


def test_cmyk_colours_survive():
    rgb = Image.new("RGB", (96, 64), (200, 40, 90))
    rgb.paste((30, 180, 60), (48, 0, 96, 64))
    r = sanitize_bytes(encode(rgb.convert("CMYK"), quality=95), Settings(short_side=0))
    out = np.asarray(decode(r.jpg), dtype=np.float64)
    ref = np.asarray(rgb, dtype=np.float64)
    assert np.abs(out[:, :40].mean((0, 1)) - ref[:, :40].mean((0, 1))).max() < 8
    assert np.abs(out[:, 56:].mean((0, 1)) - ref[:, 56:].mean((0, 1))).max() < 8


def test_alpha_composited_on_white_and_16bit_scaled():
    rgba = Image.new("RGBA", (32, 32), (255, 0, 0, 255))
    rgba.paste((0, 0, 0, 0), (0, 0, 16, 32))  # left half fully transparent
    out = np.asarray(decode(sanitize_bytes(encode(rgba, "PNG"), Settings(short_side=0)).jpg), dtype=int)
    assert (out[:, :12] > 235).all()  # white, not black
    assert np.allclose(out[:, 20:].mean((0, 1)), (255, 0, 0), atol=12)

    g16 = Image.new("I;16", (32, 32))
    g16.putdata([60000] * (32 * 32))
    out = np.asarray(decode(sanitize_bytes(encode(g16, "PNG"), Settings(short_side=0)).jpg), dtype=int)
    assert abs(out.mean() - 60000 / 256) < 3


def test_pixel_limit_checked_before_decoding():
    r = sanitize_bytes(bomb_png(5000, 4000), Settings(max_pixels=1_000_000))
    assert r.reason == "too many pixels (5000x4000)"
    r = sanitize_bytes(encode(Image.new("RGB", (40, 30))), Settings(max_pixels=1000))
    assert r.reason == "too many pixels (40x30)"


def test_the_pixel_limit_is_the_packs_own_and_pillows_stays_untouched(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # someone else's setting in this process
    Image.preinit()
    factory, accept = Image.OPEN["JPEG"]
    seen = []

    def spy(fp, filename):
        seen.append(Image.MAX_IMAGE_PIXELS)
        return factory(fp, filename)

    monkeypatch.setitem(Image.OPEN, "JPEG", (spy, accept))
    data = encode(draw("rings", (64, 48), random.Random(2)))
    r = sanitize_bytes(data, Settings(reencode=True))  # 3,072 pixels: past Pillow's 100, within the pack's
    assert r.reason is None and (r.width, r.height) == (64, 48)
    assert sanitize_bytes(data, Settings(max_pixels=3071)).reason == "too many pixels (64x48)"
    assert seen and set(seen) == {100} and Image.MAX_IMAGE_PIXELS == 100  # read, never set
    monkeypatch.undo()
    assert decode(r.jpg).size == (64, 48)


@pytest.mark.parametrize("where", ["_to_rgb_or_l", "encode_jpeg"])
def test_a_bug_in_the_sanitizer_raises_through_pack_and_damage_is_still_a_reject(tmp_path, monkeypatch, where):
    src = make_image_folder(tmp_path / "src", classes=("circles",), per_class=3, min_side=32, max_side=48)
    truncated = nasty_files(random.Random(0))["bad_truncated.jpg"]
    (src / "circles" / "0-truncated.jpg").write_bytes(truncated)

    def bug(*args, **kwargs):
        raise TypeError("a bug in stoker's own code")

    monkeypatch.setattr(sanitize_module, where, bug)
    assert sanitize_bytes(truncated, Settings(reencode=True)).reason == "truncated"  # fails before the bug
    with pytest.raises(TypeError, match="a bug in stoker's own code"):  # not every image a reject
        pack(src, tmp_path / "out", images=Images(reencode=True), shards=Shards(samples=4), workers=1)
    monkeypatch.undo()
    result = pack(src, tmp_path / "again", images=Images(reencode=True), shards=Shards(samples=4), workers=1)
    rejects = (tmp_path / "again" / "rejects.jsonl").read_text()
    assert result.packed == 3 and '"truncated"' in rejects and "0-truncated.jpg" in rejects


def test_unreadable_path_reports_errno(tmp_path):
    r = sanitize(str(tmp_path / "missing.jpg"), Settings())
    assert r.jpg is None and r.reason.startswith("unreadable: errno 2")
    r = sanitize(str(tmp_path), Settings())  # a directory
    assert r.jpg is None and r.reason == "not a regular file (folder)"


def test_target_size_never_upscales():
    assert target_size(500, 375, 256, 0) == (341, 256)
    assert target_size(200, 100, 256, 0) == (200, 100)
    assert target_size(500, 375, 0, 256) == (256, 192)
    assert target_size(500, 375, 256, 300) == (300, 225)
    assert target_size(500, 375, 0, 0) == (500, 375)


def test_settings_validate_eagerly():
    with pytest.raises(ValueError, match="quality"):
        Settings(quality=0)
    with pytest.raises(ValueError, match="-1"):
        Settings(short_side=-1)


def test_output_is_deterministic():
    data = encode(draw("rings", (150, 100), random.Random(3)), "PNG")
    assert sanitize_bytes(data, Settings(short_side=64)).jpg == sanitize_bytes(data, Settings(short_side=64)).jpg
