"""Optional heavy dependencies, guarded in one place."""

from __future__ import annotations

import functools
import importlib.util
import os


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


#: a 16x8 baseline RGB JPEG (287 bytes) for the GPU decode probe
_PROBE_JPEG = (
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwcKDcpLDAxNDQ0Hyc5"
    "PTgyPC4zNDL/2wBDAQkJCQwLDBgNDRgyIRwhMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjL/wAAR"
    "CAAIABADASIAAhEBAxEB/8QAFQABAQAAAAAAAAAAAAAAAAAAAAb/xAAUEAEAAAAAAAAAAAAAAAAAAAAA/8QAFQEBAQAAAAAAAAAAAAAAAAAA"
    "BAf/xAAUEQEAAAAAAAAAAAAAAAAAAAAA/9oADAMBAAIRAxEAPwCTADUp/9k="
)

BACKEND_NAMES = ("auto", "dali", "nvjpeg", "pil")


@functools.cache
def gpu_jpeg_decode(device: str = "cuda") -> tuple[bool, str]:
    """``(works, why)``: can torchvision decode a JPEG on the GPU ``device`` (``"cuda"``: the
    current one, or ``"cuda:N"``)? Probed once per process and device (cached) by decoding a
    tiny embedded JPEG there; never raises."""
    if not has_cuda():
        return False, "torch sees no CUDA device"
    try:
        import base64

        import torch
        from torchvision.io import ImageReadMode, decode_jpeg

        data = torch.frombuffer(bytearray(base64.b64decode(_PROBE_JPEG)), dtype=torch.uint8)
        (img,) = decode_jpeg([data], mode=ImageReadMode.RGB, device=device)
        if tuple(img.shape) != (3, 8, 16) or img.device.type != "cuda":
            return False, f"torchvision decoded the probe JPEG to {tuple(img.shape)} on {img.device}"
        # the probe is red: a decoder that runs but returns garbage does not count
        if not 170 <= int(img[0].float().mean()) <= 230:
            return False, "torchvision's GPU decode returned wrong pixels for the probe JPEG"
    except Exception as e:  # noqa: BLE001 - any failure means: not usable, say why
        return False, " ".join(f"{type(e).__name__}: {e}".split())[:200]
    import torchvision

    return True, f"torchvision {torchvision.__version__} decodes JPEGs on the GPU (nvJPEG)"


def resolve_backend(requested: str, device_type: str) -> tuple[str, str]:
    """The Loader backend for ``requested`` on a ``device_type`` device (``"cpu"``,
    ``"cuda"``, or ``"cuda:N"`` to probe that GPU rather than the current one), and why:
    ``("dali" | "nvjpeg" | "pil", reason)``.

    ``"auto"`` picks DALI when it is installed (GPU decode on CUDA; on the CPU its decode
    is the fastest CPU path here), else torchvision's nvJPEG decode when the device is
    CUDA and a probe decode works, else pillow.

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
    if requested == "nvjpeg":
        if device_type != "cuda":
            raise ValueError(
                "backend='nvjpeg' decodes on the GPU but the device is the CPU: use device='cuda', or backend='pil'"
            )
        if not has_cuda():
            raise ValueError("backend='nvjpeg' but torch sees no CUDA device (use backend='pil' and device='cpu')")
        works, why = gpu_jpeg_decode(device)
        if not works:
            raise ValueError(
                f"backend='nvjpeg' but torchvision cannot decode JPEGs on this GPU ({why}); use backend='pil'"
            )
        return "nvjpeg", "requested"
    if HAS_DALI:
        where = "it decodes on the GPU" if device_type == "cuda" else "its CPU decode is the fastest CPU path"
        return "dali", f"nvidia-dali is installed; {where}"
    if device_type == "cuda":
        works, why = gpu_jpeg_decode(device)
        if works:
            return "nvjpeg", f"nvidia-dali is not installed; {why}"
        return "pil", f"nvidia-dali is not installed and torchvision's GPU decode does not work here ({why})"
    return "pil", "nvidia-dali is not installed and the device is the CPU"
