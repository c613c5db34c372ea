"""Optional heavy dependencies, guarded in one place (the decode backends' choice that rests on them
is :func:`stoker.pipeline.backends.resolve_backend`)."""

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


def _gpu_decode(device: str, decoder: str | None) -> tuple[bool, str]:
    """``(works, why)`` of the nvjpeg backend on ``device``: torchvision's probe, or (``decoder``
    given) that decoder's choice there, reason included (what the backend registry asks:
    :class:`~.backends.registry.NvjpegBackend`)."""
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
