"""What the batch kernels and transforms share: the kernel names, the batch check, per-sample parameters.

:func:`check_batch` is the contract every op and transform enforces (uint8 ``[N, 1 or 3, H, W]``
images, ``N`` integer ids, uint8 ``[N, H, W]`` masks); :func:`stream_seed` and :func:`normals` turn
``uniforms`` columns into independent random streams and gaussian draws; the private helpers make
and check per-sample parameter arrays and fills for :mod:`.geometric` and :mod:`.photometric`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
import torch

from stoker.errors import ArgumentError

KERNELS = (
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
    "rotate",
    "brightness",
    "saturation",
    "contrast",
    "sharpness",
    "hue",
    "posterize",
    "solarize",
    "solarize_add",
    "autocontrast",
    "equalize",
    "invert",
)
GEOMETRIC = KERNELS[:5]
_KID = {name: i for i, name in enumerate(KERNELS)}

Fill = float | Sequence[float] | None
PerSample = float | Sequence[float] | np.ndarray | torch.Tensor  # one value for all, or one per sample
Moved = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # images, or (images, masks) when masks given


def stream_seed(seed: int, stream: str) -> int:
    """``seed`` salted with a 64-bit hash of ``stream``: ops that draw ``uniforms`` under distinct
    stream names never reuse each other's random numbers (nor the crops', which use the bare seed)."""
    key = int.from_bytes(hashlib.blake2b(stream.encode(), digest_size=8).digest(), "little")
    return (int(seed) ^ key) & (2**64 - 1)


def normals(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Standard normals from two uniform arrays in ``[0, 1)`` (Box-Muller, cosine branch)."""
    return np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * math.pi * u2)


def check_batch(images: torch.Tensor, ids=None, masks: torch.Tensor | None = None) -> np.ndarray | None:
    """Validate a batch: uint8 ``[N, 1 or 3, H, W]`` images, ``N`` integer ids, uint8 ``[N, H, W]``
    masks on the images' device. Returns the ids as int64 numpy (``None`` if none were given)."""
    if not isinstance(images, torch.Tensor):
        raise ArgumentError(f"images must be a torch.Tensor, got {type(images).__name__}")
    if images.dtype != torch.uint8:
        raise ArgumentError(f"images must be uint8 [N, C, H, W] (convert floats after augmenting), got {images.dtype}")
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ArgumentError(f"images must be [N, C, H, W] with C = 1 or 3, got shape {tuple(images.shape)}")
    if masks is not None:
        if not isinstance(masks, torch.Tensor) or masks.dtype != torch.uint8:
            raise ArgumentError(f"masks must be a uint8 tensor [N, H, W], got {getattr(masks, 'dtype', type(masks))}")
        n, _, h, w = images.shape
        if tuple(masks.shape) != (n, h, w) or masks.device != images.device:
            raise ArgumentError(
                f"masks must be [N, H, W] = {(n, h, w)} on {images.device}, got {tuple(masks.shape)} on {masks.device}"
            )
    if ids is None:
        return None
    arr = np.asarray(ids.cpu() if isinstance(ids, torch.Tensor) else ids)
    if arr.ndim != 1 or len(arr) != images.shape[0] or (arr.size and arr.dtype.kind not in "iu"):
        raise ArgumentError(f"ids must be {images.shape[0]} integer sample positions, got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64)


def _param(value, n: int, name: str, *, lo: float = -math.inf, hi: float = math.inf) -> np.ndarray:
    """A per-sample parameter as float64 ``[n]``, checked against ``[lo, hi]``."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().double().numpy()
    arr = np.asarray(value, np.float64)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise ArgumentError(f"{name} must be a number or {n} values (one per sample), got shape {arr.shape}")
    bad = ~((arr >= lo) & (arr <= hi))
    if bad.any():
        raise ArgumentError(f"{name}={float(arr[bad][0]):g} is outside [{lo:g}, {hi:g}]")
    return arr


def _per_sample(images: torch.Tensor, value, name: str, **bounds) -> np.ndarray:
    """Validate the batch, then its per-sample parameter (see :func:`_param`)."""
    check_batch(images)
    return _param(value, images.shape[0], name, **bounds)


def _col(arr: np.ndarray, like: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return torch.as_tensor(arr, dtype=dtype).to(like.device).view(-1, 1, 1, 1)


def _fill_values(fill, channels: int) -> list[float]:
    """torchvision's ``fill``: ``None`` is 0, a number every channel, a sequence one per channel."""
    if fill is None:
        return [0.0] * channels
    vals = [float(v) for v in (fill if isinstance(fill, (list, tuple, np.ndarray)) else [fill])]
    if len(vals) == 3 and channels == 1:
        vals = [sum(vals) / 3.0]  # a 3-colour fill on grey images: its mean grey
    if len(vals) == 1:
        vals = vals * channels
    if len(vals) != channels or not all(0.0 <= v <= 255.0 for v in vals):
        raise ArgumentError(f"fill={fill!r} must be None, one value or {channels} values in [0, 255]")
    return vals


__all__ = ["GEOMETRIC", "KERNELS", "Fill", "Moved", "PerSample", "check_batch", "normals", "stream_seed"]
