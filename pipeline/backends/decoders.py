"""The JPEG decoders of the nvjpeg backend, chosen by name.

==============  =========================================================================
``nvimgcodec``  NVIDIA nvImageCodec: the hardware JPEG decoder (its share of a batch is
                ``hw_decoder_load``), then the CUDA one; decodes only a region when given
                boxes (``regions``). On the CPU its libjpeg-turbo backend runs the same code.
``torchcodec``  ``torchcodec.decoders.decode_jpeg(list, device=)`` (nvJPEG on CUDA), which
                supersedes torchvision's decoders; whole images only.
``torchvision`` ``torchvision.io.decode_jpeg(list, device=)`` (nvJPEG on CUDA), deprecated
                since torchvision 0.29 and kept as the fallback.
==============  =========================================================================

Each is a :class:`Decoder`: ``decode(datas, device, channels, boxes=None)`` turns encoded
JPEGs (1-D uint8 CPU tensors) into ``[C, H, W]`` uint8 tensors on ``device`` (``None`` for one
it cannot decode; an exception fails the whole call, and the runner then halves the batch to
find the culprit). With ``boxes`` (``[N, 4]`` ``(x, y, w, h)``, a decoder with ``regions``) each
output is that region of its image only; the runner shifts its crop boxes to match.

:func:`probe` says whether a decoder works on a device (imported, and a tiny embedded JPEG
decoded there to the right pixels), once per process; :func:`resolve_decoder` picks one for
``decoder="auto"``, and :func:`gpu_decode` is what the backend registry asks of the nvjpeg
backend. This module imports no optional package at its top and nothing of stoker's but
:mod:`.resize` and the dependency guards (:mod:`stoker.pipeline.deps`); what is a damaged input,
for the decoders and for pillow, is :mod:`stoker.pipeline.imagedecode`'s.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker.errors import ArgumentError, one_line

from .. import deps
from .resize import MODES

#: a 16x8 baseline RGB JPEG (287 bytes), red, for the probe decodes
PROBE_JPEG = (
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAxNDQ0Hyc5"
    "PTgyPC4zNDL/2wBDAQkJCQwLDBgNDRgyIRwhMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjL/wAAR"
    "CAAIABADASIAAhEBAxEB/8QAFQABAQAAAAAAAAAAAAAAAAAAAAb/xAAUEAEAAAAAAAAAAAAAAAAAAAAA/8QAFQEBAQAAAAAAAAAAAAAAAAAA"
    "BAf/xAAUEQEAAAAAAAAAAAAAAAAAAAAA/9oADAMBAAIRAxEAPwCTADUp/9k="
)

#: the decoders by name; ``decoder="auto"`` tries them in this order on a CUDA device
NAMES = ("nvimgcodec", "torchcodec", "torchvision")


def decode_jpegs(datas: list, device, channels: int = 3) -> list:
    """Decode encoded JPEGs (1-D uint8 CPU tensors) to ``[channels, H, W]`` uint8 tensors (RGB,
    or the decoder's luma for 1) on ``device`` in one batched torchvision call (nvJPEG on CUDA).
    Raises when any of them fails."""
    from torchvision.io import ImageReadMode, decode_jpeg

    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    return list(decode_jpeg(datas, mode=mode, device=device))


def decode_cpu(data, channels: int = 3) -> Any:
    """Pillow decode of one encoded image (JPEG or PNG, any mode) to a ``[channels, H, W]``
    uint8 CPU tensor: the fallback for what the GPU decoder rejects."""
    import torch
    from PIL import Image

    mode = MODES[channels]
    im = Image.open(io.BytesIO(data.numpy().tobytes() if hasattr(data, "numpy") else bytes(data)))
    if im.format == "JPEG" and mode == "L":
        im.draft("L", im.size)  # the decoder's luma, as nvJPEG's grayscale output
    if im.mode != mode:
        im = im.convert(mode)
    return torch.from_numpy(np.asarray(im).reshape(im.size[1], im.size[0], -1).copy()).permute(2, 0, 1)


def decode_batch(
    decode: Callable[..., list],
    datas: list,
    *,
    device,
    channels: int = 3,
    regions: np.ndarray | None = None,
    wh: np.ndarray | None = None,
    name: str = "the decoder",
    is_jpeg: np.ndarray | None = None,
) -> tuple[list, np.ndarray, list]:
    """Decode a batch with ``decode`` (a :meth:`Decoder.decode`), pillow taking what it rejects.

    One batched call; when it fails (one bad JPEG fails all), the batch is halved and retried:
    a rejected sample costs ~2 log2(batch) extra calls, not one call per sample. A sample that
    is not a JPEG, that fails alone, or comes back ``None`` is decoded with pillow
    (:func:`decode_cpu`) and moved to ``device``.

    Args:
        decode: ``(datas, device, channels[, boxes=])`` -> list.
        datas: 1-D uint8 CPU tensors of the encoded images.
        regions: ``[N, 4]`` ``(x, y, w, h)`` to decode only those (passed as ``boxes``); an
            image that comes back the size of its region is one, one of its stored size ``wh``
            (``[N, 2]`` ``(width, height)``) a whole image, any other size a failure.
        name: the decoder, for the reasons.
        is_jpeg: ``[N]`` which start like a JPEG (:func:`~stoker.pipeline.imagedecode.is_jpeg_each`;
            else checked here, one by one).

    Returns:
        ``(images, is_region, fallbacks)``: ``[C, H, W]`` tensors on ``device`` (``None`` where
        pillow failed too), which are regions, and ``(position, why)`` of those pillow decoded.
    """
    from ..imagedecode import DAMAGED_INPUT, NATIVE_DECODE_ERRORS, native_bug
    from ..imagedecode import is_jpeg as starts_like_jpeg

    out: list = [None] * len(datas)
    is_region = np.zeros(len(datas), bool)
    if is_jpeg is None:
        is_jpeg = np.array([starts_like_jpeg(d[:3].numpy()) for d in datas], bool)
    jpeg = np.flatnonzero(is_jpeg).tolist()
    failed = dict.fromkeys(sorted(set(range(len(datas))) - set(jpeg)), "not a JPEG")

    def run(ks: list) -> None:
        try:
            batch = [datas[k] for k in ks]
            images = list(
                decode(batch, device, channels)
                if regions is None
                else decode(batch, device, channels, boxes=regions[ks])
            )
            if len(images) != len(ks):
                raise RuntimeError(f"{len(images)} images back for {len(ks)} JPEGs")
        except NATIVE_DECODE_ERRORS as e:  # the decoder said no: find which; pillow decodes it
            if native_bug(e):
                raise
            if len(ks) == 1:
                failed[ks[0]] = one_line(e)
            else:
                run(ks[: len(ks) // 2])
                run(ks[len(ks) // 2 :])
            return
        for k, img in zip(ks, images, strict=True):
            if img is None:
                failed[k] = f"{name} could not decode it"
                continue
            if regions is not None:  # the region asked for, or (a decoder that ignored it) all
                shape = tuple(img.shape[-2:])
                if shape == (regions[k, 3], regions[k, 2]):
                    is_region[k] = True
                elif wh is None or shape != (wh[k, 1], wh[k, 0]):
                    failed[k] = f"decoded to {shape}, neither its region nor its stored size"
                    continue
            out[k] = img

    if jpeg:
        run(jpeg)
    fallbacks = []
    for k, why in failed.items():
        try:
            out[k] = decode_cpu(datas[k], channels).to(device)
        except DAMAGED_INPUT:  # undecodable for pillow too: dropped, counted by the caller
            continue
        fallbacks.append((k, why))
    return out, is_region, fallbacks


class Decoder:
    """A batched JPEG decoder (the base of the three; a test's fake may subclass it).

    Attributes:
        name: its name in :data:`NAMES`.
        regions: ``decode`` takes ``boxes`` and returns only those regions.
        foreign_memory: its device buffers are not torch's caching allocator's, so the runner
            keeps them referenced until the device has finished reading them.
    """

    name = ""
    regions = False
    foreign_memory = False

    def version(self) -> str:
        """The decoder's package version (raises ImportError when it is not installed)."""
        raise NotImplementedError

    def decode(self, datas: list, device, channels: int = 3, boxes: np.ndarray | None = None) -> list:
        """``[channels, H, W]`` uint8 tensors on ``device`` for ``datas`` (1-D uint8 CPU tensors),
        ``None`` where one does not decode; with ``boxes`` (``regions`` only), those regions."""
        raise NotImplementedError

    def available(self, device) -> tuple[bool, str]:
        """``(works, why)`` on ``device``: imported and a probe decode there gives the right
        pixels. Never raises (not cached: :func:`probe` is)."""
        return _check(self, device)

    def _no_boxes(self, boxes) -> None:
        if boxes is not None:
            raise ArgumentError(f"decoder {self.name!r} decodes whole images only (boxes given)")


class TorchvisionDecoder(Decoder):
    """``torchvision.io.decode_jpeg(list, device=)``: nvJPEG on CUDA, libjpeg-turbo on the CPU."""

    name = "torchvision"

    def version(self) -> str:
        import torchvision

        return torchvision.__version__

    def decode(self, datas, device, channels=3, boxes=None) -> list:
        self._no_boxes(boxes)
        return decode_jpegs(datas, device, channels)


class TorchcodecDecoder(Decoder):
    """``torchcodec.decoders.decode_jpeg(list, mode=, device=)`` (nvJPEG on CUDA)."""

    name = "torchcodec"

    def version(self) -> str:
        import torchcodec
        import torchcodec.decoders  # noqa: F401 - the import is what may fail (its native library)

        return getattr(torchcodec, "__version__", "?")

    def decode(self, datas, device, channels=3, boxes=None) -> list:
        from torchcodec.decoders import decode_jpeg

        self._no_boxes(boxes)
        return list(decode_jpeg(list(datas), mode="RGB" if channels == 3 else "GRAY", device=device))


class NvimgcodecDecoder(Decoder):
    """NVIDIA nvImageCodec's batched decode, regions included.

    On CUDA its backends are the hardware JPEG decoder (``hw_decoder_load`` of a batch, as a
    load hint; left out at 0) and then the CUDA decoder; a JPEG neither takes comes back as
    ``None`` (the runner decodes it with pillow and counts it). On the CPU its libjpeg-turbo
    backend decodes: the same calls, testable without a GPU. EXIF orientation is not applied,
    as by the other decoders (the crop boxes are in stored pixels).

    Args:
        hw_decoder_load: the hardware decoder's share of a batch, in [0, 1].
        threads: its CPU threads (parsing, host Huffman decode); 0: one per core.
    """

    name = "nvimgcodec"
    regions = True
    foreign_memory = True

    def __init__(self, *, hw_decoder_load: float = 0.65, threads: int = 0):
        if not 0.0 <= float(hw_decoder_load) <= 1.0:
            raise ArgumentError(f"hw_decoder_load={hw_decoder_load!r} must be in [0, 1]")
        self.hw_decoder_load = float(hw_decoder_load)
        self.threads = int(threads)
        self._decoders: dict = {}  # (device type, index) -> nvimgcodec.Decoder, made on first use

    def version(self) -> str:
        from nvidia import nvimgcodec

        return nvimgcodec.__version__

    def _decoder(self, dev) -> Any:
        from nvidia import nvimgcodec as nv

        key = (dev.type, dev.index)
        if key not in self._decoders:
            if dev.type == "cpu":
                backends = [nv.Backend(nv.BackendKind.CPU_ONLY)]
                device_id = nv.NVIMGCODEC_DEVICE_CPU_ONLY
            else:
                import torch

                backends = [nv.Backend(nv.BackendKind.GPU_ONLY, load_hint=1.0)]
                if self.hw_decoder_load > 0:  # first in the list: it takes its share, the rest go on
                    backends.insert(0, nv.Backend(nv.BackendKind.HW_GPU_ONLY, load_hint=self.hw_decoder_load))
                device_id = dev.index if dev.index is not None else torch.cuda.current_device()
            self._decoders[key] = nv.Decoder(device_id=device_id, max_num_cpu_threads=self.threads, backends=backends)
        return self._decoders[key]

    def decode(self, datas, device, channels=3, boxes=None) -> list:
        import torch
        from nvidia import nvimgcodec as nv

        dev = torch.device(device)
        streams = [nv.CodeStream(d.numpy()) for d in datas]
        if boxes is not None:
            streams = [
                s.get_sub_code_stream(region=nv.Region(int(y), int(x), int(y + h), int(x + w)))
                for s, (x, y, w, h) in zip(streams, np.asarray(boxes), strict=True)
            ]
        params = nv.DecodeParams(
            apply_exif_orientation=False,
            color_spec=nv.ColorSpec.SRGB if channels == 3 else nv.ColorSpec.GRAY,
            allow_any_depth=False,
            sample_format=nv.SampleFormat.I_RGB if channels == 3 else nv.SampleFormat.I_Y,
        )
        # on CUDA the decode is ordered on the caller's current stream (the runner's): the kernels
        # that read the images follow on that stream, with no host synchronization
        stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
        images = self._decoder(dev).decode(streams, params=params, cuda_stream=stream)
        out = []
        for img in images:
            if img is None:
                out.append(None)
            elif dev.type == "cuda":  # __cuda_array_interface__, zero-copy; the tensor holds the Image
                out.append(torch.as_tensor(img, device=dev).permute(2, 0, 1))
            else:  # host Images have no usable DLPack without CUDA: the array interface, zero-copy
                out.append(torch.from_numpy(np.asarray(img)).permute(2, 0, 1))
        return out


#: name -> the decoder class
CLASSES: dict[str, type[Decoder]] = {
    "nvimgcodec": NvimgcodecDecoder,
    "torchcodec": TorchcodecDecoder,
    "torchvision": TorchvisionDecoder,
}

#: what to install for each decoder (in a probe's message)
INSTALL = {
    "nvimgcodec": "pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg",
    "torchcodec": "pip install torchcodec",
    "torchvision": "pip install torchvision",
}


def make(name: str, *, hw_decoder_load: float = 0.65, threads: int = 0) -> Decoder:
    """A new decoder ``name`` (one of :data:`NAMES`); ``hw_decoder_load`` and ``threads`` are
    nvImageCodec's (the others take none)."""
    if name not in CLASSES:
        raise ArgumentError(f"decoder={name!r} must be one of {', '.join(map(repr, NAMES))}")
    if name == "nvimgcodec":
        return NvimgcodecDecoder(hw_decoder_load=hw_decoder_load, threads=threads)
    return CLASSES[name]()


def _check(decoder: Decoder, device) -> tuple[bool, str]:
    """:meth:`Decoder.available`: import, then decode the probe JPEG on ``device``; never raises."""
    name = decoder.name
    try:
        import base64

        import torch

        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            return False, "torch sees no CUDA device"
        try:
            version = decoder.version()
        except ImportError as e:
            return False, f"{name} is not installed ({INSTALL.get(name, 'pip install it')}): {e}"[:200]
        data = torch.frombuffer(bytearray(base64.b64decode(PROBE_JPEG)), dtype=torch.uint8)
        (img,) = decoder.decode([data], dev, 3)
        if img is None:
            return False, f"{name} could not decode the probe JPEG on {device}"
        if tuple(img.shape) != (3, 8, 16) or img.device.type != dev.type:
            return False, f"{name} decoded the probe JPEG to {tuple(img.shape)} on {img.device}"
        # the probe is red: a decoder that runs but returns garbage does not count
        if not 170 <= int(img[0].float().mean()) <= 230:
            return False, f"{name}'s decode returned wrong pixels for the probe JPEG"
    except Exception as e:  # boundary: a third-party decoder's probe; its failure is the reason reported
        return False, one_line(e, with_type=True)
    where = "the GPU" if dev.type == "cuda" else "the CPU"
    how = {"nvimgcodec": "nvImageCodec", "torchcodec": "nvJPEG", "torchvision": "nvJPEG"}.get(name, name)
    how = how if dev.type == "cuda" else "libjpeg-turbo"
    return True, f"{name} {version} decodes JPEGs on {where} ({how})"


@functools.cache
def probe(name: str, device: str = "cuda") -> tuple[bool, str]:
    """``(works, why)``: does decoder ``name`` decode JPEGs on ``device`` (``"cpu"``, ``"cuda"``,
    ``"cuda:N"``)? Probed once per process, name and device (cached); never raises."""
    try:
        decoder = make(name)
    except ValueError as e:
        return False, str(e)
    return decoder.available(device)


# ---- which decoder: the probes and the choice ----------------------------------------------
#: ``decoder=`` values: ``"auto"`` first, then :data:`NAMES`
DECODER_NAMES = ("auto", *NAMES)


@functools.cache
def gpu_jpeg_decode(device: str = "cuda") -> tuple[bool, str]:
    """``(works, why)``: can torchvision decode a JPEG on the GPU ``device`` (``"cuda"``: the
    current one, or ``"cuda:N"``)? Probed once per process and device (cached) by decoding a
    tiny embedded JPEG there; never raises."""
    if not deps.has_cuda():
        return False, "torch sees no CUDA device"
    return probe("torchvision", device)


def _probe(name: str, device: str) -> tuple[bool, str]:
    """Decoder ``name``'s probe on ``device``; torchvision's on CUDA is :func:`gpu_jpeg_decode`."""
    if name == "torchvision" and device.startswith("cuda"):
        return gpu_jpeg_decode(device)
    return probe(name, device)


def resolve_decoder(requested: str, device) -> tuple[str, str]:
    """The nvjpeg backend's decoder for ``requested`` on ``device`` (``"cpu"``, ``"cuda"``,
    ``"cuda:N"`` or a ``torch.device``), and why: ``(name, reason)``.

    ``"auto"`` on a CUDA device picks the first of nvImageCodec (hardware decoder, region
    decode), TorchCodec and torchvision whose probe decode works there (each probed once per
    process); on the CPU, torchvision's CPU decode (libjpeg-turbo), probing nothing.

    Raises:
        ValueError: an unknown name, or an explicit decoder that cannot decode on ``device``
            (the message says why).
    """
    if requested not in DECODER_NAMES:
        raise ArgumentError(f"decoder={requested!r} must be one of {DECODER_NAMES}")
    device = str(device)
    if requested != "auto":
        works, why = _probe(requested, device)
        if not works:
            raise ArgumentError(f"decoder={requested!r} cannot decode JPEGs on {device} ({why}); use decoder='auto'")
        return requested, "requested"
    if device.split(":", 1)[0] != "cuda":
        return "torchvision", "the device is the CPU: torchvision's CPU decode (libjpeg-turbo)"
    failed = []
    for name in NAMES:
        works, why = _probe(name, device)
        if works:
            return name, why + (f" (not {'; '.join(failed)})" if failed else "")
        failed.append(f"{name}: {why}")
    return "torchvision", f"no decoder's probe worked on {device} ({'; '.join(failed)})"


def gpu_decode(device: str, decoder: str | None) -> tuple[bool, str]:
    """``(works, why)`` of the nvjpeg backend on ``device``: torchvision's probe, or (``decoder``
    given) that decoder's choice there, reason included (what the backend registry asks:
    :class:`~.registry.NvjpegBackend`)."""
    if decoder is None:
        return gpu_jpeg_decode(device)
    try:
        name, why = resolve_decoder(decoder, device)
    except ValueError as e:
        return False, str(e)
    works, probe = _probe(name, device)  # "auto" may have ended on a failing torchvision
    if not works:
        return False, probe
    return True, probe if why == "requested" else why


__all__ = [
    "CLASSES",
    "Decoder",
    "NAMES",
    "NvimgcodecDecoder",
    "DECODER_NAMES",
    "PROBE_JPEG",
    "TorchcodecDecoder",
    "TorchvisionDecoder",
    "decode_batch",
    "decode_cpu",
    "decode_jpegs",
    "gpu_decode",
    "gpu_jpeg_decode",
    "make",
    "probe",
    "resolve_decoder",
]
