"""The nvjpeg backend's decoders (pipeline/backends/decoders.py): which one ``auto`` picks and why,
the probe that never raises, region decode bookkeeping in the runner (a fake region decoder on the
CPU must give exactly the crops of whole-image decoding), and the decoders against pillow: on the
CPU where a decoder has a CPU path (nvImageCodec's libjpeg-turbo backend, TorchCodec), on the GPU
for each one installed there (batched and one by one, so a corrupted batch cannot pass)."""

import io
import random
import warnings

import numpy as np
import pytest
import torch

from helpers import run_epoch, write_split
from stoker.pipeline import Loader, deps
from stoker.pipeline.backends import decoders
from stoker.pipeline.backends.decoders import Decoder, decode_cpu, decode_jpegs
from stoker.pipeline.backends.nvjpeg import NvjpegRunner
from stoker.tools.common.synth import CLASSES, draw, encode


def choose(requested, device, decoder=None):
    """The registry's choice as ``(name, why)``."""
    from stoker.pipeline.backends import resolve_backend

    backend, why = resolve_backend(requested, device, decoder=decoder)
    return backend.name, why


# torchvision 0.29 deprecates its image decoders in favour of TorchCodec (the backend's note)
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding and encoding capabilities:DeprecationWarning")

# A GPU decoder vs pillow (libjpeg-turbo), whole images: per-image mean absolute difference,
# the mean over the images and the worst one (the bounds of tests/pipeline/backends/test_nvjpeg.py,
# measured for nvJPEG on an H200: mean 3.3, worst 17.2 on small synthetic pictures). Swapped
# channels or another image's pixels give ~50.
MAD_MEAN = 5.0
MAD_WORST = 25.0


# ---- which decoder, and why ---------------------------------------------------------------


@pytest.fixture
def probes(monkeypatch):
    """Set what each decoder's probe answers: ``probes(nvimgcodec=True, torchcodec=False, ...)``;
    the calls are recorded in the returned list."""
    calls = []

    def set_(**works):
        def probe(name, device="cuda"):
            calls.append((name, device))
            ok = works.get(name, False)
            return ok, f"{name} {'works' if ok else 'is broken'} on {device}"

        monkeypatch.setattr(decoders, "probe", probe)
        monkeypatch.setattr(decoders, "gpu_jpeg_decode", lambda device="cuda": probe("torchvision", device))
        return calls

    return set_


@pytest.mark.parametrize(
    "works, expected",
    [
        ({"nvimgcodec": True, "torchcodec": True, "torchvision": True}, "nvimgcodec"),
        ({"torchcodec": True, "torchvision": True}, "torchcodec"),
        ({"torchvision": True}, "torchvision"),
        ({}, "torchvision"),  # nothing works: the fallback, the reason says why
    ],
)
def test_auto_picks_nvimgcodec_then_torchcodec_then_torchvision_on_cuda(probes, works, expected):
    probes(**works)
    name, why = decoders.resolve_decoder("auto", "cuda:1")
    assert name == expected
    if works:
        assert why.startswith(f"{expected} works on cuda:1")
    for skipped in decoders.NAMES[: decoders.NAMES.index(expected)]:
        assert f"{skipped}: {skipped} is broken on cuda:1" in why  # what was passed over, and why


def test_auto_on_the_cpu_is_torchvision_without_probing(probes):
    calls = probes(nvimgcodec=True)
    assert decoders.resolve_decoder("auto", "cpu") == (
        "torchvision",
        "the device is the CPU: torchvision's CPU decode (libjpeg-turbo)",
    )
    assert decoders.resolve_decoder("auto", torch.device("cpu"))[0] == "torchvision"
    assert calls == []


def test_explicit_decoders_and_their_errors(probes):
    probes(nvimgcodec=True)
    assert decoders.resolve_decoder("nvimgcodec", "cuda") == ("nvimgcodec", "requested")
    with pytest.raises(ValueError, match=r"^decoder='torchcodec' cannot decode JPEGs on cuda \(torchcodec is broken"):
        decoders.resolve_decoder("torchcodec", "cuda")
    with pytest.raises(ValueError, match=r"^decoder='nvdec' must be one of \('auto', 'nvimgcodec', 'torchcodec', "):
        decoders.resolve_decoder("nvdec", "cuda")
    with pytest.raises(ValueError, match="decoder='nvdec' must be one of"):
        decoders.make("nvdec")
    with pytest.raises(ValueError, match=r"hw_decoder_load=1.5 must be in \[0, 1\]"):
        decoders.make("nvimgcodec", hw_decoder_load=1.5)


def test_the_backend_choice_names_the_decoder_when_asked(probes, monkeypatch):
    monkeypatch.setattr(deps, "HAS_DALI", False)
    monkeypatch.setattr(deps, "has_cuda", lambda: True)
    probes(nvimgcodec=True)  # torchvision's GPU decode broken, nvImageCodec fine
    assert choose("auto", "cuda")[0] == "pil"  # without decoder=: as before, torchvision's probe
    backend, why = choose("auto", "cuda", decoder="auto")
    assert backend == "nvjpeg" and why == "nvidia-dali is not installed; nvimgcodec works on cuda"
    assert choose("nvjpeg", "cuda", decoder="nvimgcodec") == ("nvjpeg", "requested")
    with pytest.raises(ValueError, match=r"but decoder='torchcodec' cannot decode JPEGs on this GPU"):
        choose("nvjpeg", "cuda", decoder="torchcodec")
    with pytest.raises(ValueError, match="decoder='x' must be one of"):
        choose("auto", "cuda", decoder="x")
    probes()  # nothing decodes
    backend, why = choose("auto", "cuda", decoder="auto")
    assert backend == "pil" and "no GPU JPEG decoder does work here" in why


class _Broken(Decoder):
    name = "broken"

    def __init__(self, result=None, version=None):
        self.result, self._version = result, version or ImportError("No module named 'nothing'")

    def version(self):
        if isinstance(self._version, Exception):
            raise self._version
        return self._version

    def decode(self, datas, device, channels=3, boxes=None):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_the_probe_says_why_and_never_raises():
    assert _Broken().available("cpu")[0] is False
    assert "broken is not installed" in _Broken().available("cpu")[1]
    red = torch.zeros(3, 8, 16, dtype=torch.uint8)
    red[0] = 200
    assert _Broken([red], "1.0").available("cpu") == (True, "broken 1.0 decodes JPEGs on the CPU (libjpeg-turbo)")
    assert _Broken([red.flip(0)], "1.0").available("cpu") == (
        False,
        "broken's decode returned wrong pixels for the probe JPEG",
    )
    assert _Broken([red[:, :4]], "1.0").available("cpu")[1] == "broken decoded the probe JPEG to (3, 4, 16) on cpu"
    assert _Broken([None], "1.0").available("cpu")[1] == "broken could not decode the probe JPEG on cpu"
    assert _Broken(RuntimeError("nvjpeg\n  exploded"), "1.0").available("cpu") == (
        False,
        "RuntimeError: nvjpeg exploded",
    )
    if not torch.cuda.is_available():
        assert _Broken([red], "1.0").available("cuda") == (False, "torch sees no CUDA device")
    assert decoders.probe("nope", "cpu")[0] is False


def test_torchvision_decodes_on_the_cpu_and_the_probe_jpeg_is_red():
    decoders.probe.cache_clear()
    works, why = decoders.probe("torchvision", "cpu")
    assert works and why.startswith("torchvision ") and why.endswith("decodes JPEGs on the CPU (libjpeg-turbo)")
    with pytest.raises(ValueError, match="decodes whole images only"):
        decoders.make("torchvision").decode([], "cpu", 3, boxes=np.zeros((0, 4)))


# ---- region decode bookkeeping in the runner ------------------------------------------------


class FakeRegionDecoder(Decoder):
    """torchvision's whole-image decode, then each box cut out: what a region decoder returns.
    ``mode="ignore"`` returns whole images (a decoder that ignored the regions), ``"wrong"`` a
    region one pixel short (the runner must not use it)."""

    name = "fake-region"
    regions = True

    def __init__(self, mode="cut"):
        self.mode, self.asked = mode, []

    def decode(self, datas, device, channels=3, boxes=None):
        whole = decode_jpegs(datas, device, channels)
        if boxes is None or self.mode == "ignore":
            return whole
        self.asked += [(tuple(b), tuple(img.shape[-2:])) for b, img in zip(boxes, whole, strict=True)]
        cut = 1 if self.mode == "wrong" else 0
        return [img[:, y : y + h - cut, x : x + w].clone() for img, (x, y, w, h) in zip(whole, boxes, strict=True)]


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """60 samples in 4 shards, sides 40-120 px; label = global position."""
    path = tmp_path_factory.mktemp("decoders") / "train"
    write_split(path, num_samples=60, samples_per_shard=16, classes=list(CLASSES) * 10, max_side=120)
    return path


def epoch_of(split, train=True, **runner_kw):
    loader = Loader(split, batch_size=8, crop=32, train=train, seed=4, backend="pil", threads=0)
    loader.decoding.runner = NvjpegRunner(loader.decode_settings(), **runner_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the "decoded on the CPU" warning
        images, labels = run_epoch(loader, 1)
    return images, labels, loader.decoding.runner


@pytest.mark.parametrize("train", [True, False])
def test_region_decode_gives_exactly_the_whole_image_crops(split, train):
    whole_imgs, whole_labels, _ = epoch_of(split, train, decoder="torchvision")
    fake = FakeRegionDecoder()
    imgs, labels, runner = epoch_of(split, train, decoder=fake)
    assert [y.tolist() for y in labels] == [y.tolist() for y in whole_labels]
    assert all(torch.equal(a, b) for a, b in zip(imgs, whole_imgs, strict=True))
    assert runner.gpu_fallbacks == 0 and len(fake.asked) == sum(len(y) for y in labels)
    # the regions were the boxes (plus the filter's reach), smaller than the images
    smaller = [(h, w) < shape and h * w < shape[0] * shape[1] for (x, y, w, h), shape in fake.asked]
    assert sum(smaller) > len(smaller) // 2
    assert all(x >= 0 and y >= 0 and x + w <= sw and y + h <= sh for (x, y, w, h), (sh, sw) in fake.asked)
    off, _, _ = epoch_of(split, train, decoder=FakeRegionDecoder(), region=False)  # switched off: whole images
    assert all(torch.equal(a, b) for a, b in zip(off, whole_imgs, strict=True))


def test_a_decoder_that_ignores_regions_or_returns_the_wrong_size_is_handled(split):
    whole_imgs, _, _ = epoch_of(split, decoder="torchvision")
    imgs, _, runner = epoch_of(split, decoder=FakeRegionDecoder("ignore"))
    assert all(torch.equal(a, b) for a, b in zip(imgs, whole_imgs, strict=True)) and runner.gpu_fallbacks == 0
    imgs, labels, runner = epoch_of(split, decoder=FakeRegionDecoder("wrong"))
    n = sum(len(y) for y in labels)
    assert runner.gpu_fallbacks == n  # every sample: pillow instead, whole images, same boxes
    mad = max((a.int() - b.int()).abs().max().item() for a, b in zip(imgs, whole_imgs, strict=True))
    assert mad <= 1  # pillow's pixels are libjpeg-turbo's too


def test_the_runner_drops_a_damaged_sample_and_raises_a_bug(monkeypatch):
    good = encode(draw("circles", (64, 48), random.Random(0)))
    png = encode(draw("rings", (40, 30), random.Random(1)), "PNG")
    garbage = b"\xff\xd8\xff" + bytes(range(256)) * 2  # a JPEG by its first bytes; nobody decodes it
    datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in (good, garbage, png, b"\xff\xd8")]
    calls = []

    def decode(batch, device, channels):
        calls.append(len(batch))
        return decode_jpegs(batch, device, channels)  # a RuntimeError for a batch holding the garbage

    out, _, fell = decoders.decode_batch(decode, datas, device="cpu")
    assert calls == [2, 1, 1]  # the two JPEGs, then halved
    assert tuple(out[0].shape) == (3, 48, 64) and tuple(out[2].shape) == (3, 30, 40)
    assert out[1] is None and out[3] is None  # dropped: pillow cannot decode them either
    assert fell == [(2, "not a JPEG")]  # what pillow decoded in the decoder's place

    def bug(*args, **kwargs):
        raise TypeError("a bug, not a damaged image")

    with pytest.raises(TypeError, match="a bug"):  # in the decoder's glue: not halved into pillow
        decoders.decode_batch(bug, datas[:2], device="cpu")
    with pytest.raises(NotImplementedError):  # a RuntimeError by class, a bug by meaning
        decoders.decode_batch(Decoder().decode, datas[:2], device="cpu")
    monkeypatch.setattr(decoders, "decode_cpu", bug)
    with pytest.raises(TypeError, match="a bug"):  # in the pillow fallback: not a dropped sample
        decoders.decode_batch(decode, datas, device="cpu")


class WithKnobs:
    """A Loader's settings plus the fields the lead adds to DecodeSettings (``decoder=``, ...)."""

    def __init__(self, settings, **knobs):
        self._settings = settings
        self.__dict__.update(knobs)

    def __getattr__(self, name):
        return getattr(self._settings, name)


def test_the_runner_takes_its_knobs_from_the_settings_or_its_arguments(split, probes):
    probes(torchcodec=True)
    settings = Loader(split, batch_size=8, crop=32, backend="pil", threads=0).decode_settings()
    default = NvjpegRunner(settings)
    assert (default.decoder.name, default.overlap, default.region) == ("torchvision", True, True)
    knobs = WithKnobs(settings, decoder="torchcodec", overlap=False, region_decode=False)
    runner = NvjpegRunner(knobs)
    assert (runner.decoder.name, runner.decoder_reason, runner.overlap, runner.region) == (
        "torchcodec",
        "requested",
        False,
        False,
    )
    assert NvjpegRunner(knobs, decoder="auto", overlap=True).overlap is True  # the arguments win
    nv = NvjpegRunner(settings, decoder=decoders.make("nvimgcodec", hw_decoder_load=0.25))
    assert (nv.decoder.hw_decoder_load, nv.decoder_reason) == (0.25, "given")
    with pytest.raises(ValueError, match="decoder='nvimgcodec' cannot decode JPEGs on cpu"):
        NvjpegRunner(settings, decoder="nvimgcodec")
    with pytest.raises(ValueError, match="decoder='jpegli' must be one of"):
        NvjpegRunner(WithKnobs(settings, decoder="jpegli"))


# ---- the decoders against pillow --------------------------------------------------------------


def jpegs(n: int = 24, seed: int = 0) -> list[tuple[str, bytes]]:
    """``(kind, bytes)``: baseline 4:2:0 and 4:4:4, progressive and grayscale JPEGs of several
    sizes (ImageNet-like to odd small ones)."""
    rng = random.Random(seed)
    sizes = [(500, 375), (375, 500), (257, 129), (64, 48), (333, 221), (101, 77)]
    kinds = ["baseline", "444", "progressive", "gray"]
    out = []
    for i in range(n):
        kind, size = kinds[i % len(kinds)], sizes[i % len(sizes)]
        im = draw(CLASSES[i % len(CLASSES)], size, rng)
        kw = {"quality": 90}
        if kind == "444":
            kw["subsampling"] = 0
        elif kind == "progressive":
            kw["progressive"] = True
        elif kind == "gray":
            im = im.convert("L")
        out.append((kind, encode(im, **kw)))
    return out


def check_against_pillow(decoder: Decoder, device: str, channels: int = 3, batch_only: bool = False) -> dict:
    """Decode a batch of :func:`jpegs` with ``decoder`` on ``device`` (through the runner's
    ``decode_batch``: what it rejects is pillow's) batched and one by one: both close to pillow,
    and equal to each other exactly."""
    data = jpegs()
    datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for _, b in data]
    batched, _, fell = decoders.decode_batch(decoder.decode, datas, device=device, channels=channels)
    mads = []
    for k, img in enumerate(batched):
        ref = decode_cpu(datas[k], channels)
        assert img is not None and tuple(img.shape) == tuple(ref.shape), (data[k][0], k)
        mads.append((img.cpu().float() - ref.float()).abs().mean().item())
    mads = np.array(mads)
    print(
        f"{decoder.name} on {device}, {channels} channel(s): per-image MAD vs pillow mean {mads.mean():.3f}, "
        f"worst {mads.max():.3f}; fell back to pillow: {[data[k][0] for k, _ in fell]}"
    )
    assert mads.mean() < MAD_MEAN and mads.max() < MAD_WORST, mads
    assert not {k for k, _ in fell} & {k for k, (kind, _) in enumerate(data) if kind == "baseline"}
    if not batch_only:
        for k, d in enumerate(datas):
            (alone,), _, _ = decoders.decode_batch(decoder.decode, [d], device=device, channels=channels)
            assert torch.equal(alone.cpu(), batched[k].cpu()), (data[k][0], k)
    return {"mad_mean": mads.mean(), "fallbacks": len(fell)}


def check_regions(decoder: Decoder, device: str) -> float:
    """Region decodes vs the same region of the whole-image decode: the largest pixel difference."""
    data = jpegs(12, seed=1)
    datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for _, b in data]
    whole = decoder.decode(datas, device, 3)
    rng = np.random.default_rng(0)
    boxes = []
    for img in whole:
        h, w = img.shape[-2:]
        x, y = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        boxes.append((x, y, int(rng.integers(1, w - x + 1)), int(rng.integers(1, h - y + 1))))
    regions = decoder.decode(datas, device, 3, boxes=np.array(boxes))
    worst = 0
    for img, reg, (x, y, w, h) in zip(whole, regions, boxes, strict=True):
        cut = img[:, y : y + h, x : x + w]
        assert tuple(reg.shape) == tuple(cut.shape)
        worst = max(worst, (reg.cpu().int() - cut.cpu().int()).abs().max().item())
        assert (reg.cpu().float() - cut.cpu().float()).abs().mean() < MAD_MEAN
    print(f"{decoder.name} on {device}: region decode vs the whole decode's region, largest difference {worst}")
    return worst


def need(name: str, device: str) -> Decoder:
    decoders.probe.cache_clear()
    works, why = decoders.probe(name, device)
    if not works:
        pytest.skip(f"{name} on {device}: {why}")
    return decoders.make(name, hw_decoder_load=0.0)


@pytest.mark.parametrize("name", ["nvimgcodec", "torchcodec", "torchvision"])
@pytest.mark.parametrize("channels", [3, 1])
def test_cpu_decoders_match_pillow(name, channels):
    decoder = need(name, "cpu")
    check_against_pillow(decoder, "cpu", channels)


def test_nvimgcodec_cpu_regions_are_exactly_the_whole_decodes_regions():
    assert check_regions(need("nvimgcodec", "cpu"), "cpu") == 0


def test_nvimgcodec_cpu_decode_reports_garbage_as_none():
    decoder = need("nvimgcodec", "cpu")
    good = torch.frombuffer(bytearray(jpegs(1)[0][1]), dtype=torch.uint8)
    bad = torch.frombuffer(bytearray(b"\xff\xd8" + bytes(200)), dtype=torch.uint8)
    out = decoder.decode([good, bad], "cpu", 3)
    assert out[1] is None and tuple(out[0].shape) == (3, 375, 500)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, hw", [("torchvision", 0.0), ("torchcodec", 0.0), ("nvimgcodec", 0.0), ("nvimgcodec", 1.0)]
)
@pytest.mark.parametrize("channels", [3, 1])
def test_gpu_decoders_match_pillow_batched_and_one_by_one(name, hw, channels):
    need(name, "cuda")
    # hw 1.0: every JPEG the hardware decoder takes goes to it, batched or alone (a split share
    # such as 0.65 depends on the batch's size, so only the pillow bounds hold: the test below)
    check_against_pillow(decoders.make(name, hw_decoder_load=hw), "cuda", channels)


@pytest.mark.gpu
def test_nvimgcodec_shared_hardware_load_and_regions_on_the_gpu():
    need("nvimgcodec", "cuda")
    check_against_pillow(decoders.make("nvimgcodec", hw_decoder_load=0.65), "cuda", batch_only=True)
    for hw in (0.0, 1.0):
        check_regions(decoders.make("nvimgcodec", hw_decoder_load=hw), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["torchvision", "torchcodec", "nvimgcodec"])
def test_the_runner_on_the_gpu_overlapped_equals_serial_and_pillow(split, name):
    need(name, "cuda")
    runs = {}
    for overlap in (False, True):
        loader = Loader(split, batch_size=8, crop=32, seed=4, backend="pil", threads=0, device="cuda")
        loader.decoding.runner = NvjpegRunner(loader.decode_settings(), decoder=name, overlap=overlap)
        runs[overlap] = run_epoch(loader, 0)
        assert loader.decoding.runner.stage_seconds["batches"] == len(loader)
    assert all(torch.equal(a, b) for a, b in zip(runs[False][0], runs[True][0], strict=True))
    cpu_imgs, _, _ = epoch_of(split, decoder="torchvision")  # libjpeg-turbo's pixels, seed 4 epoch 1
    loader = Loader(split, batch_size=8, crop=32, seed=4, backend="pil", threads=0, device="cuda")
    loader.decoding.runner = NvjpegRunner(loader.decode_settings(), decoder=name)
    gpu_imgs, _ = run_epoch(loader, 1)
    pairs = zip(gpu_imgs, cpu_imgs, strict=True)
    mad = torch.cat([(a.cpu().float() - b.float()).abs().mean(dim=(1, 2, 3)) for a, b in pairs])
    print(
        f"{name} runner on the GPU vs torchvision on the CPU, per-image MAD: "
        f"mean {mad.mean():.3f}, worst {mad.max():.3f}"
    )
    assert mad.mean() < MAD_MEAN and mad.max() < MAD_WORST


def test_fixture_jpegs_are_what_they_claim():
    from PIL import Image

    seen = {}
    for kind, b in jpegs(8):
        im = Image.open(io.BytesIO(b))
        seen[kind] = (im.mode, im.info.get("progressive", 0) or im.info.get("progression", 0))
    assert seen["gray"][0] == "L" and seen["baseline"][0] == "RGB" and seen["progressive"][1]
