"""The decoded-pixel tier (``Loader(pixel_cache=...)``): same batches as the JPEG path, a store keyed
to the split and the decoder, crash-safe, sized before it starts, a byte budget, masks, and the
resolution schedule (``set_crop``, ``ProgressiveCrop``, exact resume)."""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import run_epoch, write_split
from stoker.errors import PixelCacheError
from stoker.pipeline import Loader
from stoker.pipeline.augment import ProgressiveCrop
from stoker.pipeline.deps import HAS_DALI
from stoker.pipeline.pixels import PixelCache
from stoker.pipeline.pixels import store as store_module
from stoker.pipeline.pixels.device import DevicePixelRunner, chroma_window, rgb_to_yuv420, yuv420_to_rgb
from stoker.pipeline.pixels.store import PixelStore
from stoker.pipeline.shards.samples import open_split

BACKENDS = ["pil"] + (["dali"] if HAS_DALI else [])
CROP = 48  # no crop box reaches twice it (images are 40..96 px): the pil JPEG path decodes at full scale


@pytest.fixture
def split(tmp_path):
    path = tmp_path / "train"
    write_split(path, num_samples=40, samples_per_shard=16)
    return path


def make(split, fill="inline", **kw):
    """A Loader of ``split``; its pixel tier fills inline (the first epoch fills the store) unless
    ``fill`` says otherwise."""
    if isinstance(kw.get("pixel_cache"), (str, os.PathLike)):
        kw["pixel_cache"] = PixelCache(kw["pixel_cache"], fill=fill)
    kw.setdefault("batch_size", 8)
    kw.setdefault("crop", CROP)
    kw.setdefault("threads", 0 if kw.get("backend", "pil") == "pil" else 1)
    kw.setdefault("backend", "pil")
    return Loader(split, **kw)


def max_diff(a: list, b: list) -> int:
    assert len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b, strict=True))
    return max(int((x.int() - y.int()).abs().max()) for x, y in zip(a, b, strict=True))


# ---- the same batches as the JPEG path ----------------------------------------------------------
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_from_the_store_equal_the_jpeg_paths(split, tmp_path, backend, train):
    jpeg = make(split, backend=backend, train=train)
    tier = make(split, backend=backend, train=train, pixel_cache=tmp_path / "px")
    filling = None
    for epoch in (0, 1, 2):  # 0 fills the store, 1 and 2 crop from it
        a, ya = run_epoch(tier, epoch)
        b, yb = run_epoch(jpeg, epoch)
        assert [y.tolist() for y in ya] == [y.tolist() for y in yb]
        assert max_diff(a, b) <= 1  # within 1 grey level (equal here: the same decoder, the same resize)
        assert torch.cat(a).float().std() > 20  # pictures, not blanks
        filling = filling or a
    assert tier.runner.decoded == 40 and tier.runner.from_store == 2 * len(torch.cat(ya))
    assert tier.pixel_store.stats()["filled"] == 40
    again, _ = run_epoch(tier, 0)  # from the full store: the filling epoch's batches exactly
    assert all(torch.equal(x, y) for x, y in zip(again, filling, strict=True))


def test_worker_processes_write_batches_through_the_slot_pool(split, tmp_path):
    jpeg = make(split)
    tier = make(split, pixel_cache=tmp_path / "px", threads=2, channels_last=True)
    for epoch in (0, 1):
        a, _ = run_epoch(tier, epoch)
        b, _ = run_epoch(jpeg, epoch)
        assert max_diff(a, b) <= 1
        assert all(x.is_contiguous(memory_format=torch.channels_last) for x in a)
    kept = [x.clone() for x in a]
    run_epoch(tier, 2)  # the slots are written again: the batches handed out are copies, unchanged
    assert all(torch.equal(x, y) for x, y in zip(a, kept, strict=True))
    tier.close()


@pytest.mark.skipif(not HAS_DALI, reason="nvidia-dali not installed")
def test_where_dct_scaling_decodes_the_jpeg_path_small_the_store_resizes_full_pixels(split, tmp_path):
    # crop 16: boxes of 32 px and more are DCT-scaled by the pil path; dali decodes at full scale
    dali = make(split, backend="dali", crop=16)
    pil = make(split, backend="pil", crop=16)
    tier = make(split, crop=16, pixel_cache=tmp_path / "px")
    a, _ = run_epoch(tier, 1)
    assert max_diff(a, run_epoch(dali, 1)[0]) <= 1  # the tier is the full-scale decode's crop
    scaled = run_epoch(pil, 1)[0]
    mean = float(torch.cat([(x.float() - y.float()).abs().mean()[None] for x, y in zip(a, scaled, strict=True)]).max())
    assert 0 < mean < 6  # the DCT-scaled decode is the approximation, close on average


# ---- the store: keyed, crash-safe, sized, budgeted -------------------------------------------------
def test_a_repacked_split_or_another_decoder_gets_a_new_store_and_the_stale_one_goes(split, tmp_path):
    root = tmp_path / "px"
    tier = make(split, pixel_cache=root)
    run_epoch(tier, 0)
    first = tier.pixel_store.dir
    assert tier.pixel_store.stats()["filled"] == 40
    tier.close()
    index = open_split(split)
    other = PixelStore(root, index, decoder="another decoder 1.0")  # a foreign store is never read
    assert other.dir != first and other.stats()["filled"] == 0
    other.close()
    assert not first.exists()  # nobody used it: removed as stale
    write_split(split, num_samples=40, samples_per_shard=16, seed=5)  # repacked: other pictures
    fresh = make(split, pixel_cache=root)
    assert fresh.pixel_store.stats()["filled"] == 0  # rebuilt, never read
    a, _ = run_epoch(fresh, 1)
    assert max_diff(a, run_epoch(make(split), 1)[0]) <= 1


def test_a_store_in_use_is_not_removed_as_stale(split, tmp_path):
    root = tmp_path / "px"
    tier = make(split, pixel_cache=root)
    index = open_split(split)
    PixelStore(root, index, decoder="another decoder 1.0").close()
    assert tier.pixel_store.dir.exists()  # held by the live Loader


KILLED_FILL = """
import sys, time
from stoker.pipeline import Loader
loader = Loader(sys.argv[1], batch_size=4, crop=48, backend="pil", threads=0, pixel_cache=sys.argv[2])
for k, _ in enumerate(loader):
    if k == 3:
        open(sys.argv[3], "w").close()
        time.sleep(60)  # killed here, mid-fill
"""


def test_a_killed_fill_leaves_only_whole_samples_marked(split, tmp_path):
    script, ready = tmp_path / "fill.py", tmp_path / "ready"
    script.write_text(textwrap.dedent(KILLED_FILL))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script), str(split), str(tmp_path / "px"), str(ready)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the fill never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    tier = make(split, pixel_cache=tmp_path / "px")
    store = tier.pixel_store
    filled = np.flatnonzero(store.filled(np.arange(40)))
    assert 0 < len(filled) < 40  # part of the split, killed before the rest
    index = open_split(split)
    for i in filled:  # every sample marked filled holds its whole decode
        whole = np.asarray(Image.open(__import__("io").BytesIO(index.image(int(i)).tobytes())).convert("RGB"))
        assert np.array_equal(store.pixels(int(i)), whole)
    a, _ = run_epoch(tier, 1)  # the rest is filled now, and the batches are the JPEG path's
    assert max_diff(a, run_epoch(make(split), 1)[0]) <= 1 and store.stats()["filled"] == 40


def test_after_a_reboot_only_sealed_markers_are_trusted(split, tmp_path, monkeypatch):
    root = tmp_path / "px"
    tier = make(split, pixel_cache=root)
    next(iter(tier))  # one batch: 8 samples filled, not sealed
    tier.close()
    monkeypatch.setattr(store_module, "boot_id", lambda: "another boot")
    again = make(split, pixel_cache=root)
    assert again.pixel_store.stats()["filled"] == 0  # markers of an unsealed fill: not trusted
    run_epoch(again, 0)  # a whole epoch fills and seals it (in a thread: close waits for it)
    again.close()
    assert (again.pixel_store.dir / "sealed").read_text().strip() == "40"
    monkeypatch.setattr(store_module, "boot_id", lambda: "a third boot")
    assert make(split, pixel_cache=root).pixel_store.stats()["filled"] == 40  # sealed: kept


def test_the_seal_does_not_hold_up_the_next_epoch(split, tmp_path, monkeypatch):
    flushing, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def slow_flush(fd):  # the flush of a large store, here until the test says
        flushing.set()
        assert release.wait(60)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_flush)
    tier = make(split, pixel_cache=tmp_path / "px", threads=1)
    run_epoch(tier, 0)  # fills the whole split: its seal starts
    assert flushing.wait(30)
    batches, _ = run_epoch(tier, 1)  # a whole epoch while the flush has not returned
    assert len(batches) == 5 and tier.runner.from_store == 40
    assert not (tier.pixel_store.dir / "sealed").exists()
    release.set()
    tier.close()  # waits for the seal
    assert (tier.pixel_store.dir / "sealed").read_text().strip() == "40"


def test_a_seal_that_fails_is_one_line_at_close(split, tmp_path, monkeypatch):
    def failing(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    tier = make(split, pixel_cache=tmp_path / "px")
    run_epoch(tier, 0)
    with pytest.raises(PixelCacheError, match=r"^cannot seal the pixel cache .*: Input/output error$"):
        tier.close()
    assert not (tier.pixel_store.dir / "sealed").exists()


def test_pixels_that_do_not_fit_are_one_line_with_the_size_they_need(split, tmp_path, monkeypatch):
    real = os.statvfs

    class Tiny:
        f_bavail, f_frsize = 10, 4096

    monkeypatch.setattr(store_module.os, "statvfs", lambda p: Tiny() if "px" in str(p) else real(p))
    with pytest.raises(PixelCacheError) as e:
        make(split, pixel_cache=tmp_path / "px")
    msg = str(e.value)
    index = open_split(split)
    _, wh = index.images(np.arange(40))
    need = store_module.format_bytes(int((wh[:, 0] * wh[:, 1] * 3).sum()))  # the split's pixels
    assert "\n" not in msg and f"40 samples need {need} more, 41.0 kB is free" in msg and "budget" in msg


def test_the_advised_budget_is_one_the_check_accepts_and_that_fits(split, tmp_path, monkeypatch):
    from stoker.tools.common.units import parse_size

    real = os.statvfs
    free = {"blocks": 10}

    class Tiny:
        f_frsize = 4096

        @property
        def f_bavail(self):
            return free["blocks"]

    monkeypatch.setattr(store_module.os, "statvfs", lambda p: Tiny() if "px" in str(p) else real(p))
    with pytest.raises(PixelCacheError) as e:
        make(split, pixel_cache=tmp_path / "px")
    msg = str(e.value)
    flag, value = msg.split("--pixel-cache-budget ")[1].split(" / pixel_cache_budget=")
    budget = int(value.rstrip(")"))
    assert parse_size(flag, "--pixel-cache-budget") == budget and 0 < budget <= 41_000
    tier = make(split, pixel_cache=PixelCache(tmp_path / "px", budget=budget))  # accepted, and it fits
    assert tier.pixel_store.cacheable >= 1
    tier.close()
    for blocks in (0, 1):  # no room at all, or less than one sample: no budget (0 B is refused) but where to go
        free["blocks"] = blocks
        with pytest.raises(PixelCacheError) as e:
            make(split, pixel_cache=tmp_path / f"px{blocks}")
        msg = str(e.value)
        assert "\n" not in msg and "pixel-cache-budget" not in msg and "pixel_cache_budget" not in msg
        assert "no room for even one sample" in msg
        assert "point the cache at a folder on another disk (node-local disk or /dev/shm)" in msg


def test_a_budget_caches_the_first_samples_that_fit_and_decodes_the_rest(split, tmp_path):
    index = open_split(split)
    _, wh = index.images(np.arange(40))
    sizes = wh[:, 0] * wh[:, 1] * 3
    budget = int(sizes[:15].sum())  # the first 15 samples fit
    tier = make(split, pixel_cache=PixelCache(tmp_path / "px", budget=budget))
    assert tier.pixel_store.cacheable == 15
    jpeg = make(split)
    for epoch in (0, 1):
        a, _ = run_epoch(tier, epoch)
        assert max_diff(a, run_epoch(jpeg, epoch)[0]) <= 1
    assert tier.pixel_store.stats()["filled"] == 15
    assert tier.runner.decoded == 40 + 25  # epoch 1 decoded only what the budget leaves out
    assert os.path.getsize(tier.pixel_store.dir / "pixels.bin") == budget


def test_bad_settings_are_refused_in_one_line(split, tmp_path):
    with pytest.raises(ValueError, match="budget=0 must be a positive number of bytes"):
        PixelCache(tmp_path, budget=0)
    with pytest.raises(ValueError, match="pixel_format='bgr' must be one of"):
        PixelCache(tmp_path, pixel_format="bgr")
    with pytest.raises(ValueError, match="fill='lazy' must be one of"):
        PixelCache(tmp_path, fill="lazy")
    with pytest.raises(ValueError, match="pixel_cache=3 must be a folder or a PixelCache"):
        make(split, pixel_cache=3)


# ---- masks -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def segmentation(tmp_path_factory):
    from stoker.tools.pack import Images, Masks, pack

    root = tmp_path_factory.mktemp("seg")
    rng = random.Random(3)
    colours = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0], [0, 0, 255]], np.uint8)
    for k in range(16):
        w, h = rng.randint(50, 90), rng.randint(50, 90)
        mask = np.zeros((h, w), np.uint8)
        for _ in range(4):
            x0, y0 = rng.randrange(w), rng.randrange(h)
            mask[y0 : y0 + h // 3, x0 : x0 + w // 3] = rng.randint(1, 3)
        (root / "images").mkdir(exist_ok=True)
        (root / "masks").mkdir(exist_ok=True)
        Image.fromarray(colours[mask]).save(root / "images" / f"{k}.png")
        Image.fromarray(mask, "L").save(root / "masks" / f"{k}.png")
    pack(
        root / "images", root / "out", masks=Masks(root / "masks", num_classes=4), images=Images(quality=100), workers=1
    )
    return root / "out" / "train"


@pytest.mark.parametrize("backend", BACKENDS)
def test_masks_from_the_store_equal_the_jpeg_paths(segmentation, tmp_path, backend):
    jpeg = make(segmentation, backend=backend, crop=(40, 32))
    tier = make(segmentation, backend=backend, crop=(40, 32), pixel_cache=tmp_path / "px")
    for epoch in (0, 1):
        a, ma = run_epoch(tier, epoch)
        b, mb = run_epoch(jpeg, epoch)
        assert max_diff(a, b) <= 1
        assert all(torch.equal(x, y) for x, y in zip(ma, mb, strict=True))  # masks: exactly
        assert set(torch.cat(ma).unique().tolist()) > {0}
    assert (tier.pixel_store.dir / "masks.bin").stat().st_size == tier.pixel_store.mask_offsets[-1]


# ---- the device path (run here on the CPU) and YUV 4:2:0 ------------------------------------------
@pytest.mark.parametrize("train", [True, False])
def test_the_device_path_matches_the_jpeg_path_within_one_grey_level(split, tmp_path, train):
    jpeg = make(split, train=train)
    tier = make(split, train=train, pixel_cache=tmp_path / "px")
    runner = DevicePixelRunner(tier.decode_settings(), tier.pixel_store)  # its code, on the CPU
    for epoch in (0, 1):  # filling, then from the store
        batches = [tier.indices(epoch)[k : k + 8] for k in range(0, 40, 8)]
        got = [b.images for b in runner.iterate(batches, epoch, 0)]
        assert max_diff(got, run_epoch(jpeg, epoch)[0]) <= 1  # torch's float resize vs pillow's fixed point
    assert runner.decoded == 40 and runner.from_store == 40


def test_yuv420_round_trips_grey_exactly_and_colour_closely():
    g = torch.Generator().manual_seed(0)
    grey = torch.randint(0, 256, (1, 37, 51), dtype=torch.uint8, generator=g).expand(3, 37, 51)
    planes = rgb_to_yuv420(grey)
    assert planes.numel() == 37 * 51 + 2 * 19 * 26  # half the bytes of RGB, chroma rounded up
    y, u, v = planes[: 37 * 51].view(37, 51), planes[37 * 51 : 37 * 51 + 19 * 26], planes[37 * 51 + 19 * 26 :]
    assert torch.equal(yuv420_to_rgb(y, u.view(19, 26), v.view(19, 26)), grey)
    smooth = (
        torch.nn.functional.interpolate(
            torch.randint(0, 256, (1, 3, 3, 3), generator=g).float(), size=(41, 47), mode="bilinear"
        )[0]
        .round()
        .to(torch.uint8)
    )
    p = rgb_to_yuv420(smooth)
    luma, u, v = p[: 41 * 47].view(41, 47), p[41 * 47 : 41 * 47 + 21 * 24].view(21, 24), p[41 * 47 + 21 * 24 :]
    v = v.view(21, 24)
    back = yuv420_to_rgb(luma, u, v)
    assert (back.int() - smooth.int()).abs().float().mean() < 2
    for x0, y0, x1, y1 in ((3, 5, 20, 17), (0, 0, 47, 41), (10, 30, 47, 41), (1, 1, 2, 2)):
        # a region (odd starts, image edges) converts to exactly the whole image's pixels
        (cx0, cy0, cx1, cy1), (dx, dy) = chroma_window(x0, y0, x1, y1, 47, 41)
        region = yuv420_to_rgb(luma[y0:y1, x0:x1], u[cy0:cy1, cx0:cx1], v[cy0:cy1, cx0:cx1], dx=dx, dy=dy)
        assert torch.equal(region, back[:, y0:y1, x0:x1]), (x0, y0)


def test_a_yuv420_store_holds_half_the_bytes_and_is_close(split, tmp_path):
    tier = make(split, pixel_cache=PixelCache(tmp_path / "px", pixel_format="yuv420"))
    rgb = make(split, pixel_cache=tmp_path / "rgb")
    run_epoch(tier, 0), run_epoch(rgb, 0)
    assert tier.pixel_store.offsets[-1] < 0.52 * rgb.pixel_store.offsets[-1]
    a, _ = run_epoch(tier, 1)
    b, _ = run_epoch(make(split), 1)
    mad = float(torch.cat([(x.float() - y.float()).abs().mean()[None] for x, y in zip(a, b, strict=True)]).mean())
    assert 0 < mad < 4  # lossy: chroma at half resolution


# ---- the resolution schedule -------------------------------------------------------------------
def test_set_crop_between_epochs_changes_the_size_and_never_refills(split, tmp_path):
    tier = make(split, pixel_cache=tmp_path / "px", crop=32)
    assert run_epoch(tier, 0)[0][0].shape[-2:] == (32, 32)
    tier.set_crop(48)
    a, _ = run_epoch(tier, 1)
    assert a[0].shape[-2:] == (48, 48) and tier.runner.decoded == 40  # stored sizes: nothing decoded again
    assert max_diff(a, run_epoch(make(split, crop=48), 1)[0]) <= 1
    tier.set_crop((40, 24))
    assert run_epoch(tier, 2)[0][0].shape[-2:] == (40, 24)
    with pytest.raises(ValueError, match="crop=0 must be a positive integer"):
        tier.set_crop(0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_schedule_sets_each_epochs_crop_and_a_resume_keeps_it(split, backend):
    schedule = ProgressiveCrop(32, 64, ramp=(1, 3))
    whole = make(split, backend=backend)
    whole.set_crop(schedule)
    sizes = [run_epoch(whole, e)[0][0].shape[-1] for e in range(4)]
    assert sizes == [32, 32, 64, 64] == schedule.sides(4)  # 48 rounds to 64 (a multiple of 32)
    ref, _ = run_epoch(whole, 2)
    first = make(split, backend=backend)
    first.set_crop(schedule)
    first.set_epoch(2)
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    assert state["crop"] == [64, 64]  # mid-epoch at a crop the constructor did not give
    second = make(split, backend=backend, crop=24)  # another crop, another schedule: the state wins
    second.load_state_dict(state)
    rest, _ = run_epoch(second)
    assert all(torch.equal(x, y) for x, y in zip(rest, ref[2:], strict=True))
    assert second.crops.size == (64, 64)


def test_progressive_parses_ffcvs_ramp_and_refuses_nonsense():
    ffcv = ProgressiveCrop.parse("160:192:11-13", 16)
    assert ffcv.ramp == (11, 13) and ffcv.sides(16) == [160] * 12 + [192] * 4
    assert ProgressiveCrop.parse("128:224", 10).sides(10) == [128, 128, 160, 160, 160, 192, 192, 192, 224, 224]
    assert ProgressiveCrop.parse("160:192:4", 8).ramp == (0, 4)
    assert ProgressiveCrop(224, 128, ramp=(0, 3)).sides(4) == [224, 192, 160, 128]  # downward too
    assert ProgressiveCrop(100, 120, ramp=(0, 2))(1) == 100  # 110 rounds to 96: kept within the sides
    for bad in ("160", "a:b", "160:192:5-2", "0:192", "160:192:x"):
        with pytest.raises(ValueError, match="progressive"):
            ProgressiveCrop.parse(bad, 10)


def test_the_key_names_what_made_the_pixels(split, tmp_path):
    tier = make(split, pixel_cache=tmp_path / "px")
    key = json.loads((tier.pixel_store.dir / "key.json").read_text())
    assert key["decoder"].startswith("pillow ") and "libjpeg-turbo" in key["decoder"]
    assert key["channels"] == 3 and key["pixel_format"] == "rgb" and len(key["manifest_sha256"]) == 64


@pytest.mark.gpu
@pytest.mark.parametrize("pixel_format", ["rgb", "yuv420"])
def test_on_a_gpu_the_store_gives_the_nvjpeg_paths_batches(split, tmp_path, pixel_format):
    jpeg = make(split, backend="nvjpeg", device="cuda", threads=1)
    tier = make(
        split,
        backend="nvjpeg",
        device="cuda",
        threads=1,
        pixel_cache=PixelCache(tmp_path / "px", pixel_format=pixel_format),
    )
    assert isinstance(tier.runner or tier._get_runner(), DevicePixelRunner)
    for epoch in (0, 1):  # filled by the nvjpeg backend's decoder, then cropped on the device from the store
        a, ya = run_epoch(tier, epoch)
        b, yb = run_epoch(jpeg, epoch)
        assert [y.tolist() for y in ya] == [y.tolist() for y in yb] and a[0].device.type == "cuda"
        if pixel_format == "rgb":
            assert max_diff(a, b) <= 1
        else:  # chroma at half resolution: close, not equal
            mads = [(x.float() - y.float()).abs().mean() for x, y in zip(a, b, strict=True)]
            assert float(torch.stack(mads).mean()) < 4
    assert tier.runner.decoded == 40 and tier.runner.from_store > 0


# ---- the warm crop kernel and the background fill ------------------------------------------------
@pytest.mark.parametrize("chw", [True, False])
@pytest.mark.parametrize("channels", [3, 1])
def test_the_warm_crop_is_within_one_grey_level_of_pillows_crop_then_resize(chw, channels):
    from stoker.pipeline.backends.gpu_resize import filter_regions
    from stoker.pipeline.backends.resize import MODES, resize_into
    from stoker.pipeline.pixels import kernel

    assert kernel.cv2_or_none() is not None  # a dependency: this machine's OpenCV passes the check
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, (90, 120, channels), dtype=np.uint8)  # noise: the steepest edges
    crop, fast = (64, 72), 0
    for _ in range(60):
        w, h = int(rng.integers(8, 110)), int(rng.integers(8, 85))
        x, y = int(rng.integers(0, 120 - w)), int(rng.integers(0, 90 - h))
        flip = bool(rng.integers(2))
        _, _, lo, hi = filter_regions(np.array([[x, y, w, h]]), np.array([[90, 120]]), crop)
        lo, hi = lo[0].tolist(), hi[0].tolist()
        shape = (1, channels, *crop) if chw else (1, *crop, channels)
        got, want = np.empty(shape, np.uint8), np.empty(shape, np.uint8)
        kernel.crop_into(got, 0, pixels, (x, y, w, h), flip, crop, lo, hi, chw=chw)
        region = Image.fromarray(
            np.ascontiguousarray(pixels[y : y + h, x : x + w]).squeeze(-1)
            if channels == 1
            else np.ascontiguousarray(pixels[y : y + h, x : x + w]),
            MODES[channels],
        )
        resize_into(want, 0, region, crop, flip, chw=chw)
        assert np.abs(got.astype(int) - want).max() <= 1, (x, y, w, h, flip)
        fast += kernel.fast((x, y, w, h), lo, hi, crop)
    assert 10 < fast < 60  # both ways were taken: OpenCV's upscales, pillow's antialiased downscales


def test_an_opencv_that_drifts_from_pillow_is_not_used(monkeypatch):
    from stoker.pipeline.pixels import kernel

    cv2 = kernel.cv2_or_none()
    good = kernel._warp

    def shifted(cv2, region, crop, flip, dst):
        good(cv2, region, crop, flip, dst)
        dst[...] = np.clip(dst.astype(int) + 3, 0, 255)

    monkeypatch.setattr(kernel, "_warp", shifted)
    assert not kernel._agrees(cv2)
    monkeypatch.setattr(kernel, "_warp", good)
    assert kernel._agrees(cv2)


def test_a_caller_holding_every_batch_still_gets_each_one_right(split, tmp_path):
    jpeg = make(split, batch_size=2)
    tier = make(split, pixel_cache=tmp_path / "px", threads=2, batch_size=2)
    run_epoch(tier, 0)
    held, _ = run_epoch(tier, 1)  # every batch kept: the slots run out, the rest travel as torch sends them
    assert max_diff(held, run_epoch(jpeg, 1)[0]) <= 1
    assert tier.runner.lender.unslotted > 0
    tier.close()


def test_the_background_fill_runs_the_jpeg_path_in_epoch_0_and_crops_from_the_store_after(split, tmp_path):
    from stoker.pipeline.pixels.fill import FillingRunner, missing_share

    jpeg = make(split)
    tier = make(split, pixel_cache=tmp_path / "px", fill="background", threads=1)
    a, _ = run_epoch(tier, 0)
    assert isinstance(tier.runner, FillingRunner) and not tier.runner.cropping
    assert all(torch.equal(x, y) for x, y in zip(a, run_epoch(jpeg, 0)[0], strict=True))  # the JPEG path itself
    b, _ = run_epoch(tier, 1)  # from the store, whether or not the filler is done: what it lacks is decoded
    assert tier.runner.cropping and tier.runner.from_store + tier.runner.decoded == len(torch.cat(b))
    assert max_diff(b, run_epoch(jpeg, 1)[0]) <= 1
    deadline = time.monotonic() + 60
    while missing_share(tier.pixel_store) > 0:  # the nice-19 filler ends the store on its own
        assert time.monotonic() < deadline, "the background fill never finished"
        time.sleep(0.05)
    store, index = tier.pixel_store, open_split(split)
    for i in (0, 17, 39):  # what the filler wrote is the whole decode
        whole = np.asarray(Image.open(__import__("io").BytesIO(index.image(i).tobytes())).convert("RGB"))
        assert np.array_equal(store.pixels(i), whole)
    tier.close()
    assert not tier.decoding.runner  # closed: the filler is gone with it
    # a run over the full store gives the same batches: epoch 0 from the JPEG path still, 1 from the store
    rerun = make(split, pixel_cache=tmp_path / "px", fill="background", threads=1)
    assert all(torch.equal(x, y) for x, y in zip(run_epoch(rerun, 0)[0], a, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(run_epoch(rerun, 1)[0], b, strict=True))
    assert rerun.runner.filler is None and rerun.runner.decoded == 0  # nothing left to fill
    rerun.close()


def test_the_filler_fills_a_mask_split_with_its_masks(segmentation, tmp_path):
    from stoker.pipeline.pixels.fill import fill_store, missing_share

    tier = make(segmentation, pixel_cache=tmp_path / "px", threads=0)
    store = tier.pixel_store
    assert fill_store(tier.decode_settings(), store, start=5) == 16 and missing_share(store) == 0
    a, ma = run_epoch(tier, 1)
    b, mb = run_epoch(make(segmentation), 1)
    assert max_diff(a, b) <= 1 and all(torch.equal(x, y) for x, y in zip(ma, mb, strict=True))
    assert tier.runner.decoded == 0


def test_the_workers_begin_the_next_epoch_early_and_it_is_the_epoch_asked_for(split, tmp_path):
    def copies(loader, epoch):
        loader.set_epoch(epoch)
        return [(x.clone(), y.clone()) for x, y in loader]  # the lent slots go back

    def same(a, b):
        pairs = zip(a, b, strict=True) if len(a) == len(b) else []
        return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in pairs)

    tier = make(split, pixel_cache=tmp_path / "px", threads=2)
    ref = make(split, pixel_cache=tmp_path / "px", threads=0)  # no workers: nothing begun early
    copies(tier, 0)  # fills the store
    for epoch in (1, 2, 5):  # 1 and 2 follow on (begun early); 5 is a jump: what was begun for 3 is dropped
        assert same(copies(tier, epoch), copies(ref, epoch)), epoch
    assert tier.runner.ran_ahead == 2
    tier.set_epoch(6)
    for k, _ in enumerate(tier):  # a loop cut short (6 was begun early): it starts over from nothing begun
        if k == 1:
            break
    assert tier.runner.ran_ahead == 3
    assert same(copies(tier, 6), copies(ref, 6)) and tier.runner.ran_ahead == 3
    tier.set_crop(CROP // 2)  # another crop: the next epoch begun at the old one is dropped
    ref.set_crop(CROP // 2)
    assert same(copies(tier, 7), copies(ref, 7)) and tier.runner.ran_ahead == 3
    assert same(copies(tier, 8), copies(ref, 8)) and tier.runner.ran_ahead == 4
    tier.close()
