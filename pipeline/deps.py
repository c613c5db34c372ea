"""Optional heavy dependencies, guarded in one place (the decode backends' choice that rests on them
is :func:`stoker.pipeline.backends.resolve_backend`)."""

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
