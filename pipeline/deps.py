"""Optional heavy dependencies, guarded in one place."""

from __future__ import annotations

import functools
import importlib.util
import os

# stdlib-only at its top and importing nothing of stoker's but .resize: no cycle, nothing heavy
from .backends import decoders


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


HAS_DALI: bool = _importable("nvidia.dali")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask; all cores where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


@functools.cache
def has_cuda() -> bool:
    """True when torch sees a CUDA device (cached; imports torch lazily)."""
    import torch

    return torch.cuda.is_available()


def pillow_info() -> dict:
    """Which Pillow is active: version, whether it is pillow-simd, codecs present."""
    import PIL
    from PIL import features

    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            version("pillow-simd")
            simd = True
        except PackageNotFoundError:
            simd = False
    except ImportError:  # pragma: no cover
        simd = False
    return {
        "version": PIL.__version__,
        "simd": simd,
        "jpeg": features.check("jpg"),
        "png": features.check("zlib"),
        "webp": features.check("webp"),
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
    }


#: the probe JPEG (a 16x8 red baseline JPEG), base64: :data:`.backends.decoders.PROBE_JPEG`
_PROBE_JPEG = decoders.PROBE_JPEG

BACKEND_NAMES = ("auto", "dali", "nvjpeg", "pil")


#: the nvjpeg backend's decoders (:mod:`.backends.decoders`), ``"auto"`` first
DECODER_NAMES = ("auto", *decoders.NAMES)


@functools.cache
def gpu_jpeg_decode(device: str = "cuda") -> tuple[bool, str]:
    """``(works, why)``: can torchvision decode a JPEG on the GPU ``device`` (``"cuda"``: the
    current one, or ``"cuda:N"``)? Probed once per process and device (cached) by decoding a
    tiny embedded JPEG there; never raises."""
    if not has_cuda():
        return False, "torch sees no CUDA device"
    return decoders.probe("torchvision", device)


def _probe(name: str, device: str) -> tuple[bool, str]:
    """Decoder ``name``'s probe on ``device``; torchvision's on CUDA is :func:`gpu_jpeg_decode`."""
    if name == "torchvision" and device.startswith("cuda"):
        return gpu_jpeg_decode(device)
    return decoders.probe(name, device)


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
        raise ValueError(f"decoder={requested!r} must be one of {DECODER_NAMES}")
    device = str(device)
    if requested != "auto":
        works, why = _probe(requested, device)
        if not works:
            raise ValueError(f"decoder={requested!r} cannot decode JPEGs on {device} ({why}); use decoder='auto'")
        return requested, "requested"
    if device.split(":", 1)[0] != "cuda":
        return "torchvision", "the device is the CPU: torchvision's CPU decode (libjpeg-turbo)"
    failed = []
    for name in decoders.NAMES:
        works, why = _probe(name, device)
        if works:
            return name, why + (f" (not {'; '.join(failed)})" if failed else "")
        failed.append(f"{name}: {why}")
    return "torchvision", f"no decoder's probe worked on {device} ({'; '.join(failed)})"


def resolve_backend(requested: str, device_type: str, decoder: str | None = None) -> tuple[str, str]:
    """The Loader backend for ``requested`` on a ``device_type`` device (``"cpu"``,
    ``"cuda"``, or ``"cuda:N"`` to probe that GPU rather than the current one), and why:
    ``("dali" | "nvjpeg" | "pil", reason)``.

    ``"auto"`` picks DALI when it is installed (GPU decode on CUDA; on the CPU its decode
    is the fastest CPU path here), else torchvision's nvJPEG decode when the device is
    CUDA and a probe decode works, else pillow. With ``decoder`` (the nvjpeg backend's,
    :func:`resolve_decoder`), the nvjpeg backend also counts as working where that decoder
    does, and the reason of an nvjpeg pick ends with the decoder's (``"requested"`` stays
    ``"requested"``).

    Raises:
        ValueError: an unknown name, or an explicit backend that cannot run here (the
            message names the fix).
    """
    if requested not in BACKEND_NAMES:
        raise ValueError(f"backend={requested!r} must be one of {BACKEND_NAMES}")
    device = str(device_type)
    device_type = device.split(":", 1)[0]
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: only 'cpu' and 'cuda' are supported")
    if requested == "dali":
        if not HAS_DALI:
            raise ValueError(
                "backend='dali' but nvidia-dali is not installed (pip install "
                "nvidia-dali-cuda120, or use backend='pil')"
            )
        return "dali", "requested"
    if requested == "pil":
        return "pil", "requested"
    if decoder is not None and decoder not in DECODER_NAMES:
        raise ValueError(f"decoder={decoder!r} must be one of {DECODER_NAMES}")
    if requested == "nvjpeg":
        if device_type != "cuda":
            raise ValueError(
                "backend='nvjpeg' decodes on the GPU but the device is the CPU: use device='cuda', or backend='pil'"
            )
        if not has_cuda():
            raise ValueError("backend='nvjpeg' but torch sees no CUDA device (use backend='pil' and device='cpu')")
        works, why = _gpu_decode(device, decoder)
        if not works:
            which = "torchvision" if decoder is None else f"decoder={decoder!r}"
            raise ValueError(f"backend='nvjpeg' but {which} cannot decode JPEGs on this GPU ({why}); use backend='pil'")
        return "nvjpeg", "requested"
    if HAS_DALI:
        where = "it decodes on the GPU" if device_type == "cuda" else "its CPU decode is the fastest CPU path"
        return "dali", f"nvidia-dali is installed; {where}"
    if device_type == "cuda":
        works, why = _gpu_decode(device, decoder)
        if works:
            return "nvjpeg", f"nvidia-dali is not installed; {why}"
        which = "torchvision's GPU decode does not" if decoder is None else "no GPU JPEG decoder does"
        return "pil", f"nvidia-dali is not installed and {which} work here ({why})"
    return "pil", "nvidia-dali is not installed and the device is the CPU"


def _gpu_decode(device: str, decoder: str | None) -> tuple[bool, str]:
    """``(works, why)`` of the nvjpeg backend on ``device``: torchvision's probe, or (``decoder``
    given) that decoder's choice there, reason included."""
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
