"""The nvjpeg backend and backend selection. Runs without a GPU: the runner's code path with
torchvision's CPU decode, against the pil backend on the same crop boxes."""

import io
import random
import threading
import time
import warnings

import numpy as np
import pytest
import torch

from helpers import run_epoch, write_split
from stoker.pipeline import Loader, deps
from stoker.pipeline.backends import decoders
from stoker.pipeline.backends.decoders import Decoder
from stoker.pipeline.backends.nvjpeg import NvjpegRunner, crop_resize, decode_jpegs
from stoker.pipeline.backends.resize import resize_into
from stoker.pipeline.shards.manifest import Manifest
from stoker.pipeline.shards.writer import ShardWriter
from stoker.tools.common.synth import CLASSES, draw, encode


def choose(requested, device, decoder=None):
    """The registry's choice as ``(name, why)``."""
    from stoker.pipeline.backends import resolve_backend

    backend, why = resolve_backend(requested, device, decoder=decoder)
    return backend.name, why


# torchvision 0.29 deprecates its image decoders in favour of TorchCodec (the backend's note)
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

CROP = 32
# The resize is pillow's own weights as matrix products, the box's surroundings read as pillow
# reads them; only pillow's fixed-point rounding differs. Measured on these procedural images
# (sides 40-120 px, JPEG q90; 3 seeds, train and val): vs pillow's resize of the same box and vs
# the pil backend at crop 64, no pixel differs by more than 1 grey level, and the per-image mean
# absolute difference is ~0.12, worst 0.21. (Where a box is >= 2 x crop the pil backend decodes
# at reduced DCT scale, pillow's draft, which differs from its own full-scale decode by up to ~17
# on high-frequency patterns, so the comparison with it uses boxes below that.)
MAX_DIFF = 1
MAD_BOUND = 0.5
# nvJPEG vs libjpeg-turbo, the same boxes and resize: the decoders' IDCT and chroma upsampling
# differ most on these small pictures with sharp coloured edges. Measured on an H200
# (2026-12-04, torchvision 0.26): per-image MAD mean 3.3, worst 17.2 (on 512 ImageNet photos,
# full decode: mean 0.76, worst 4.4). Swapped channels give a mean of ~50 here.
MAD_GPU_MEAN = 5.0
MAD_GPU_WORST = 25.0


@pytest.fixture
def split(tmp_path):
    """60 samples in 4 shards, sides 40-120 px; label = global position."""
    path = tmp_path / "train"
    write_split(path, num_samples=60, samples_per_shard=16, classes=list(CLASSES) * 10, max_side=120)
    return path


def nvjpeg_loader(path, **kw):
    """A Loader whose runner is the nvjpeg one, decoding on the CPU (device='cpu')."""
    kw.setdefault("batch_size", 8)
    kw.setdefault("crop", CROP)
    loader = Loader(path, backend="pil", threads=0, **kw)
    loader.decoding.runner = NvjpegRunner(loader.decode_settings())
    return loader


run = run_epoch


def per_image_mad(a, b):
    return (a.float() - b.float()).abs().mean(dim=(1, 2, 3))


# ---- backend selection -----------------------------------------------------------------


@pytest.fixture
def env(monkeypatch):
    """Set what resolve_backend sees: ``env(dali=, cuda=, probe=)``."""

    def set_(dali: bool, cuda: bool, probe=(True, "torchvision 0.x decodes JPEGs on the GPU (nvJPEG)")):
        monkeypatch.setattr(deps, "HAS_DALI", dali)
        monkeypatch.setattr(deps, "has_cuda", lambda: cuda)
        monkeypatch.setattr(
            decoders, "gpu_jpeg_decode", lambda device="cuda": probe if cuda else (False, "torch sees no CUDA device")
        )

    return set_


@pytest.mark.parametrize(
    "dali,cuda,probe_ok,device,expected",
    [
        (True, False, False, "cpu", "dali"),  # DALI's CPU decode is the fast CPU path
        (False, False, False, "cpu", "pil"),
        (True, True, True, "cuda", "dali"),
        (False, True, True, "cuda", "nvjpeg"),
        (False, True, False, "cuda", "pil"),  # torchvision's GPU decode broken: pillow
        (False, True, True, "cpu", "pil"),  # a CUDA machine, but the batches go to the CPU
    ],
)
def test_auto_picks_dali_then_nvjpeg_then_pil(env, dali, cuda, probe_ok, device, expected):
    env(dali, cuda, (probe_ok, "nvJPEG says hello" if probe_ok else "RuntimeError: no nvjpeg"))
    backend, why = choose("auto", device)
    assert backend == expected
    assert ("nvidia-dali is installed" in why) == dali
    if expected == "pil" and device == "cuda":
        assert "RuntimeError: no nvjpeg" in why
    if expected == "nvjpeg":
        assert "nvJPEG says hello" in why


def test_explicit_backends_and_their_fixes(env):
    env(False, False)
    with pytest.raises(ValueError, match="device='cuda', or backend='pil'"):
        choose("nvjpeg", "cpu")
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        choose("nvjpeg", "cuda")
    with pytest.raises(ValueError, match="nvidia-dali is not installed"):
        choose("dali", "cpu")
    with pytest.raises(ValueError, match="must be one of"):
        choose("ffcv", "cpu")
    assert choose("pil", "cpu") == ("pil", "requested")
    env(False, True, (False, "RuntimeError: nvjpeg missing"))
    with pytest.raises(
        ValueError,
        match=r"cannot decode JPEGs on this GPU \(RuntimeError: nvjpeg missing\); "
        r"use backend='pil'",
    ):
        choose("nvjpeg", "cuda")
    env(True, True)
    assert choose("nvjpeg", "cuda") == ("nvjpeg", "requested")
    assert choose("nvjpeg", "cuda:1") == ("nvjpeg", "requested")
    with pytest.raises(ValueError, match="device 'mps': only 'cpu' and 'cuda'"):
        choose("auto", "mps")
    assert choose("dali", "cuda") == ("dali", "requested")


def test_probe_without_cuda_says_so(monkeypatch):
    monkeypatch.setattr(deps, "has_cuda", lambda: False)
    decoders.gpu_jpeg_decode.cache_clear()
    try:
        assert decoders.gpu_jpeg_decode() == (False, "torch sees no CUDA device")
    finally:
        decoders.gpu_jpeg_decode.cache_clear()


def test_probe_jpeg_is_the_red_picture_it_claims():
    import base64

    from PIL import Image

    im = Image.open(io.BytesIO(base64.b64decode(decoders.PROBE_JPEG)))
    assert im.size == (16, 8) and im.mode == "RGB"
    assert 170 <= np.asarray(im)[..., 0].mean() <= 230


# ---- the batched crop + resize ---------------------------------------------------------


def test_crop_resize_matches_pillow_on_the_same_boxes(split):
    """Same decoded pixels, same boxes: only the resize differs (torch vs pillow)."""
    from PIL import Image

    loader = Loader(split, batch_size=8, crop=CROP, backend="pil", threads=0)
    ids = loader.index.valid
    enc, wh = loader.index.images(ids)
    from stoker.pipeline import augment

    boxes, flips = augment.random_resized_crop(wh, ids, seed=0, epoch=0)
    boxes[:4] = [[0, 0, 40, 40], [3, 5, 16, 12], [0, 0, 32, 32], [1, 1, 39, 30]]  # edges, upscale, identity
    flips[:4] = [False, True, True, False]
    decoded = decode_jpegs([torch.from_numpy(e.copy()) for e in enc], "cpu")
    out = torch.empty(len(ids), 3, CROP, CROP, dtype=torch.uint8)
    crop_resize(decoded, boxes, flips, out)
    ref = np.empty((len(ids), 3, CROP, CROP), np.uint8)
    for k, d in enumerate(decoded):
        resize_into(ref, k, Image.fromarray(d.permute(1, 2, 0).numpy()), CROP, bool(flips[k]), box=boxes[k])
    mad = per_image_mad(out, torch.from_numpy(ref))
    assert mad.max() < MAD_BOUND, mad.max()
    assert (out.int() - torch.from_numpy(ref).int()).abs().max() <= MAX_DIFF
    assert torch.equal(out[2], torch.from_numpy(ref[2]))  # a box of exactly crop x crop is a copy
    # the flip mirrors the picture: the other choice of flips gives the mirror images (+-1 rounding)
    mirrored = torch.empty_like(out)
    crop_resize(decoded, boxes, ~flips, mirrored)
    assert (mirrored.flip(-1).int() - out.int()).abs().max() <= 1
    assert (mirrored.int() - out.int()).abs().float().mean() > 5  # and is not a no-op


@pytest.mark.parametrize("channels_last", [False, True])
def test_crops_resized_together_equal_one_by_one(channels_last):
    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 60, 80), dtype=torch.uint8, generator=g) for _ in range(5)]
    images.append(torch.randint(0, 256, (3, 40, 30), dtype=torch.uint8, generator=g))
    boxes = np.array([[10, 5, 52, 52]] * 3 + [[0, 0, 32, 32], [0, 0, 32, 32], [20, 30, 90, 90]])  # last: past the edge
    flips = np.array([False, True, False, True, False, True])

    def alloc(n):
        if channels_last:
            return torch.zeros(n, CROP, CROP, 3, dtype=torch.uint8).permute(0, 3, 1, 2)
        return torch.zeros(n, 3, CROP, CROP, dtype=torch.uint8)

    together = alloc(6)
    crop_resize(images, boxes, flips, together)
    for k in range(6):
        alone = alloc(1)
        crop_resize(images[k : k + 1], boxes[k : k + 1], flips[k : k + 1], alone)
        assert torch.equal(together[k], alone[0]), k
    assert torch.equal(together[3], images[3][:, :32, :32].flip(-1))  # crop-sized box: a copy, flipped
    assert torch.equal(together[4], images[4][:, :32, :32])
    assert together[5].float().std() > 10  # the box past the edge was clamped to the image, not left blank


def test_channels_last_output_holds_the_same_values(split):
    imgs = {}
    for cl in (False, True):
        images, _ = run(nvjpeg_loader(split, channels_last=cl), 0)
        imgs[cl] = images
        for x in images:
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, CROP, CROP)
            assert x.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
    assert all(torch.equal(a, b) for a, b in zip(imgs[False], imgs[True], strict=True))


@pytest.mark.parametrize("train", [True, False])
def test_same_order_labels_and_pixels_as_the_pil_backend(split, train):
    # crop 64: no box reaches 2 x crop, so the pil backend decodes at full scale too (no draft)
    nv = nvjpeg_loader(split, train=train, seed=5, crop=64)
    pil = Loader(split, batch_size=8, crop=64, train=train, seed=5, backend="pil", threads=0)
    for epoch in (0, 1):
        a_img, a_lab = run(nv, epoch)
        b_img, b_lab = run(pil, epoch)
        assert len(a_lab) == len(b_lab) == len(nv)
        assert [y.tolist() for y in a_lab] == [y.tolist() for y in b_lab]
        mad = torch.cat([per_image_mad(a, b) for a, b in zip(a_img, b_img, strict=True)])
        assert mad.max() < MAD_BOUND, mad.max()
        assert max((a.int() - b.int()).abs().max() for a, b in zip(a_img, b_img, strict=True)) <= MAX_DIFF
        assert nv.position == pil.position and nv.skipped == 0
    assert nv.decoding.runner.gpu_fallbacks == 0


def test_resume_mid_epoch_equals_uninterrupted(split):
    whole = nvjpeg_loader(split, seed=1)
    images, labels = run(whole, 3)
    part = nvjpeg_loader(split, seed=1)
    part.set_epoch(3)
    it = iter(part)
    for _ in range(2):
        next(it)
    state = part.state_dict()
    it.close()
    resumed = nvjpeg_loader(split, seed=1)
    resumed.load_state_dict(state)
    r_images, r_labels = run(resumed)
    assert [y.tolist() for y in r_labels] == [y.tolist() for y in labels[2:]]
    assert all(torch.equal(a, b) for a, b in zip(r_images, images[2:], strict=True))


# ---- GPU rejects, header guard, stand-ins ------------------------------------------------


def _mixed_shard(path):
    """12 samples, label = index: sample 5 a CMYK JPEG, sample 8 a PNG, the rest RGB JPEGs."""
    path.mkdir()
    rng = random.Random(0)
    with ShardWriter(path / "a.tar") as w:
        for i in range(12):
            im = draw(CLASSES[i % 6], (56, 44), rng)
            if i == 5:
                sample = {"jpg": encode(im.convert("CMYK"), quality=90)}
            elif i == 8:
                sample = {"png": encode(im, "PNG")}
            else:
                sample = {"jpg": encode(im, quality=90)}
            w.write(f"s{i}", {**sample, "cls": str(i).encode()})
    Manifest(num_samples=12, classes=[str(i) for i in range(12)], shards=[w.info]).save(path)


class GpuLikeDecoder:
    """torchvision's decode, but refusing CMYK JPEGs as nvJPEG does: any batch holding one fails."""

    def __init__(self):
        self.calls = []

    def __call__(self, datas, device, channels=3):
        self.calls.append(len(datas))
        for d in datas:
            b = d.numpy().tobytes()
            sof = b.find(b"\xff\xc0")
            if sof > 0 and b[sof + 9] == 4:
                raise RuntimeError("nvjpegDecode: unsupported JPEG (CMYK)")
        return decode_jpegs(datas, device, channels)


def test_gpu_rejects_are_decoded_on_the_cpu_counted_and_kept(tmp_path):
    _mixed_shard(tmp_path / "mixed")
    loader = nvjpeg_loader(tmp_path / "mixed", batch_size=4, train=False)
    dec = loader.decoding.runner.decode_jpegs = GpuLikeDecoder()
    with pytest.warns(
        RuntimeWarning,
        match=r"2 sample\(s\) decoded on the CPU.*key s5 \(nvjpegDecode: unsupported"
        r" JPEG \(CMYK\)\).*key s8 \(not a JPEG\)",
    ):
        images, labels = run(loader, 0)
    assert [y.tolist() for y in labels] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]  # complete, in order
    assert [len(x) for x in images] == [4, 4, 4]
    assert loader.decoding.runner.gpu_fallbacks == 2 and loader.skipped == 0
    assert dec.calls == [4, 4, 2, 1, 1, 2, 3]  # batch 2 failed as a whole, then halves until s5 is found
    # the CPU-decoded samples got the same picture as the pil backend gives them
    pil = Loader(tmp_path / "mixed", batch_size=4, train=False, crop=CROP, backend="pil", threads=0)
    ref, _ = run(pil, 0)
    mad = torch.cat([per_image_mad(a, b) for a, b in zip(images, ref, strict=True)])
    assert mad.max() < MAD_BOUND, mad
    assert mad[5] < MAD_BOUND and mad[8] < MAD_BOUND


def _garble(split, positions):
    """Overwrite the image bytes of ``positions`` with same-size garbage (fails the header guard)."""
    from stoker.pipeline.shards.samples import SampleIndex

    idx = SampleIndex(split)
    for i in positions:
        path, off, size = idx.shard_path(int(i)), int(idx.img_off[i]), int(idx.img_size[i])
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(bytes(range(256)) * (size // 256) + bytes(size % 256))
    idx.close()


def test_header_guard_empty_val_batch_and_train_stand_ins(split):
    val = nvjpeg_loader(split, train=False)
    train = nvjpeg_loader(split, seed=3)
    train.set_epoch(2)
    garbled = list(range(8, 16)) + train.indices()[8:16].tolist() + [30]  # val batch 1, train batch 1, one more
    _garble(split, garbled)
    with pytest.warns(RuntimeWarning, match="skipped"):
        images, labels = run(val)
    assert len(labels) == len(val) == 8 and len(labels[1]) == 0  # an empty batch in its place
    assert tuple(images[1].shape) == (0, 3, CROP, CROP)
    assert [y for b in labels for y in b.tolist()] == [i for i in range(60) if i not in garbled]
    assert val.position == 60 and val.skipped == len(set(garbled) & set(range(60)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        images, labels = run(train, 2)
    assert len(labels) == len(train) == 7
    assert all(len(y) == len(x) > 0 for x, y in zip(images, labels, strict=True))  # never an empty train batch
    assert len(labels[1]) == 8  # the garbled batch: stand-ins from the rank's order
    assert not set(y for b in labels for y in b.tolist()) & set(garbled)


def test_an_error_outside_decoding_is_one_line_naming_shards_and_keys(split, monkeypatch):
    loader = nvjpeg_loader(split, train=False)
    monkeypatch.setattr(loader.index, "targets", lambda ids: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(
        RuntimeError,
        match=r"nvjpeg backend failed on a batch of .*train \(shards shard-000000.tar; "
        r"keys 000000000, .*\(\+0 more\)|OSError: disk gone",
    ):
        run(loader)


def test_abandoned_iteration_stops_its_producer(split):
    import threading

    loader = nvjpeg_loader(split)
    it = iter(loader)
    next(it)
    it.close()
    assert not [t for t in threading.enumerate() if t.name == "stoker-nvjpeg"]
    assert loader.position == 8


def test_iteration_abandoned_at_exit_ends_cleanly(split, tmp_path):
    import subprocess
    import sys

    script = tmp_path / "abandon.py"
    script.write_text(
        "import threading\n"
        "from stoker.pipeline import Loader\n"
        "from stoker.pipeline.backends.nvjpeg import NvjpegRunner\n"
        f"loader = Loader({str(split)!r}, batch_size=4, crop=32, backend='pil', threads=0, prefetch=3)\n"
        "loader.decoding.runner = NvjpegRunner(loader.decode_settings())\n"
        "it = iter(loader)\n"
        "next(it)\n"
        "print(sum(t.name == 'stoker-nvjpeg' for t in threading.enumerate()))\n"
    )  # exits mid-epoch
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1"]  # the producer was running ahead when the script ended
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr


# ---- the overlapped stages ----------------------------------------------------------------


class SlowDecoder(Decoder):
    """torchvision's CPU decode, ``seconds`` slower per call: a decode stage worth overlapping."""

    name = "slow"

    def __init__(self, seconds):
        self.seconds = seconds

    def decode(self, datas, device, channels=3, boxes=None):
        time.sleep(self.seconds)
        return decode_jpegs(datas, device, channels)


def slow_resize(seconds):
    def resize(images, boxes, flips, out):
        time.sleep(seconds)
        crop_resize(images, boxes, flips, out)

    return resize


@pytest.mark.parametrize("train", [True, False])
def test_overlapped_stages_run_together_and_give_the_same_batches(split, train):
    delay = 0.06  # 7-8 batches: ~0.9 s of stages one after another, ~0.5 s overlapped
    runs = {}
    for overlap in (False, True):
        loader = nvjpeg_loader(split, train=train, seed=7)
        runner = loader.decoding.runner = NvjpegRunner(
            loader.decode_settings(), decoder=SlowDecoder(delay), overlap=overlap
        )
        runner.crop_resize = slow_resize(delay)
        runs[overlap] = run(loader, 2)
        st = runner.stage_seconds
        n = len(loader)  # 7 train batches (the last dropped), 8 val
        assert st["batches"] == n and st["images"] == sum(len(y) for y in runs[overlap][1])
        assert st["decode"] >= n * delay and st["crop_resize"] >= n * delay and st["read"] > 0
        assert st["overlap"] is overlap and runner.stage_totals["batches"] == n
        busy = st["read"] + st["decode"] + st["crop_resize"]
        if overlap:  # the wall time is clearly below the serial sum: decode k+1 ran while k was resized
            assert st["wall"] < 0.8 * busy and runner.overlap_ratio > 1.25, st
        else:  # one after another: the wall time holds the whole sum
            assert st["wall"] >= 0.98 * busy and runner.overlap_ratio <= 1.02, st
    (a_img, a_lab), (b_img, b_lab) = runs[False], runs[True]
    assert [y.tolist() for y in a_lab] == [y.tolist() for y in b_lab]
    assert all(torch.equal(a, b) for a, b in zip(a_img, b_img, strict=True))


def test_overlapped_and_serial_agree_on_stand_ins_empty_batches_and_fallbacks(split, tmp_path):
    _mixed_shard(tmp_path / "mixed")
    for path, train in ((tmp_path / "mixed", False), (split, True), (split, False)):
        if path == split:
            _garble(split, range(8, 16))  # val batch 1 empty, train stand-ins
        out = {}
        for overlap in (False, True):
            loader = nvjpeg_loader(path, batch_size=4 if path != split else 8, train=train, seed=3)
            loader.decoding.runner = NvjpegRunner(loader.decode_settings(), overlap=overlap)
            loader.decoding.runner.decode_jpegs = GpuLikeDecoder()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                out[overlap] = (*run(loader, 1), loader.decoding.runner.gpu_fallbacks, loader.skipped, loader.position)
        (a_img, a_lab, *a_rest), (b_img, b_lab, *b_rest) = out[False], out[True]
        assert [y.tolist() for y in a_lab] == [y.tolist() for y in b_lab] and a_rest == b_rest
        assert all(torch.equal(a, b) for a, b in zip(a_img, b_img, strict=True))


def test_a_failure_in_the_decode_stage_names_its_batch(split, monkeypatch):
    loader = nvjpeg_loader(split, train=False)
    real = loader.index.images

    def images(ids):
        if 20 in ids.tolist():  # batch 2 (val order: positions 16-23)
            raise OSError("disk gone")
        return real(ids)

    monkeypatch.setattr(loader.index, "images", images)
    with pytest.raises(
        RuntimeError, match=r"batch of .*train \(shards shard-000001.tar; keys 000000016, .*: OSError: disk gone"
    ):
        run(loader)
    assert not [t for t in threading.enumerate() if t.name.startswith("stoker-nvjpeg")]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the SystemExit, on purpose
def test_ahead_keeps_order_names_the_failing_item_and_never_ends_short():
    from stoker.pipeline.backends import producer

    stop = threading.Event()
    assert list(producer.ahead(lambda x: x * x, range(6), stop, depth=2)) == [(k, k * k) for k in range(6)]

    def fail_at_3(x):
        if x == 3:
            raise OSError("disk gone")
        return x

    got = []
    with pytest.raises(producer.StageFailure) as info:
        for item in producer.ahead(fail_at_3, range(6), stop):
            got.append(item)
    assert got == [(0, 0), (1, 1), (2, 2)] and info.value.item == 3 and isinstance(info.value.error, OSError)

    def exits(x):  # not an Exception: the thread dies without handing anything over
        raise SystemExit(1)

    with pytest.raises(producer.StageFailure, match="thread ended before its last item"):
        list(producer.ahead(exits, range(3), stop, name="stoker-test"))


def test_abandoned_overlapped_iteration_stops_both_threads(split):
    loader = nvjpeg_loader(split, prefetch=3)
    loader.decoding.runner.decode_jpegs = SlowDecoder(0.02).decode
    it = iter(loader)
    next(it)
    assert {t.name for t in threading.enumerate()} >= {"stoker-nvjpeg", "stoker-nvjpeg-decode"}
    it.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("stoker-nvjpeg")]
    assert loader.decoding.runner.stage_seconds["batches"] == 1 and loader.decoding.runner.stage_seconds["wall"] > 0


# ---- on a GPU ------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("name", decoders.NAMES)
def test_gpu_path_matches_the_cpu_path(split, name):
    decoders.gpu_jpeg_decode.cache_clear()
    works, why = decoders.gpu_jpeg_decode()
    assert works, why
    decoders.probe.cache_clear()
    works, why = decoders.probe(name, "cuda")
    if not works:
        pytest.skip(f"{name}: {why}")
    gpu = Loader(split, batch_size=8, crop=CROP, seed=2, backend="pil", threads=0, device="cuda")
    # whole images, CUDA decoder only: the same pixels as the decoder gives below
    gpu.decoding.runner = NvjpegRunner(gpu.decode_settings(), decoder=name, region=False, hw_decoder_load=0.0)
    # the decoder's own pixels, cropped and resized on the CPU: boxes, flips and resize must agree exactly
    same_pixels = nvjpeg_loader(split, seed=2)
    decoder = decoders.make(name, hw_decoder_load=0.0)
    same_pixels.decoding.runner.decode_jpegs = lambda datas, device, channels=3: [
        x.cpu() for x in decoder.decode(datas, "cuda", channels)
    ]
    cpu = nvjpeg_loader(split, seed=2)  # libjpeg-turbo's pixels
    g_img, g_lab = run(gpu, 0)
    s_img, s_lab = run(same_pixels, 0)
    c_img, c_lab = run(cpu, 0)
    assert all(x.is_cuda and y.is_cuda for x, y in zip(g_img, g_lab, strict=True))
    assert [y.cpu().tolist() for y in g_lab] == [y.tolist() for y in s_lab] == [y.tolist() for y in c_lab]
    assert max((g.cpu().int() - s.int()).abs().max() for g, s in zip(g_img, s_img, strict=True)) <= MAX_DIFF
    mad = torch.cat([per_image_mad(c, g.cpu()) for c, g in zip(c_img, g_img, strict=True)])
    print(f"{name} (GPU) vs CPU decode, per-image MAD: mean {mad.mean():.3f}, worst {mad.max():.3f}")
    assert mad.mean() < MAD_GPU_MEAN and mad.max() < MAD_GPU_WORST, mad
    assert gpu.decoding.runner.gpu_fallbacks == 0


@pytest.mark.gpu
def test_gpu_rejects_fall_back_on_a_gpu(tmp_path):
    _mixed_shard(tmp_path / "mixed")
    loader = Loader(tmp_path / "mixed", batch_size=4, train=False, crop=CROP, backend="pil", threads=0, device="cuda")
    loader.decoding.runner = NvjpegRunner(loader.decode_settings())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _, labels = run(loader, 0)
    assert [y.tolist() for y in labels] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert 1 <= loader.decoding.runner.gpu_fallbacks <= 2  # the PNG always; the CMYK JPEG where nvJPEG refuses it


@pytest.mark.gpu
def test_loader_auto_on_cuda_without_dali_is_nvjpeg(split, monkeypatch):
    monkeypatch.setattr(deps, "HAS_DALI", False)
    decoders.gpu_jpeg_decode.cache_clear()
    assert choose("auto", "cuda")[0] == "nvjpeg"
    loader = Loader(split, batch_size=8, crop=CROP, device="cuda", channels_last=True)  # the Loader's own choice
    assert loader.backend == "nvjpeg"
    images, labels = run(loader, 0)
    assert all(
        x.is_cuda and x.dtype == torch.uint8 and x.is_contiguous(memory_format=torch.channels_last) for x in images
    )
    assert [y for b in labels for y in b.tolist()] == loader.indices(0)[: len(loader) * 8].tolist()  # label = id
